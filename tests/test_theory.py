"""Proposition 1 and Dinkelbach's iteration on random and hand-computed recorded cycles, under the paper's cost and
under specfit-ca's cache-aware cost."""

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "selection"))  # run alone, before pytest collects that folder
from test_cache_aware import ca_time, misses, resident_pools
from test_selection import legal_subtrees, pools, reward, union

from specfit.errors import SpecFitError
from specfit.selection import Pool, select_parametric, select_specfit, select_specfit_ca, select_top_prob
from specfit.selection.coefficients import DraftCost
from specfit.stages.theory import (
    CacheAwareCost,
    RecordedCycle,
    cache_aware_theory,
    committed,
    depth_cap,
    recorded_cycles,
    selection_theory,
    solve_dinkelbach,
)

B = [1.0, 1.1, 1.3, 1.4, 1.6, 1.8, 1.9, 2.1]


def assert_table(table: dict, expected: dict) -> None:
    """Every quantity of a Table 5 dict as computed by hand, and no other."""
    assert table.keys() == expected.keys()
    for key, value in expected.items():
        assert table[key] == pytest.approx(value, rel=1e-12), key


def shallow(pool) -> bool:
    """At most max_depth = 5 levels: a pool a cycle can draft."""
    return pool.level.max() <= 5


@st.composite
def cycles(draw, beta):
    """Recorded cycles whose Ŝ is the ratio rule's and whose accepted path is a random root path; pools of at most
    max_depth = 5 levels, all drafted."""
    recorded = []
    for pool in draw(st.lists(pools(max_nodes=7).filter(shallow), min_size=1, max_size=6)):
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
    lam, selections, _ = solve_dinkelbach(lambda at: [select_parametric(p, B, beta, at) for p in pools_])
    h = np.mean([s.reward - lam * s.time for s in selections])  # h(λ) of Eq. 9 at the maximizers S_λ
    assert h == pytest.approx(0.0, abs=1e-9)
    assert h == pytest.approx(brute_h(pools_, lam, beta), abs=1e-12)
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
    assert_table(table, expected)


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


# ------------------------------------------------------------------ the cache-aware cost (beyond the paper)
def _cycles_from(pools_, levels, select):
    """Recorded cycles over ``pools_`` whose Ŝ is ``select(pool, d)`` and whose accepted path is empty."""
    return [RecordedCycle(p, select(p, d).nodes, 0, (), d) for p, d in zip(pools_, levels)]


