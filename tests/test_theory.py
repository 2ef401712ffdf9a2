"""Proposition 1 and Dinkelbach's iteration on random and hand-computed recorded cycles."""

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "selection"))  # run alone, before pytest collects that folder
from test_selection import legal_subtrees, pools, reward, union  # noqa: E402

from specfit.errors import SpecFitError  # noqa: E402
from specfit.selection import Pool, select_specfit, select_top_prob  # noqa: E402
from specfit.theory import (RecordedCycle, committed, depth_cap, dinkelbach, parametric_value,  # noqa: E402
                            recorded_cycles, selection_theory)

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
        "length_limited_cycles": 0,
        "empty_pool_cycles": 0,
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


def _chain(levels: int) -> Pool:
    """A chain of ``levels`` draft nodes, each at probability 0.5 of its parent, all on expert 0 and the root's."""
    parent = [-1] + list(range(levels))
    prob = [0.5 ** d for d in range(levels + 1)]
    return Pool(parent, prob, np.zeros((levels + 1, 1, 1), dtype=np.int64), 2)


def test_a_cycle_the_length_limit_capped_is_no_adaptive_stop():
    # drafted 2 of 5 levels: a stop; 2 of a cap of 2: the limit; 5 of 5: full depth; the root alone at cap 0
    cycles = [RecordedCycle(_chain(2), (), 0, (), 2, 5), RecordedCycle(_chain(2), (), 0, (), 2, 2),
              RecordedCycle(_chain(5), (), 0, (), 5, 5), RecordedCycle(_chain(0), (), 0, (), 0, 0),
              RecordedCycle(_chain(1), (), 0, (), 1, 3)]  # 1 of a cap of 3: the limit allowed more, a stop
    cycles = [RecordedCycle(c.pool, select_specfit(c.pool, B, 0.1).nodes, 0, (), c.drafted_levels, c.depth_cap)
              for c in cycles]
    table = selection_theory(cycles, B, 0.1)
    assert table["cycles"] == 5
    assert table["stopped_early_pct"] == pytest.approx(100 * 2 / 5)  # not 100 * 4 / 5, levels < max_depth
    assert table["length_limited_cycles"] == 3
    assert table["empty_pool_cycles"] == 1
    assert table["drafted_levels_mean"] == pytest.approx((2 + 2 + 5 + 0 + 1) / 5)
    # without a known cap every cycle below max_depth counts, as before
    uncapped = [RecordedCycle(c.pool, c.selected, 0, (), c.drafted_levels) for c in cycles]
    assert selection_theory(uncapped, B, 0.1)["stopped_early_pct"] == pytest.approx(100 * 4 / 5)
    with pytest.raises(ValueError, match="at most 2"):
        selection_theory([RecordedCycle(_chain(3), (), 0, (), 3, 2)], B, 0.1)


def test_depth_cap_is_the_room_left_minus_the_root():
    # prompt of 10 tokens, 3 output tokens so far (prefix_len 12): 40 - 10 - 3 = 27 tokens of room
    assert depth_cap(5, 40, 100, 12, 3) == 5
    assert depth_cap(5, 40, 6, 12, 3) == 2  # max_new_tokens: room 3, the root commits one
    assert depth_cap(5, 16, 100, 12, 3) == 2  # limit_tokens: 16 - 12 - 1 = 3 of room
    assert depth_cap(5, 40, 4, 12, 3) == 0  # room 1: the root alone
    assert depth_cap(5, 40, 3, 12, 3) == 0


class _Atlas:
    """What recorded_cycles reads of `AtlasRoutes`: rows (for the route shape and the expert count) and routes."""

    def __init__(self, layers=2, top_k=2, experts=6):
        self.rows = {(0, 0): {"routes": np.arange(layers * top_k).reshape(1, layers, top_k) % experts}}
        self.rows[0, 1] = {"routes": np.full((1, layers, top_k), experts - 1)}
        self.asked = []

    def routes(self, cycle, pool):
        self.asked.append((cycle.request_id, cycle.index, pool.n))
        n_layers, top_k = self.rows[0, 0]["routes"].shape[1:]
        return np.stack([(np.arange(n_layers * top_k).reshape(n_layers, top_k) + v) % 6 for v in range(pool.n + 1)])


def _cycle_row(request, index, prefix_len, parent, token, selected, levels, committed_, accepted_path=()):
    return {"request_id": request, "cycle": index, "prefix_len": prefix_len, "pool_parent": parent,
            "pool_token": token, "pool_prob": [1.0] + [0.5] * (len(parent) - 1),
            "pool_level": [0] + [1 + i for i in range(len(parent) - 1)], "selected": list(selected),
            "drafted_levels": levels, "accepted": len(accepted_path), "accepted_path": list(accepted_path),
            "committed": committed_}


def test_recorded_cycles_keep_empty_pools_and_know_the_cap():
    # one request, a prompt of 10 tokens, at most 5 new tokens: output [7, 8, 9, 3, 4]
    rows = [_cycle_row(0, 0, 10, [-1, 0, 1], [7, 8, 9], (1, 2), 2, 3, (1, 2)),  # room 4: cap 3, drafted 2: a stop
            _cycle_row(0, 1, 13, [-1], [3], (), 0, 1)]  # 4 output tokens so far: room 1, cap 0, the root alone
    requests = [{"request_id": 0, "output_ids": [7, 8, 9, 3, 4]}]
    atlas = _Atlas()
    recorded = recorded_cycles(rows, requests, atlas, {"limit_tokens": 100, "max_new_tokens": 5}, max_depth=5)
    assert len(recorded) == 2  # the root-only cycle is kept
    assert [c.depth_cap for c in recorded] == [3, 0]
    assert [c.accepted_path for c in recorded] == [(1, 2), ()]
    assert atlas.asked == [(0, 0, 2)]  # the root alone reads no routes
    root_only = recorded[1].pool
    assert root_only.n == 0 and np.array_equal(root_only.routes, [[[0, 1], [0, 1]]])  # top_k experts a layer
    table = selection_theory(recorded, B, 0.1)
    assert table["cycles"] == 2 and table["empty_pool_cycles"] == 1 and table["length_limited_cycles"] == 2
    assert table["stopped_early_pct"] == pytest.approx(50.0)
    assert table["drafted_levels_mean"] == pytest.approx(1.0)
    # without the limits the caps are unknown
    assert [c.depth_cap for c in recorded_cycles(rows, requests, _Atlas())] == [None, None]
    # a prompt length that changes within the request: not one request's cycles
    rows[1] = dict(rows[1], prefix_len=14)
    with pytest.raises(SpecFitError, match="prompt of 11 tokens"):
        recorded_cycles(rows, requests, _Atlas(), {"limit_tokens": 100, "max_new_tokens": 5})
