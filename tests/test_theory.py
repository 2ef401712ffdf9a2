"""Proposition 1 and Dinkelbach's iteration on random and hand-computed recorded cycles."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_selection import legal_subtrees, pools, reward, union

from specfit.selection import Pool, select_specfit, select_top_prob
from specfit.theory import RecordedCycle, committed, dinkelbach, parametric_value, selection_theory

B = [1.0, 1.1, 1.3, 1.4, 1.6, 1.8, 1.9, 2.1]


@st.composite
def cycles(draw, beta):
    """Recorded cycles whose Ŝ is the ratio rule's and whose accepted path is a random root path."""
    recorded = []
    for pool in draw(st.lists(pools(max_nodes=7), min_size=1, max_size=6)):
        path, node = [], 0
        while draw(st.booleans()):
            children = [v for v in range(1, pool.n + 1) if pool.parent[v] == node]
            if not children:
                break
            node = draw(st.sampled_from(children))
            path.append(node)
        selected = select_specfit(pool, B, beta).nodes
        levels = int(pool.level.max())
        recorded.append(RecordedCycle(pool, selected, committed(selected, path) - 1, tuple(path), levels))
    return recorded


def brute_h(pools_, lam, beta):
    """h(λ) of Eq. 9 by enumerating every legal subtree."""
    return np.mean(
        [max(reward(p, s) - lam * (B[len(s)] + beta * union(p, s)) for s in legal_subtrees(p, 7)) for p in pools_]
    )


@settings(deadline=None, max_examples=60)
@given(data=st.data(), beta=st.sampled_from([0.01, 0.1, 0.5]))
def test_gap_lies_between_zero_and_the_bound_of_eq_7(data, beta):
    recorded = data.draw(cycles(beta))
    table = selection_theory(recorded, B, beta)
    assert -1e-9 <= table["gap_pct"] <= table["bound_pct"] + 1e-9
    assert table["theta"] <= table["lambda_star"] * (1 + 1e-12)
    # Any other rule, EAGLE-3's here, predicts at most λ* too.
    eagle = [select_top_prob(c.pool, 7, B, beta) for c in recorded]
    assert sum(s.reward for s in eagle) / sum(s.time for s in eagle) <= table["lambda_star"] * (1 + 1e-12)
    # A larger β can only lower the selected tree's expert demand per committed token.
    assert table["union_per_reward_2beta"] <= table["union_per_reward_beta"] + 1e-9
    assert table["recorded_selection_differs_pct"] == 0.0


@settings(deadline=None, max_examples=40)
@given(data=st.data(), beta=st.sampled_from([0.01, 0.1, 0.5]))
def test_dinkelbach_converges_to_the_root_of_h(data, beta):
    pools_ = [c.pool for c in data.draw(cycles(beta))]
    lam, selections, _ = dinkelbach(pools_, B, beta)
    assert parametric_value(selections, lam) == pytest.approx(0.0, abs=1e-9)
    assert parametric_value(selections, lam) == pytest.approx(brute_h(pools_, lam, beta), abs=1e-12)
    low, high = 0.0, 8.0 / min(B)  # h(0) >= 1 > 0; no ratio exceeds (1 + 7 nodes of p <= 1) / min b
    for _ in range(80):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if brute_h(pools_, mid, beta) > 0 else (low, mid)
    assert lam == pytest.approx(low, rel=1e-9)


@settings(deadline=None, max_examples=40)
@given(pool=pools(max_nodes=7), copies=st.integers(1, 5), beta=st.sampled_from([0.01, 0.1, 0.5]))
def test_equal_rho_in_every_cycle_closes_the_gap(pool, copies, beta):
    selected = select_specfit(pool, B, beta).nodes
    recorded = [RecordedCycle(pool, selected, 0, (), 1)] * copies
    table = selection_theory(recorded, B, beta)
    assert table["gap_pct"] == pytest.approx(0.0, abs=1e-12)
    assert table["bound_pct"] == pytest.approx(0.0, abs=1e-12)
    assert table["rho_cv"] == pytest.approx(0.0, abs=1e-12)


def test_different_pools_with_the_same_rho_close_the_gap():
    # No draft node has probability: every cycle keeps the root alone, with the same root demand.
    root = [[0, 1]]
    pools_ = [
        Pool([-1, 0], [1.0, 0.0], np.array([root, [[2, 3]]]), 8),
        Pool([-1, 0, 1, 0], [1.0, 0.0, 0.0, 0.0], np.array([root, [[0, 4]], [[5, 6]], [[7, 7]]]), 8),
    ]
    recorded = [RecordedCycle(pool, (), 0, (), 1) for pool in pools_]
    table = selection_theory(recorded, B, 0.5)
    assert table["lambda_star"] == table["theta"] == 1.0 / (1.0 + 0.5 * 2)
    assert (table["gap_pct"], table["bound_pct"], table["s_star_differs_pct"]) == (0.0, 0.0, 0.0)


def test_two_hand_computed_cycles():
    # Cycle A: {1} wins (2 / 3 against 1 / 2). Cycle B: root and {1} tie at 0.5, the larger reward wins.
    routes = np.array([[[0]], [[1]]])
    a = RecordedCycle(Pool([-1, 0], [1.0, 1.0], routes, 2), (1,), 1, (1,), 1)
    b = RecordedCycle(Pool([-1, 0], [1.0, 0.5], routes, 2), (1,), 0, (), 1)
    table = selection_theory([a, b], [1.0] * 8, 1.0)
    # Θ = 3.5 / 6; S* keeps {1} in A and drops it in B: λ* = 3 / 5.
    expected = {
        "cycles": 2,
        "beta_multiplier": 2.0,
        "lambda_star": 0.6,
        "theta": 3.5 / 6,
        "gap_pct": 100 * (0.6 - 3.5 / 6) / 0.6,
        "bound_pct": 100 * (0.5 * (0.5 - 0.6) * (2 - 3) / 3) / 0.6,
        "s_star_differs_pct": 50.0,
        "rho_cv": (1 / 12) / (3.5 / 6),
        "s_star_gain_pct": 100 * ((3 / 5) / (3 / 6) - 1),
        "union_per_reward_beta": (2 / 2 + 2 / 1.5) / 2,
        "union_per_reward_2beta": (2 / 2 + 1 / 1) / 2,
        "selected_nodes_beta": 1.0,
        "selected_nodes_2beta": 0.5,
        "drafted_levels_mean": 1.0,
        "stopped_early_pct": 100.0,
        "dinkelbach_iterations": 2,
        "recorded_selection_differs_pct": 0.0,
    }
    assert table.keys() == expected.keys()
    for key, value in expected.items():
        assert table[key] == pytest.approx(value, rel=1e-12), key


def test_committed_counts_the_accepted_prefix_inside_the_subtree():
    assert committed((1, 2, 5), (1, 2, 4)) == 3
    assert committed((), (1, 2)) == 1
    assert committed((2, 4), (1, 2, 4)) == 1


def test_inconsistent_acceptance_is_rejected():
    pool = Pool([-1, 0], [1.0, 0.9], np.array([[[0]], [[1]]]), 2)
    with pytest.raises(ValueError):
        selection_theory([RecordedCycle(pool, (1,), 0, (1,), 1)], B, 0.1)
