"""``python -m specfit.bench select``: time the exact selector on pools of the paper's size.

Pools follow Section 3.1's generator: top-2 expansion to depth 5 (2 children of the root, then the 2
most probable nodes of each level get 2 children each: 18 draft nodes), K = 7, 48 layers x 128 experts,
top-8 routes. One timed call builds the Pool from raw arrays, encodes its routes and searches.
"""

import argparse
import time

import numpy as np

from specfit.coefficients import preset
from specfit.selection import Pool, select_specfit

A100_CACHE = preset("paper-a100", cache=True)  # Appendix B's coefficients with the expert cache, in ms


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
    return np.array(parent), np.array(prob), routes


def _median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return float(np.median(times)) / 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specfit.bench select", description=__doc__)
    parser.add_argument("--pools", type=int, default=100, help="random pools of the paper's size")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per pool (compiled path)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    raw = [paper_pool(rng) for _ in range(args.pools)]
    b, beta = A100_CACHE["b"], A100_CACHE["beta"]
    select_specfit(Pool(*raw[0], num_experts=128), b, beta)  # load or compile the kernels outside the timing

    full, encode, search, python, visited, nodes = [], [], [], [], [], []
    for parent, prob, routes in raw:
        pool = Pool(parent, prob, routes, 128)
        fast = select_specfit(pool, b, beta)
        slow = select_specfit(pool, b, beta, backend="python")
        if fast != slow:
            raise AssertionError(f"backends disagree: {fast} vs {slow}")
        visited.append(fast.visited)
        nodes.append(len(fast.nodes))
        full.append(_median_us(lambda: select_specfit(Pool(parent, prob, routes, 128), b, beta), args.repeats))
        encode.append(_median_us(lambda: Pool(parent, prob, routes, 128).words, args.repeats))
        search.append(_median_us(lambda: select_specfit(pool, b, beta), args.repeats))
        python.append(_median_us(lambda: select_specfit(pool, b, beta, backend="python"), max(1, args.repeats // 10)))

    print(f"pools: {args.pools} of {raw[0][0].shape[0] - 1} nodes, K = 7, 48 layers x 128 experts, top-8")
    print(f"subtrees visited: median {np.median(visited):.0f}, min {min(visited)}, max {max(visited)}")
    print(f"selected nodes: mean {np.mean(nodes):.2f}")
    print("median over pools of each pool's median time per call, us:")
    print(f"  numba, Pool + encoding + search: {np.median(full):8.1f}   (goal <= 50)")
    print(f"  numba, Pool + encoding only:     {np.median(encode):8.1f}")
    print(f"  numba, search on encoded pool:   {np.median(search):8.1f}")
    print(f"  python, search on encoded pool:  {np.median(python):8.1f}")