def test_cache_aware_two_hand_computed_cycles():
    # One layer, top-1: the root routes to expert 0, node 1 to expert 1; b_k + D(1) = 1 + 0.5, β_miss 1, β_hit 0.5.
    # A: p = 1, expert 1 resident: T(∅) = 1.5 + 1 = 2.5, T({1}) = 1.5 + 1 + 0.5 = 3; ratios 0.4 < 2 / 3.
    # B: p = 0.5, nothing resident: T(∅) = 2.5, T({1}) = 1.5 + 2 = 3.5; ratios 0.4 < 1.5 / 3.5.
    routes = np.array([[[0]], [[1]]])
    a = RecordedCycle(Pool([-1, 0], [1.0, 1.0], routes, 2, np.array([[False, True]])), (1,), 1, (1,), 1)
    b = RecordedCycle(Pool([-1, 0], [1.0, 0.5], routes, 2, np.zeros((1, 2), bool)), (1,), 0, (), 1)
    table = cache_aware_theory([a, b], CacheAwareCost([1.0] * 8, 1.0, 0.5, DraftCost(0.5, 0.25, 0.0)))
    # Θ = 3.5 / 6.5; at λ = Θ > 1 / 2 B drops {1} (1.5 - 3.5 λ < 1 - 2.5 λ), A keeps it: λ* = 3 / 5.5.
    theta, lam = 3.5 / 6.5, 3 / 5.5
    rho = np.array([2 / 3, 1.5 / 3.5])
    expected = {
        "cycles": 2,
        "beta_multiplier": 2.0,
        "lambda_star": lam,
        "theta": theta,
        "gap_pct": 100 * (lam - theta) / lam,
        "bound_pct": 100 * (0.5 * (rho[1] - lam) * (2.5 - 3.5) / 3.25) / lam,
        "s_star_differs_pct": 50.0,
        "rho_cv": rho.std() / rho.mean(),
        "s_star_gain_pct": 100 * ((3 / 5.5) / (3 / 6.5) - 1),
        "union_per_reward_beta": (2 / 2 + 2 / 1.5) / 2,
        # at 2β (β_miss 2, β_hit 1): A keeps {1} (2 / 4.5 > 1 / 3.5), B the root alone (1.5 / 5.5 < 1 / 3.5)
        "union_per_reward_2beta": (2 / 2 + 1 / 1) / 2,
        "selected_nodes_beta": 1.0,
        "selected_nodes_2beta": 0.5,
        "drafted_levels_mean": 1.0,
        "stopped_early_pct": 100.0,
        "length_limited_cycles": 0,
        "empty_pool_cycles": 0,
        "dinkelbach_iterations": 2,
        "recorded_selection_differs_pct": 0.0,
        "misses_per_reward_beta": (1 / 2 + 2 / 1.5) / 2,
        "misses_per_reward_2beta": (1 / 2 + 1 / 1) / 2,
        "cycles_without_residency": 0,
    }
    assert_table(table, expected)
    # the paper's cost (b_k = 1, β = 1) on the same pools sees neither the residency nor the drafted level
    assert selection_theory([a, b], [1.0] * 8, 1.0)["lambda_star"] == pytest.approx(3 / 5)


@settings(deadline=None, max_examples=60)
@given(data=st.data(), beta=st.sampled_from([0.01, 0.1, 0.5]), beta_hit=st.sampled_from([0.0, 0.02, 0.3]))
def test_nothing_resident_and_no_level_cost_is_the_papers_table(data, beta, beta_hit):
    recorded = data.draw(cycles(beta))
    paper = selection_theory(recorded, B, beta)
    ca = cache_aware_theory(recorded, CacheAwareCost(B, beta, beta_hit, DraftCost(0.0, 0.0, 0.0)))
    assert {k: ca[k] for k in paper} == paper
    assert ca["misses_per_reward_beta"] == paper["union_per_reward_beta"]
    assert ca["cycles_without_residency"] == len(recorded)


@settings(deadline=None, max_examples=60)
@given(data=st.data(), coef=st.tuples(st.sampled_from([0.05, 0.5]), st.sampled_from([0.0, 0.01, 0.2])),
       drafting=st.sampled_from([DraftCost(0.0, 0.0, 0.0), DraftCost(0.4, 0.3, 0.05)]))
def test_cache_aware_gap_bound_and_lambda_star(data, coef, drafting):
    """0 <= gap <= the bound of Eq. 7 and h(λ*) = 0 by brute force, with random residencies and drafted levels."""
    beta_miss, beta_hit = coef
    pools_ = data.draw(st.lists(resident_pools(max_nodes=6).filter(shallow), min_size=1, max_size=5))
    levels = [int(p.level.max()) for p in pools_]
    cost = CacheAwareCost(B, beta_miss, beta_hit, drafting)
    recorded = _cycles_from(pools_, levels, lambda p, d: select_specfit_ca(p, np.add(B, drafting(d)), beta_miss,
                                                                           beta_hit))
    table = cache_aware_theory(recorded, cost)
    assert -1e-9 <= table["gap_pct"] <= table["bound_pct"] + 1e-9
    assert table["theta"] <= table["lambda_star"] * (1 + 1e-12)
    assert table["recorded_selection_differs_pct"] == 0.0
    lam = table["lambda_star"]

    def best(p, d):  # max over legal S of R̂(S) - λ* T̂(S), T̂ the cache-aware cost with intercepts b_k + D(d)
        b = np.add(B, drafting(d))
        return max(reward(p, s) - lam * ca_time(b, beta_miss, beta_hit, s, union(p, s), misses(p, s))
                   for s in legal_subtrees(p, 7))

    assert abs(np.mean([best(p, d) for p, d in zip(pools_, levels)])) <= 1e-9 * (1 + lam)
    # the paper's rule, priced with the cache-aware cost, predicts at most λ*
    paper = [select_specfit(p, B, beta_miss).nodes for p in pools_]
    r = sum(reward(p, s) for p, s in zip(pools_, paper))
    t = sum(ca_time(np.add(B, drafting(d)), beta_miss, beta_hit, s, union(p, s), misses(p, s))
            for p, d, s in zip(pools_, levels, paper))
    assert r / t <= lam * (1 + 1e-12)


