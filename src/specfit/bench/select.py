"""``python -m specfit.bench select``: time the exact selectors on pools of the paper's size.

Pools follow Section 3.1's generator: top-2 expansion to depth 5 (2 children of the root, then the 2
most probable nodes of each level get 2 children each: 18 draft nodes), K = 7 (``--k-max``: up to 16), 48 layers x
128 experts, top-8 routes, and for the cache-aware rule a random residency of 48 slots per layer. One timed call of the
whole selection builds the selector's view from the drafted pool, encodes its routes (and residency) and
searches. The cache-aware rule is also run by `reference_ca`, Algorithm 1 in plain Python with sets, on the
same pools: both must select the same subtree, and the speedup is the reference's time over the whole selection.
"""

import time

import numpy as np

from specfit import bench
from specfit.selection import Pool, select_specfit, select_specfit_ca
from specfit.selection.coefficients import preset
from specfit.selection.pool import CandidatePool

A100_CACHE = preset("paper-a100", cache=True)  # Appendix B's coefficients with the expert cache, in ms
# The cache-aware cost: the cache fit's intercepts, the no-cache fit's β per copied expert, and an illustrative
# tenth of it per resident expert (the calibration fits both on each device; the paper has no such fit).
CA = {"b": A100_CACHE["b"], "beta_miss": preset("paper-a100", cache=False)["beta"]}
CA["beta_hit"] = CA["beta_miss"] / 10
SLOTS = 48  # resident experts per layer, the paper's with-cache size


def paper_pool(rng: np.random.Generator, depth: int = 5, layers: int = 48, experts: int = 128, top_k: int = 8):
    """Raw (parent, prob, routes) of one top-2 pool with correlated routes."""
    parent, prob = [-1], [1.0]
    frontier = [0]
    for _ in range(depth):
        level = []
        for u in frontier:
            first = rng.uniform(0.3, 0.95)  # draft conditional of the most likely child
            for q in (first, (1.0 - first) * rng.uniform(0.2, 0.9)):
                parent.append(u)
                prob.append(prob[u] * q)
                level.append(len(parent) - 1)
        frontier = sorted(level, key=lambda v: -prob[v])[:2]
    # Gumbel top-k around a per-layer popularity so that nearby tokens share experts, as real routes do.
    popularity = rng.normal(0.0, 1.5, size=(layers, experts))  # [L, N]
    logits = popularity + rng.gumbel(size=(len(parent), layers, experts))  # [n+1, L, N]
    routes = np.argpartition(-logits, top_k, axis=-1)[..., :top_k]  # [n+1, L, top_k]
    # C-contiguous int64, as the route sources hand them to the selector (a strided view encodes slower)
    return np.array(parent), np.array(prob), np.ascontiguousarray(routes, dtype=np.int64)


def random_residency(rng: np.random.Generator, layers: int = 48, experts: int = 128, slots: int = SLOTS):
    """[L, N] bool: `slots` experts per layer drawn uniformly without replacement."""
    resident = np.zeros((layers, experts), dtype=bool)
    for layer in range(layers):
        resident[layer, rng.choice(experts, slots, replace=False)] = True
    return resident


def drafted(parent, prob) -> CandidatePool:
    """The drafter's CandidatePool (Python lists) of a raw pool; tokens are irrelevant to selection."""
    pool = CandidatePool.root_only(0)
    for v in range(1, len(parent)):
        pool.token.append(0)
        pool.parent.append(int(parent[v]))
        pool.path_prob.append(float(prob[v]))
        pool.level.append(pool.level[int(parent[v])] + 1)
    return pool


