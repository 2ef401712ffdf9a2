"""Exact search over the legal subtrees A_K (Eq. 2, Algorithm 1): one enumeration, several objectives.

The depth-first traversal adds draft nodes in increasing id, each only when its parent is in the
subtree, so it reaches every ancestor-closed S with |S| <= K exactly once, in lexicographic order of
the sorted node ids. It carries R̂ = ((1 + p_v1) + p_v2) + ... and the per-layer expert unions
B(S) = B_s OR ... OR B_v from the parent state. A subtree replaces the incumbent only when strictly
better, so among equal keys the first visited, the lexicographically smallest, wins.

The same traversal runs compiled (numba, bitmaps as uint64 words) and interpreted (Python, one
integer bitmap per node): `_make_dfs` writes it once around each backend's union step.
"""

import numpy as np
from numba import njit

# Objectives: the key compared is (primary, R̂, -F, -|S|), then the node-id rule above.
RATIO = 0  # primary R̂ / T̂, Eq. 5
PARAMETRIC = 1  # primary R̂ - λ T̂, the S_λ of Eq. 9
MIN_UNION = 2  # primary -F over subtrees of exactly k_max nodes (calibration probe trees)

BACKENDS = ("numba", "python")


@njit(cache=True)
def _popcount(x):
    """Bits set in a uint64 (SWAR; LLVM lowers it to the popcnt instruction)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True)
def _extend_words(unions, row, words, v):
    """unions[row] = unions[row - 1] OR B_v over all layer words; return its popcount, F."""
    f = 0
    for w in range(unions.shape[1]):
        x = unions[row - 1, w] | words[v, w]
        unions[row, w] = x
        f += _popcount(x)
    return f


def _extend_int(unions, row, bitmaps, v):
    """The same step on Python integers, one bitmap of L * N bits per node."""
    x = unions[row - 1] | bitmaps[v]
    unions[row] = x
    return x.bit_count()


def _make_dfs(extend):
    """The traversal for one backend; extend(unions, row, bitmaps, v) sets unions[row] to
    unions[row - 1] OR B_v and returns its popcount, F.
    """

    def dfs(parent, prob, bitmaps, k_max, objective, b, beta, lam, work):
        """Visit every legal subtree of at most k_max nodes; return (|S|, R̂, F, visited) of the best.

        work = (unions, on_path, path, stack_r, stack_f, best): unions row m + 1 holds B(S) of the
        subtree at depth m (row 0 stays empty), path[1..m] its nodes, stack_r / stack_f its R̂ and F;
        best[1..|S|] receives the best subtree's nodes.
        """
        unions, on_path, path, stack_r, stack_f, best = work
        n = len(parent) - 1
        m = 0
        v = 1  # next candidate for depth m + 1
        on_path[0] = True
        stack_r[0] = 1.0
        stack_f[0] = extend(unions, 1, bitmaps, 0)  # the root s is always verified
        best_m, best_p, best_r, best_f = -1, 0.0, 0.0, 0
        visited = 0
        while True:
            visited += 1
            r = stack_r[m]
            f = stack_f[m]
            if objective == RATIO:
                p = r / (b[m] + beta * f)
            elif objective == PARAMETRIC:
                p = r - lam * (b[m] + beta * f)
            else:
                p = -1.0 * f
            if objective != MIN_UNION or m == k_max:
                if (
                    best_m < 0
                    or p > best_p
                    or (p == best_p and (r > best_r or (r == best_r and (f < best_f or (f == best_f and m < best_m)))))
                ):
                    best_m, best_p, best_r, best_f = m, p, r, f
                    for i in range(1, m + 1):
                        best[i] = path[i]
            # Step to the next subtree in depth-first order: descend to the next addable node, or backtrack.
            while True:
                if m < k_max:
                    while v <= n and not on_path[parent[v]]:
                        v += 1
                    if v <= n:
                        m += 1
                        path[m] = v
                        on_path[v] = True
                        stack_r[m] = stack_r[m - 1] + prob[v]
                        stack_f[m] = extend(unions, m + 1, bitmaps, v)
                        v += 1
                        break
                if m == 0:
                    return best_m, best_r, best_f, visited
                v = path[m] + 1
                on_path[path[m]] = False
                m -= 1

    return dfs


# A closure, not a function argument: numba caches callers of a bound dispatcher but not of a passed one.
_dfs_words = njit(_make_dfs(_extend_words))
_dfs_int = _make_dfs(_extend_int)


@njit(cache=True)
def _search_words(parent, prob, words, k_max, objective, b, beta, lam):
    """Compiled search over words [n+1, W] uint64; returns (nodes, R̂, F, visited)."""
    depth = min(k_max, parent.shape[0] - 1)
    work = (
        np.zeros((depth + 2, words.shape[1]), dtype=np.uint64),  # [depth+2, W] B(S) per depth
        np.zeros(parent.shape[0], dtype=np.bool_),  # [n+1] node on the current path
        np.zeros(depth + 1, dtype=np.int64),  # [depth+1] nodes of the current subtree
        np.zeros(depth + 1, dtype=np.float64),  # [depth+1] R̂ per depth
        np.zeros(depth + 1, dtype=np.int64),  # [depth+1] F per depth
        np.zeros(depth + 1, dtype=np.int64),  # [depth+1] best subtree's nodes
    )
    m, r, f, visited = _dfs_words(parent, prob, words, depth, objective, b, beta, lam, work)
    return work[5][1 : m + 1].copy(), r, f, visited


def _search_int(parent, prob, words, k_max, objective, b, beta, lam):
    """Interpreted search with one Python-integer bitmap per node; same result as `_search_words`."""
    n = parent.shape[0] - 1
    depth = min(k_max, n)
    bitmaps = [int.from_bytes(row.tobytes(), "little") for row in words]
    work = (
        [0] * (depth + 2),  # B(S) per depth
        [False] * (n + 1),  # node on the current path
        [0] * (depth + 1),  # nodes of the current subtree
        [0.0] * (depth + 1),  # R̂ per depth
        [0] * (depth + 1),  # F per depth
        [0] * (depth + 1),  # best subtree's nodes
    )
    m, r, f, visited = _dfs_int(parent.tolist(), prob.tolist(), bitmaps, depth, objective, b.tolist(), beta, lam, work)
    return work[5][1 : m + 1], r, f, visited


def search(pool, k_max, objective, b, beta, lam, backend="numba"):
    """Best legal subtree of `pool` with at most k_max nodes (exactly k_max for MIN_UNION).

    b: [>= min(k_max, n) + 1] float64 intercepts. Returns (sorted node ids, R̂, F, subtrees visited).
    """
    if backend == "numba":
        run = _search_words
    elif backend == "python":
        run = _search_int
    else:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    nodes, r, f, visited = run(pool.parent, pool.path_prob, pool.words, k_max, objective, b, float(beta), float(lam))
    return tuple(int(v) for v in nodes), float(r), int(f), int(visited)