def test_cache_aware_coefficients_are_specfit_cas(tmp_path):
    import json

    from specfit.speculative.methods import build_method

    fit = {"b": B, "beta": 0.2, "drafting": {"start_ms": 0.9, "level_ms": 0.7, "select_ms": 0.05},
           "cache_aware": {"b": [3.0] * 8, "beta_miss": 0.4, "beta_hit": 0.02,
                           "without_drafting": {"b": [2.0] * 8, "beta_miss": 0.3, "beta_hit": 0.01}}}
    preset = {"b": B, "beta": 0.2, "cache_aware": None, "drafting": None}
    for coefficients in (fit, preset):
        (tmp_path / "c.json").write_text(json.dumps(coefficients))
        method = build_method({"name": "specfit-ca", "routes": "live"}, {"coefficients": tmp_path / "c.json"}, 0, 8)
        cost = CacheAwareCost.from_coefficients(coefficients)
        assert (cost.beta_miss, cost.beta_hit, cost.drafting) == (method.beta_miss, method.beta_hit, method.drafting)
        for d in range(4):
            assert np.array_equal(cost.intercepts(RecordedCycle(None, (), 0, (), d)), method.b + method.drafting(d))


def test_recorded_cycles_read_the_recorded_residency():
    rows = [_cycle_row(0, 0, 10, [-1, 0, 1], [7, 8, 9], (1, 2), 2, 3, (1, 2)),
            _cycle_row(0, 1, 13, [-1], [3], (), 0, 1)]
    rows[0]["resident"] = [[0, 5, 9], []]  # expert 9: resident, routed by no atlas row
    rows[1]["resident"] = None  # root only: the method read no residency
    requests = [{"request_id": 0, "output_ids": [7, 8, 9, 3, 4]}]
    drafted, root_only = recorded_cycles(rows, requests, _Atlas(), {"limit_tokens": 100, "max_new_tokens": 5})
    assert drafted.pool.num_experts == root_only.pool.num_experts == 10
    assert np.array_equal(np.argwhere(drafted.pool.resident), [[0, 0], [0, 5], [0, 9]])
    assert root_only.pool.resident is None
    # routes by node v: layer 0 {v, v + 1}, layer 1 {v + 2, v + 3} (mod 6); the root's union: 4 experts, 0 resident
    assert (drafted.pool.expert_union(()), drafted.pool.expert_misses(())) == (4, 3)
    table = cache_aware_theory([drafted, root_only], CacheAwareCost([1.0] * 8, 1.0, 0.25, DraftCost(0.0, 0.0, 0.0)))
    assert table["cycles_without_residency"] == 1
    # the root alone is priced with its 2 x 2 experts missed: b_0 + β_miss · 4
    t_root = 1.0 + 1.0 * 4
    t_drafted = 1.0 + 1.0 * drafted.pool.expert_misses(drafted.selected) + 0.25 * (
        drafted.pool.expert_union(drafted.selected) - drafted.pool.expert_misses(drafted.selected))
    assert table["theta"] == pytest.approx((1 + 2 * 0.5 + 1) / (t_drafted + t_root))