def reference_ca(parent, prob, routes, resident, b, beta_miss, beta_hit, k_max=7):
    """Algorithm 1 for the cache-aware ratio in plain Python: every ancestor-closed subtree of at most k_max
    nodes, in lexicographic order of sorted node ids, its per-layer unions as ``set().union(...)`` of the node
    routes (root included), no bitmaps. Same key and tie rule as `select_specfit_ca`; returns
    (nodes, R̂, F, M, T̂)."""
    parent, prob = list(map(int, parent)), list(map(float, prob))
    n = len(parent) - 1
    experts = [[{e for e in layer if e >= 0} for layer in node] for node in np.asarray(routes).tolist()]  # [n+1][L]
    held = [{e for e, r in enumerate(row) if r} for row in np.asarray(resident).tolist()]  # R_l per layer
    layers = range(len(held))
    best = {"key": None, "nodes": ()}

    def visit(nodes, inside, r, start):
        f = m = 0
        for layer in layers:
            union = set().union(*(experts[v][layer] for v in (0, *nodes)))
            f += len(union)
            m += len(union - held[layer])
        t = b[len(nodes)] + beta_miss * m + beta_hit * (f - m)
        key = (r / t, r, -m, -f, -len(nodes))
        if best["key"] is None or key > best["key"]:
            best.update(key=key, nodes=nodes, figures=(r, f, m, t))
        if len(nodes) < k_max:
            for v in range(start, n + 1):
                if parent[v] in inside:
                    visit((*nodes, v), inside | {v}, r + prob[v], v + 1)

    visit((), {0}, 1.0, 1)
    return (best["nodes"], *best["figures"])


def extended(b, k_max: int) -> np.ndarray:
    """Intercepts b_0..b_{k_max}: the paper's b_0..b_7, continued past b_7 by their mean step over b_1..b_7 (the paper
    probes 8 sizes; a K above 7 needs a calibration that probes more, `calibration.sizes`)."""
    b = np.asarray(b, dtype=np.float64)
    if k_max < len(b):
        return b
    step = (b[-1] - b[1]) / (len(b) - 2)
    return np.concatenate([b, b[-1] + step * np.arange(1, k_max - len(b) + 2)])


def _median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return float(np.median(times)) / 1e3


