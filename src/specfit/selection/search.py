"""Exact search over the legal subtrees A_K (Eq. 2, Algorithm 1): one enumeration, several objectives.

The depth-first traversal adds draft nodes in increasing id, each only when its parent is in the
subtree, so it reaches every ancestor-closed S with |S| <= K exactly once, in lexicographic order of
the sorted node ids. Each depth keeps a bitmask of the nodes it may still add (ids above the node it
added last whose parent is in S): the next node is the mask's lowest bit, and adding v passes the rest of
the mask, with v's children, to the next depth. It carries R̂ = ((1 + p_v1) + p_v2) + ... and the per-layer
expert unions B(S) = B_s OR ... OR B_v from the parent state, and with each union its two popcounts: F(S)
(all its bits) and M(S) (its bits outside the resident words R, the experts the verify forward copies), and for
the cache-aware objectives P(S), the fractions still to be copied of the resident experts in flight in the union
(a prefetch's copies: each bit of the in-flight words weighted by its fraction, added as the union gains it). A
subtree replaces the incumbent only when strictly better, so among equal keys the first visited, the
lexicographically smallest, wins.

The same traversal runs compiled (numba, bitmaps and node masks as uint64 words) and interpreted (Python,
one integer per bitmap and per mask): `_make_dfs` writes it once around each backend's union and mask steps.
"""

import numpy as np
from numba import njit

from specfit.selection.pool import WORD_BITS

# Objectives: the key compared is (primary, R̂, -M, -F, -|S|), then the node-id rule above. Only the cache-aware
# objectives (`CACHE_AWARE`) search with the pool's residency; the others see nothing resident, so M = F and the
# key is (primary, R̂, -F, -|S|).
RATIO = 0  # primary R̂ / T̂, T̂ = b_|S| + β F, Eq. 5
PARAMETRIC = 1  # primary R̂ - λ T̂, the S_λ of Eq. 9
MIN_UNION = 2  # primary -F over subtrees of exactly k_max nodes (calibration probe trees)
RATIO_CA = 3  # primary R̂ / T̂_CA, T̂_CA = b_|S| + β_miss M + β_hit (F - M) + (β_miss - β_hit) P: the cache-aware cost
PARAMETRIC_CA = 4  # primary R̂ - λ T̂_CA: the S_λ of Eq. 9 under the cache-aware cost
CACHE_AWARE = (RATIO_CA, PARAMETRIC_CA)

BACKENDS = ("numba", "python")


