"""The selector's view grown in place per level (`GrowingPool`) is the view rebuilt from the pool's lists, array for
array; the compiled calibration counts and calibrates as the Python one, bit for bit."""

import numpy as np
import pytest

from specfit.selection.calibration import OnlineCalibration
from specfit.selection.pool import CandidatePool, GrowingPool


def drafted_levels(rng, depth=5, width=2):
    """Levels of a top-``width`` pool as the drafter grows it: [(parent, prob), ...] per level."""
    levels, frontier, n, prob = [], [0], 0, {0: 1.0}
    for _ in range(depth):
        level = []
        for u in frontier:
            for _ in range(width):
                n += 1
                prob[n] = prob[u] * rng.uniform(0.05, 0.95)
                level.append((u, prob[n] / prob[u], n))
        levels.append(level)
        frontier = sorted(v for _, _, v in sorted(level, key=lambda x: -prob[x[2]])[:width])
    return levels


def trained(rng, max_depth=5, cycles=30) -> OnlineCalibration:
    calibration = OnlineCalibration(max_depth)
    for _ in range(cycles):
        pool = CandidatePool.root_only(0)
        for level in drafted_levels(rng, max_depth):
            for u, q, _ in level:
                pool.add(u, 0, q)
        nodes = tuple(range(1, pool.n + 1))
        path, v = [], 0
        while (children := [c for c in nodes if pool.parent[c] == v]) and rng.random() < 0.7:
            v = children[int(rng.integers(len(children)))]
            path.append(v)
        calibration.observe(pool.parent, pool.path_prob, pool.level, nodes, path)
    return calibration


@pytest.mark.parametrize("seed", range(6))
def test_the_grown_view_is_the_rebuilt_one_level_by_level(seed):
    rng = np.random.default_rng(seed)
    layers, experts, top_k = 3, 70, 4  # two words per layer
    calibration = trained(rng) if seed % 2 else None
    resident = rng.random((layers, experts)) < 0.4 if seed % 3 else None
    pool, grown = CandidatePool.root_only(7), GrowingPool(experts, capacity=4)  # grows past its capacity
    routes = rng.integers(-1, experts, size=(19, layers, top_k))  # [n+1, L, k], -1 padding
    known = None
    for level in drafted_levels(rng):
        for u, q, _ in level:
            pool.add(u, 5, q)
        end = pool.n + 1
        probs = None if calibration is None else np.array(
            known := calibration.path_probs(pool.parent, pool.path_prob, pool.level, known))
        rebuilt = pool.view(routes[:end], experts, resident=resident, path_prob=probs)
        view = grown.extend(pool, routes[:end], resident=resident, calibration=calibration)
        assert np.array_equal(view.parent, rebuilt.parent) and np.array_equal(view.level, rebuilt.level)
        assert np.array_equal(view.path_prob, rebuilt.path_prob)  # p̃ bit for bit
        assert np.array_equal(view.words, rebuilt.words)
        assert np.array_equal(view.resident_words, rebuilt.resident_words)
        assert view.root_counts == rebuilt.root_counts
        nodes = tuple(range(1, end, 2))
        assert view.expert_union(nodes) == rebuilt.expert_union(nodes)


def test_a_grown_view_without_routes_and_bad_input():
    pool = CandidatePool.root_only(1)
    pool.add(0, 2, 0.5)
    view = GrowingPool(8).extend(pool)
    assert view.routes.shape == (2, 0, 1) and view.expert_union((1,)) == 0
    with pytest.raises(ValueError, match=r"routes must be \[2, L, top_k\]"):
        GrowingPool(8).extend(pool, np.zeros((3, 1, 2), dtype=np.int64))
    pool.parent[1] = 1
    with pytest.raises(ValueError, match="smaller id"):
        GrowingPool(8).extend(pool)


@pytest.mark.parametrize("seed", range(4))
def test_compiled_observe_counts_as_the_python_one(seed):
    rng = np.random.default_rng(seed)
    python, compiled = OnlineCalibration(4), OnlineCalibration(4)
    for _ in range(40):
        pool = CandidatePool.root_only(0)
        for level in drafted_levels(rng, depth=5, width=int(rng.integers(1, 4))):
            for u, q, _ in level:
                pool.add(u, 0, q)
        nodes = tuple(sorted(rng.choice(np.arange(1, pool.n + 1), size=min(pool.n, 7), replace=False).tolist()))
        path, v = [], 0
        while (children := [c for c in nodes if pool.parent[c] == v]) and rng.random() < 0.8:
            v = children[0]
            path.append(v)
        python.observe(pool.parent, pool.path_prob, pool.level, nodes, path)
        compiled.observe_rows(np.array(pool.parent), np.array(pool.path_prob), np.array(pool.level), nodes, path)
    for k in OnlineCalibration.COUNTS:
        assert np.array_equal(getattr(python, k), getattr(compiled, k)), k
    assert python.trials.sum() > 0 and python.best_q.sum() > 0