def main(argv: list[str] | None = None) -> None:
    parser = bench.parser(__name__, __doc__)
    parser.add_argument("--pools", type=int, default=100, help="random pools of the paper's size")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per pool (compiled path)")
    parser.add_argument("--reference-repeats", type=int, default=3, help="timed calls per pool (plain Python)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k-max", type=int, default=7, help="K, the most draft nodes selected (up to 16: the pool's "
                        "18 nodes; past 7 the intercepts continue b_1..b_7's mean step)")
    args = parser.parse_args(argv)
    K = args.k_max

    rng = np.random.default_rng(args.seed)
    raw = [(*paper_pool(rng), random_residency(rng)) for _ in range(args.pools)]
    b, beta = extended(A100_CACHE["b"], K), A100_CACHE["beta"]
    b_ca, beta_miss, beta_hit = extended(CA["b"], K), CA["beta_miss"], CA["beta_hit"]
    parent, prob, routes, resident = raw[0]
    select_specfit(Pool(parent, prob, routes, 128), b, beta, K)  # load or compile the kernels outside the timing
    select_specfit_ca(Pool(parent, prob, routes, 128, resident), b_ca, beta_miss, beta_hit, K)

    times: dict[str, list[float]] = {}
    visited, nodes, ca_nodes = [], [], []
    for parent, prob, routes, resident in raw:
        pool = Pool(parent, prob, routes, 128)
        fast = select_specfit(pool, b, beta, K)
        slow = select_specfit(pool, b, beta, K, backend="python")
        if fast != slow:
            raise AssertionError(f"backends disagree: {fast} vs {slow}")
        candidates = drafted(parent, prob)
        ca_pool = candidates.view(routes, 128, resident=resident)
        ca = select_specfit_ca(ca_pool, b_ca, beta_miss, beta_hit, K)
        ca_slow = select_specfit_ca(ca_pool, b_ca, beta_miss, beta_hit, K, backend="python")
        if ca != ca_slow:
            raise AssertionError(f"cache-aware backends disagree: {ca} vs {ca_slow}")
        reference = reference_ca(parent, prob, routes, resident, b_ca, beta_miss, beta_hit, K)
        if reference != (ca.nodes, ca.reward, ca.union, ca.misses, ca.time):
            raise AssertionError(f"the reference disagrees: {reference} vs {ca}")
        visited.append(fast.visited)
        nodes.append(len(fast.nodes))
        ca_nodes.append(len(ca.nodes))

        def encode_ca():
            view = candidates.view(routes, 128, resident=resident)
            return view.words, view.resident_words

        fast_repeats, slow_repeats = args.repeats, max(1, args.repeats // 10)
        timed = {
            "paper whole": (lambda: select_specfit(Pool(parent, prob, routes, 128), b, beta, K), fast_repeats),
            "paper encode": (lambda: Pool(parent, prob, routes, 128).words, fast_repeats),
            "paper search": (lambda: select_specfit(pool, b, beta, K), fast_repeats),
            "paper python": (lambda: select_specfit(pool, b, beta, K, backend="python"), slow_repeats),
            "ca whole": (lambda: select_specfit_ca(candidates.view(routes, 128, resident=resident), b_ca, beta_miss,
                                                   beta_hit, K), fast_repeats),
            "ca whole raw": (lambda: select_specfit_ca(Pool(parent, prob, routes, 128, resident), b_ca, beta_miss,
                                                       beta_hit, K), fast_repeats),
            "ca encode": (encode_ca, fast_repeats),
            "ca search": (lambda: select_specfit_ca(ca_pool, b_ca, beta_miss, beta_hit, K), fast_repeats),
            "ca python": (lambda: select_specfit_ca(ca_pool, b_ca, beta_miss, beta_hit, K, backend="python"),
                          slow_repeats),
            "reference": (lambda: reference_ca(parent, prob, routes, resident, b_ca, beta_miss, beta_hit, K),
                          args.reference_repeats),
        }
        for name, (fn, repeats) in timed.items():
            times.setdefault(name, []).append(_median_us(fn, repeats))
    med = {name: float(np.median(values)) for name, values in times.items()}
    speedup = np.array(times["reference"]) / np.array(times["ca whole"])  # per pool

    print(f"pools: {args.pools} of {raw[0][0].shape[0] - 1} nodes, K = {K}, 48 layers x 128 experts, top-8, "
          f"{SLOTS} resident experts per layer (cache-aware rule)")
    print(f"subtrees visited: median {np.median(visited):.0f}, min {min(visited)}, max {max(visited)}")
    print(f"selected nodes: mean {np.mean(nodes):.2f} (paper objective), {np.mean(ca_nodes):.2f} (cache-aware; "
          f"beta_miss {beta_miss:.3f} ms, beta_hit {beta_hit:.3f} ms)")
    print("median over pools of each pool's median time per call, us:")
    print("paper objective, select_specfit:")
    goal = 50 if K <= 7 else 100
    print(f"  numba, Pool + encoding + search:              {med['paper whole']:9.1f}   (goal <= {goal})")
    print(f"  numba, Pool + encoding only:                  {med['paper encode']:9.1f}")
    print(f"  numba, search on encoded pool:                {med['paper search']:9.1f}")
    print(f"  python, search on encoded pool:               {med['paper python']:9.1f}")
    print("cache-aware objective, select_specfit_ca:")
    print(f"  numba, view + encodings + search:             {med['ca whole']:9.1f}   (goal <= {goal})")
    print(f"  numba, Pool (arrays) + encodings + search:    {med['ca whole raw']:9.1f}")
    print(f"  numba, view + route and residency encoding:   {med['ca encode']:9.1f}")
    print(f"  numba, search on encoded pool:                {med['ca search']:9.1f}")
    print(f"  python, search on encoded pool:               {med['ca python']:9.1f}")
    print(f"  plain-Python Algorithm 1 with sets:           {med['reference']:9.1f}   "
          f"(same subtree and figures on all {args.pools} pools)")
    print(f"  speedup, reference / (view + encodings + search): {np.median(speedup):5.0f}x   "
          f"(median over pools, min {speedup.min():.0f}x; goal >= 200x)")