@njit(cache=True)
def _popcount(x):
    """Bits set in a uint64 (SWAR; LLVM lowers it to the popcnt instruction)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


# The steps are inlined into the traversal in numba's IR: as calls they cost a quarter of the search
# (reference counting of their array arguments on every visit).
@njit(cache=True, inline="always")
def _in_flight_gain(before, after, flight, weights, w):
    """The in-flight fractions of the bits word w of the union gains (``after`` over ``before``)."""
    gained = after & ~before & flight[w]
    total = 0.0
    while gained != 0:
        low = gained & (~gained + np.uint64(1))
        total += weights[w * WORD_BITS + _popcount(low - np.uint64(1))]
        gained ^= low
    return total


@njit(cache=True, inline="always")
def _extend_words(unions, row, words, v, resident, flight, weights):
    """unions[row] = unions[row - 1] OR B_v over all layer words; return its popcounts (F, M), M outside the
    resident words, and what the new bits add to P (the in-flight fractions). resident None (nothing resident,
    M = F) and flight None (nothing in flight, P = 0) compile specializations without those counts.
    """
    f = 0
    if resident is None:
        for w in range(unions.shape[1]):
            x = unions[row - 1, w] | words[v, w]
            unions[row, w] = x
            f += _popcount(x)
        return f, f, 0.0
    miss = 0
    part = 0.0
    for w in range(unions.shape[1]):
        before = unions[row - 1, w]
        x = before | words[v, w]
        unions[row, w] = x
        f += _popcount(x)
        miss += _popcount(x & ~resident[w])
        if flight is not None:
            part += _in_flight_gain(before, x, flight, weights, w)
    return f, miss, part


@njit(cache=True, inline="always")
def _pop_words(masks, m):
    """Remove the lowest node of masks[m] (a row of uint64 words) and return its id; -1 when empty."""
    i = 0
    x = masks[m, 0]  # pools of up to 63 draft nodes fit in this word
    while x == 0:
        i += 1
        if i == masks.shape[1]:
            return -1
        x = masks[m, i]
    low = x & (~x + np.uint64(1))
    masks[m, i] = x ^ low
    return i * WORD_BITS + _popcount(low - np.uint64(1))


@njit(cache=True, inline="always")
def _descend_words(masks, m, children, v):
    """masks[m + 1] = masks[m] OR the children of v."""
    masks[m + 1, 0] = masks[m, 0] | children[v, 0]
    for i in range(1, masks.shape[1]):
        masks[m + 1, i] = masks[m, i] | children[v, i]


def _extend_int(unions, row, bitmaps, v, outside, flight, weights):
    """The union step on Python integers, one bitmap of L * N bits per node; ``outside`` is the complement of
    the resident bitmap, or None when nothing is resident; ``flight`` the in-flight bitmap (None: none) and
    ``weights`` the fraction of each of its bits."""
    before = unions[row - 1]
    x = before | bitmaps[v]
    unions[row] = x
    f = x.bit_count()
    part = 0.0
    if flight is not None:
        gained = x & ~before & flight
        while gained:
            low = gained & -gained
            part += weights[low.bit_length() - 1]
            gained ^= low
    return f, f if outside is None else (x & outside).bit_count(), part


def _pop_int(masks, m):
    x = masks[m]
    if not x:
        return -1
    low = x & -x
    masks[m] = x ^ low
    return low.bit_length() - 1


def _descend_int(masks, m, children, v):
    masks[m + 1] = masks[m] | children[v]


def _make_dfs(extend, pop, descend):
    """The traversal for one backend. extend(unions, row, bitmaps, v, resident, flight, weights) sets unions[row] to
    unions[row - 1] OR B_v and returns its popcounts (F, M) and the in-flight fractions it gains; pop(masks, m)
    removes and returns the lowest node of masks[m] (-1 if none); descend(masks, m, children, v) sets
    masks[m + 1] = masks[m] | children(v).
    """

    def dfs(children, prob, bitmaps, resident, flight, weights, k_max, objective, b, beta, beta_hit, lam, work):
        """Visit every legal subtree of at most k_max nodes; return (|S|, R̂, F, M, visited) of the best.

        children[u]: the mask of u's children. beta is β, or β_miss for the cache-aware objectives.
        work = (unions, masks, path, stack_r, stack_f, stack_m, best, stack_p): unions row m + 1 holds B(S) of
        the subtree at depth m (row 0 stays empty), masks[m] the nodes depth m may still add, path[1..m] its
        nodes, stack_r / stack_f / stack_m / stack_p its R̂, F, M and P; best[1..|S|] receives the best
        subtree's nodes.
        """
        unions, masks, path, stack_r, stack_f, stack_m, best, stack_p = work
        m = 0
        masks[0] = children[0]
        stack_r[0] = 1.0
        # the root s is always verified
        stack_f[0], stack_m[0], stack_p[0] = extend(unions, 1, bitmaps, 0, resident, flight, weights)
        best_m, best_p, best_r, best_f, best_q = -1, 0.0, 0.0, 0, 0
        visited = 0
        while True:
            visited += 1
            r = stack_r[m]
            f = stack_f[m]
            q = stack_m[m]
            if objective == RATIO:
                p = r / (b[m] + beta * f)
            elif objective == RATIO_CA:
                p = r / (b[m] + beta * q + beta_hit * (f - q) + (beta - beta_hit) * stack_p[m])
            elif objective == PARAMETRIC:
                p = r - lam * (b[m] + beta * f)
            elif objective == PARAMETRIC_CA:
                p = r - lam * (b[m] + beta * q + beta_hit * (f - q) + (beta - beta_hit) * stack_p[m])
            else:
                p = -1.0 * f
            if objective != MIN_UNION or m == k_max:
                if (
                    best_m < 0
                    or p > best_p
                    or (
                        p == best_p
                        and (
                            r > best_r
                            or (
                                r == best_r
                                and (q < best_q or (q == best_q and (f < best_f or (f == best_f and m < best_m))))
                            )
                        )
                    )
                ):
                    best_m, best_p, best_r, best_f, best_q = m, p, r, f, q
                    for i in range(1, m + 1):
                        best[i] = path[i]
            # Step to the next subtree in depth-first order: add the lowest addable node, or backtrack.
            v = pop(masks, m) if m < k_max else -1
            while v < 0:
                if m == 0:
                    return best_m, best_r, best_f, best_q, visited
                m -= 1
                v = pop(masks, m)
            descend(masks, m, children, v)
            m += 1
            path[m] = v
            stack_r[m] = stack_r[m - 1] + prob[v]
            stack_f[m], stack_m[m], part = extend(unions, m + 1, bitmaps, v, resident, flight, weights)
            stack_p[m] = stack_p[m - 1] + part

    return dfs


# A closure, not a function argument: numba caches callers of a bound dispatcher but not of a passed one.
_dfs_words = njit(_make_dfs(_extend_words, _pop_words, _descend_words))
_dfs_int = _make_dfs(_extend_int, _pop_int, _descend_int)


@njit(cache=True)
def _search_words(parent, prob, words, resident, flight, weights, k_max, objective, b, beta, beta_hit, lam):
    """Compiled search over words [n+1, W] uint64, resident words [W] uint64 or None (nothing resident), in-flight
    words [W] uint64 or None (nothing in flight) with their fractions [W * 64] float64; returns (nodes, R̂, F,
    M, visited)."""
    n1 = parent.shape[0]
    depth = min(k_max, n1 - 1)
    mask_words = (n1 + WORD_BITS - 1) // WORD_BITS
    children = np.zeros((n1, mask_words), dtype=np.uint64)  # [n+1, mask words] children of each node
    for v in range(1, n1):
        children[parent[v], v // WORD_BITS] |= np.uint64(1) << np.uint64(v % WORD_BITS)
    work = (
        np.zeros((depth + 2, words.shape[1]), dtype=np.uint64),  # [depth+2, W] B(S) per depth
        np.zeros((depth + 2, mask_words), dtype=np.uint64),  # [depth+2, mask words] addable nodes per depth
        np.zeros(depth + 1, dtype=np.int64),  # [depth+1] nodes of the current subtree
        np.zeros(depth + 1, dtype=np.float64),  # [depth+1] R̂ per depth
        np.zeros(depth + 1, dtype=np.int64),  # [depth+1] F per depth
        np.zeros(depth + 1, dtype=np.int64),  # [depth+1] M per depth
        np.zeros(depth + 1, dtype=np.int64),  # [depth+1] best subtree's nodes
        np.zeros(depth + 1, dtype=np.float64),  # [depth+1] P per depth
    )
    m, r, f, q, visited = _dfs_words(children, prob, words, resident, flight, weights, depth, objective, b, beta,
                                     beta_hit, lam, work)
    return work[6][1 : m + 1].copy(), r, f, q, visited


def _search_int(parent, prob, words, resident, flight, weights, k_max, objective, b, beta, beta_hit, lam):
    """Interpreted search with one Python-integer bitmap per node; same result as `_search_words`."""
    n = parent.shape[0] - 1
    depth = min(k_max, n)
    bitmaps = [int.from_bytes(row.tobytes(), "little") for row in words]
    outside = None
    if resident is not None:
        outside = ((1 << (WORD_BITS * resident.shape[0])) - 1) ^ int.from_bytes(resident.tobytes(), "little")
    if flight is not None:
        flight, weights = int.from_bytes(flight.tobytes(), "little"), weights.tolist()
    children = [0] * (n + 1)
    for v, u in enumerate(parent.tolist()[1:], start=1):
        children[u] |= 1 << v
    work = (
        [0] * (depth + 2),  # B(S) per depth
        [0] * (depth + 2),  # addable nodes per depth
        [0] * (depth + 1),  # nodes of the current subtree
        [0.0] * (depth + 1),  # R̂ per depth
        [0] * (depth + 1),  # F per depth
        [0] * (depth + 1),  # M per depth
        [0] * (depth + 1),  # best subtree's nodes
        [0.0] * (depth + 1),  # P per depth
    )
    m, r, f, q, visited = _dfs_int(
        children, prob.tolist(), bitmaps, outside, flight, weights, depth, objective, b.tolist(), beta, beta_hit,
        lam, work
    )
    return work[6][1 : m + 1], r, f, q, visited


def compile_kernels() -> None:
    """Compile the selector's numba kernels in every specialization the selectors run (or load them from numba's
    cache, beside the sources): nothing resident, resident experts, and resident experts with copies in flight. A
    stream calls it before its untimed warm-up request, so that no compilation (seconds, on a fresh checkout) or
    cache load lands in a timed cycle; the warm-up request alone need not reach every specialization (an atlas
    that lacks its prompt, a cache that has nothing in flight yet)."""
    from specfit.selection.pool import Pool

    parent, prob = np.array([-1, 0, 0]), np.array([1.0, 0.6, 0.3])
    routes = np.array([[[0, 1]], [[1, 2]], [[2, 3]]])  # [3 nodes, 1 layer, top-2] of 4 experts
    resident = np.array([[True, True, False, False]])
    for pool in (Pool(parent, prob, routes, 4), Pool(parent, prob, routes, 4, resident),
                 Pool(parent, prob, routes, 4, resident, np.array([[0.0, 0.5, 0.0, 0.0]]))):
        search(pool, 2, RATIO_CA, np.array([1.0, 2.0, 3.0]), 0.5, beta_hit=0.1)


def search(pool, k_max, objective, b, beta, lam=0.0, backend="numba", beta_hit=0.0):
    """Best legal subtree of `pool` with at most k_max nodes (exactly k_max for MIN_UNION).

    b: [>= min(k_max, n) + 1] float64 intercepts; beta is β_miss for the cache-aware objectives (`CACHE_AWARE`),
    the only ones that read the pool's residency and its experts in flight (the others search as if nothing were
    resident). Returns (sorted
    node ids, R̂, F, M, subtrees visited).
    """
    if backend == "numba":
        run = _search_words
    elif backend == "python":
        run = _search_int
    else:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    aware = objective in CACHE_AWARE and pool.resident is not None
    resident = pool.resident_words if aware else None
    flight, weights = pool.in_flight_words if aware and pool.in_flight is not None else (None, None)
    nodes, r, f, q, visited = run(
        pool.parent, pool.path_prob, pool.words, resident, flight, weights, k_max, objective, b, float(beta),
        float(beta_hit), float(lam)
    )
    return tuple(nodes.tolist() if backend == "numba" else nodes), float(r), int(f), int(q), int(visited)
