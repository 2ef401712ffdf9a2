"""The cache-aware selectors (T̂ = b_|S| + β_miss M + β_hit H: the ratio rule and its parametric form) against a
brute force over all ancestor-closed subsets with Python sets, on both backends, and the pool's residency
encoding."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_selection import BETAS, INTERCEPTS, legal_subtrees, pools, reward, union

from specfit.selection import BACKENDS, Pool, select_parametric, select_specfit, select_specfit_ca
from specfit.selection.pool import CandidatePool
from specfit.selection.selectors import select_parametric_ca


@st.composite
def resident_pools(draw, max_nodes=8):
    """`pools` with a random residency: each expert id the routes use (and a few others) resident or not per
    layer; sometimes None, nothing resident or everything resident."""
    pool = draw(pools(max_nodes=max_nodes))
    layers, experts = pool.routes.shape[1], pool.num_experts
    kind = draw(st.sampled_from(["random", "random", "random", "none", "empty", "full"]))
    if kind == "none":
        return pool
    resident = np.full((layers, experts), kind == "full")
    if kind == "random":
        ids = sorted({0, 1, 2, 63 % experts, 64 % experts, experts - 1, experts // 2})
        for layer in range(layers):
            for e in ids:
                resident[layer, e] = draw(st.booleans())
    return Pool(pool.parent, pool.path_prob, pool.routes, experts, resident)


def layer_sets(pool, s):
    """U_l(S) per layer, root included, from sets of expert ids."""
    return [{int(e) for v in (0, *s) for e in pool.routes[v, layer] if e >= 0} for layer in range(pool.routes.shape[1])]


def misses(pool, s):
    """M(S) = Σ_l |U_l(S) \\ R_l| from sets."""
    if pool.resident is None:
        return union(pool, s)
    return sum(len(u - set(np.flatnonzero(pool.resident[layer]).tolist()))
               for layer, u in enumerate(layer_sets(pool, s)))


def ca_time(b, beta_miss, beta_hit, s, f, m):
    return b[len(s)] + beta_miss * m + beta_hit * (f - m)


def brute_force_ca(pool, k_max, b, beta_miss, beta_hit, lam=None):
    """Maximize (ratio, R̂, -M, -F, -|S|), or with ``lam`` (R̂ - λ T̂, R̂, -M, -F, -|S|); the first in lexicographic
    order of sorted node ids wins ties."""
    best, best_key = None, None
    legal = legal_subtrees(pool, k_max)
    for s in legal:
        r, f, m = reward(pool, s), union(pool, s), misses(pool, s)
        t = ca_time(b, beta_miss, beta_hit, s, f, m)
        key = (r / t if lam is None else r - lam * t, r, -m, -f, -len(s))
        if best is None or key > best_key:
            best, best_key = s, key
    return best, len(legal)


ca_coefficients = st.tuples(
    st.lists(st.sampled_from(INTERCEPTS), min_size=8, max_size=8), st.sampled_from(BETAS), st.sampled_from(BETAS)
)


def figures(sel):
    return sel.nodes, sel.reward, sel.union, sel.time, sel.visited


@pytest.mark.parametrize("backend", BACKENDS)
@settings(deadline=None, max_examples=200)
@given(pool=resident_pools(), coef=ca_coefficients, k_max=st.integers(0, 7))
def test_specfit_ca_is_the_brute_force_argmax(backend, pool, coef, k_max):
    b, beta_miss, beta_hit = coef
    expected, visited = brute_force_ca(pool, k_max, b, beta_miss, beta_hit)
    sel = select_specfit_ca(pool, b, beta_miss, beta_hit, k_max, backend=backend)
    f, m = union(pool, expected), misses(pool, expected)
    assert (sel.nodes, sel.reward, sel.union, sel.misses, sel.visited) == (
        expected, reward(pool, expected), f, m, visited
    )
    assert sel.time == ca_time(b, beta_miss, beta_hit, expected, f, m)
    assert pool.expert_union(sel.nodes) == f and pool.expert_misses(sel.nodes) == m


@pytest.mark.parametrize("backend", BACKENDS)
@settings(deadline=None, max_examples=200)
@given(pool=resident_pools(), coef=ca_coefficients, k_max=st.integers(0, 7),
       lam=st.sampled_from([0.0, 0.2, 0.5, 1.0, 3.0]))
def test_parametric_ca_is_the_brute_force_argmax(backend, pool, coef, k_max, lam):
    b, beta_miss, beta_hit = coef
    expected, visited = brute_force_ca(pool, k_max, b, beta_miss, beta_hit, lam)
    sel = select_parametric_ca(pool, b, beta_miss, beta_hit, lam, k_max, backend=backend)
    f, m = union(pool, expected), misses(pool, expected)
    assert (sel.nodes, sel.reward, sel.union, sel.misses, sel.visited) == (
        expected, reward(pool, expected), f, m, visited
    )
    assert sel.time == ca_time(b, beta_miss, beta_hit, expected, f, m)


@settings(deadline=None, max_examples=100)
@given(pool=resident_pools(), coef=ca_coefficients, k_max=st.integers(0, 7), lam=st.floats(0, 5))
def test_backends_agree(pool, coef, k_max, lam):
    b, beta_miss, beta_hit = coef
    fast, slow = (select_specfit_ca(pool, b, beta_miss, beta_hit, k_max, backend=x) for x in BACKENDS)
    assert fast == slow
    fast, slow = (select_parametric_ca(pool, b, beta_miss, beta_hit, lam, k_max, backend=x) for x in BACKENDS)
    assert fast == slow


@settings(deadline=None, max_examples=100)
@given(
    pool=pools(),
    coef=st.tuples(st.lists(st.sampled_from(INTERCEPTS), min_size=8, max_size=8), st.sampled_from(BETAS)),
    beta_hit=st.floats(-1e6, 1e6, allow_nan=False),
    k_max=st.integers(0, 7),
    empty=st.booleans(),
)
def test_nothing_resident_is_the_paper_objective(pool, coef, beta_hit, k_max, empty):
    b, beta = coef
    if empty:  # an all-false residency, encoded and counted, rather than None
        pool = Pool(pool.parent, pool.path_prob, pool.routes, pool.num_experts, np.zeros((pool.routes.shape[1],
                                                                                          pool.num_experts), bool))
    for backend in BACKENDS:
        paper = select_specfit(pool, b, beta, k_max, backend=backend)
        ca = select_specfit_ca(pool, b, beta, beta_hit, k_max, backend=backend)
        assert figures(ca) == figures(paper)
        assert ca.misses == ca.union and paper.misses is None
        paper = select_parametric(pool, b, beta, 0.5, k_max, backend=backend)
        ca = select_parametric_ca(pool, b, beta, beta_hit, 0.5, k_max, backend=backend)
        assert figures(ca) == figures(paper)


@settings(deadline=None, max_examples=100)
@given(pool=pools(), coef=ca_coefficients, k_max=st.integers(0, 7))
def test_everything_resident_without_hit_cost_ignores_experts(pool, coef, k_max):
    b, beta_miss, _ = coef
    everything = np.ones((pool.routes.shape[1], pool.num_experts), bool)
    pool = Pool(pool.parent, pool.path_prob, pool.routes, pool.num_experts, everything)
    for backend in BACKENDS:
        ca = select_specfit_ca(pool, b, beta_miss, 0.0, k_max, backend=backend)
        assert ca.misses == 0 and ca.time == b[len(ca.nodes)]
        assert figures(ca) == figures(select_specfit(pool, b, 0.0, k_max, backend=backend))
        # the expert-blind brute force: ratio R̂ / b_|S|, then R̂, then F, fewer nodes, smaller ids
        best, best_key = None, None
        for s in legal_subtrees(pool, k_max):
            r = reward(pool, s)
            key = (r / b[len(s)], r, -union(pool, s), -len(s))
            if best is None or key > best_key:
                best, best_key = s, key
        assert ca.nodes == best


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_go_to_fewer_misses_then_smaller_union_then_fewer_nodes_then_smaller_ids(backend):
    def pool(routes, resident):
        routes = np.array(routes)  # [4, L=1, 2]
        return Pool([-1, 0, 0, 0], [1.0, 0.5, 0.5, 0.5], routes, 8, np.isin(np.arange(8), resident)[None, :])

    b = [9.0] + [1.0] * 7  # the root alone never ties
    # {1}: U = {0, 2}, M = 2, F = 2, T = 1 + 2·2 + 1·0 = 5; {2}: U = {0, 1, 3}, M = 1, F = 3, T = 1 + 2·1 + 1·2 = 5.
    # Equal ratio and R̂: the fewer misses win, although {2} has the larger union and the larger id.
    p = pool([[[0, -1]], [[2, -1]], [[1, 3]], [[4, 5]]], [1, 3])
    sel = select_specfit_ca(p, b, 2.0, 1.0, k_max=1, backend=backend)
    assert (sel.nodes, sel.reward, sel.misses, sel.union, sel.time) == ((2,), 1.5, 1, 3, 5.0)
    # β_hit = 0: {1}: U = {0, 1, 3}, M = 1, F = 3; {2}: U = {0, 1}, M = 1, F = 2; T = 1 + 2 = 3 for both.
    # Equal ratio, R̂ and M: the smaller union wins.
    p = pool([[[0, -1]], [[1, 3]], [[1, -1]], [[4, 5]]], [1, 3])
    sel = select_specfit_ca(p, b, 2.0, 0.0, k_max=1, backend=backend)
    assert (sel.nodes, sel.misses, sel.union, sel.time) == ((2,), 1, 2, 3.0)
    # Equal ratio, R̂, M and F: {1, 2} (visited first) against {3}, U = {0, 2} and {0, 1} with 1 and 2 resident,
    # M = 1, F = 2, T = 10 + 10·1 + 5·1 = 25, R̂ = 1.5; {1, 3} and {2, 3} have R̂ = 1.75, T = 30. Fewer nodes win.
    routes = np.array([[[0]], [[2]], [[2]], [[1]]])
    p = Pool([-1, 0, 0, 0], [1.0, 0.25, 0.25, 0.5], routes, 4, np.array([[False, True, True, False]]))
    sel = select_specfit_ca(p, [99.0, 10.0, 10.0, 99.0], 10.0, 5.0, k_max=2, backend=backend)
    assert (sel.nodes, sel.misses, sel.union, sel.time) == ((3,), 1, 2, 25.0)
    # Everything equal: the smaller id wins.
    p = pool([[[0, -1]], [[1, -1]], [[1, -1]], [[1, -1]]], [1])
    assert select_specfit_ca(p, b, 2.0, 1.0, k_max=1, backend=backend).nodes == (1,)


def test_residency_encoding_and_counts():
    routes = np.array([[[5, 5, -1], [129, 0, 64]], [[5, 6, 6], [63, 64, 129]]])  # [2, L=2, top_k=3]
    resident = np.zeros((2, 130), bool)
    resident[0, [5, 100]] = True
    resident[1, [0, 63, 129]] = True
    pool = Pool([-1, 0], [1.0, 0.5], routes, 130, resident)
    words = pool.resident_words
    assert words.shape == (6,) and words.dtype == np.uint64
    assert words.tolist() == [1 << 5, 1 << (100 - 64), 0, 1 | 1 << 63, 0, 1 << 1]
    assert pool.resident_words is words  # encoded once
    assert (pool.expert_union(()), pool.expert_misses(())) == (4, 1)  # layer 0: {5}; layer 1: {0, 64, 129}
    assert (pool.expert_union((1,)), pool.expert_misses((1,))) == (6, 2)  # + 6 in layer 0, + 63 in layer 1
    bare = Pool([-1, 0], [1.0, 0.5], routes, 130)
    assert bare.resident is None and bare.resident_words.tolist() == [0] * 6
    assert bare.expert_misses((1,)) == bare.expert_union((1,)) == 6
    with pytest.raises(ValueError):
        Pool([-1, 0], [1.0, 0.5], routes, 130, resident[:, :128])  # [L, N] expected
    with pytest.raises(ValueError):
        Pool([-1, 0], [1.0, 0.5], routes, 130, resident[:1])


def test_views_and_prefixes_share_the_residency():
    rng = np.random.default_rng(0)
    candidates = CandidatePool.root_only(7)
    for parent, prob in [(0, 0.6), (0, 0.3), (1, 0.5), (1, 0.2), (2, 0.9)]:
        candidates.add(parent, 1, prob)
    routes = rng.integers(0, 128, size=(6, 4, 2))
    resident = rng.random((4, 128)) < 0.4
    pool = candidates.view(routes, 128, resident=resident)
    assert pool.resident is not None and (pool.resident == resident).all()
    assert candidates.view(routes, 128).resident is None
    _ = pool.words, pool.resident_words  # encoded once per cycle
    sub = pool.upto_level(1)
    assert sub.n == 2 and sub.resident is pool.resident and sub.resident_words is pool.resident_words
    fresh = Pool(pool.parent[:3], pool.path_prob[:3], routes[:3], 128, resident)
    assert select_specfit_ca(sub, [1.0] * 8, 0.1, 0.01) == select_specfit_ca(fresh, [1.0] * 8, 0.1, 0.01)


def test_backends_agree_past_one_mask_word():
    rng = np.random.default_rng(2)
    n = 140
    parent = [-1] + [int(rng.integers(0, v)) if rng.random() < 0.7 else 0 for v in range(1, n + 1)]
    prob = [1.0] + (rng.random(n) * 0.5).tolist()
    pool = Pool(parent, prob, rng.integers(0, 64, size=(n + 1, 3, 2)), 64, rng.random((3, 64)) < 0.5)
    fast, slow = (select_specfit_ca(pool, [3.0, 2.0, 2.0, 2.0], 0.2, 0.05, k_max=3, backend=x) for x in BACKENDS)
    assert fast == slow and fast.visited > 10_000


@st.composite
def in_flight_pools(draw):
    """`resident_pools` with some resident experts still in flight: dyadic fractions of their copies left, so that
    every sum of them is exact in float64 whatever its order."""
    pool = draw(resident_pools())
    if pool.resident is None:
        return pool
    in_flight = np.zeros(pool.resident.shape)
    for layer, e in zip(*np.nonzero(pool.resident)):
        if e < 8 or e == pool.num_experts - 1:
            in_flight[layer, e] = draw(st.sampled_from([0.0, 0.0, 0.25, 0.5, 0.75, 1.0]))
    return Pool(pool.parent, pool.path_prob, pool.routes, pool.num_experts, pool.resident, in_flight)


def left(pool, s):
    """P(S): the copy fractions left of the union's experts in flight, from sets."""
    if pool.in_flight is None:
        return 0.0
    return sum(float(pool.in_flight[layer, e]) for layer, u in enumerate(layer_sets(pool, s)) for e in u)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(deadline=None, max_examples=200)
@given(pool=in_flight_pools(), coef=ca_coefficients, k_max=st.integers(0, 7),
       lam=st.sampled_from([None, 0.5, 3.0]))
def test_an_expert_in_flight_costs_the_copy_left_in_the_brute_force_argmax(backend, pool, coef, k_max, lam):
    """T̂_CA + (β_miss − β_hit)·P(S): an expert in flight is a hit that still pays the fraction of its copy left."""
    b, beta_miss, beta_hit = coef
    best, best_key = None, None
    legal = legal_subtrees(pool, k_max)
    for s in legal:
        r, f, m = reward(pool, s), union(pool, s), misses(pool, s)
        t = ca_time(b, beta_miss, beta_hit, s, f, m) + (beta_miss - beta_hit) * left(pool, s)
        key = (r / t if lam is None else r - lam * t, r, -m, -f, -len(s))
        if best is None or key > best_key:
            best, best_key = s, key
    if lam is None:
        sel = select_specfit_ca(pool, b, beta_miss, beta_hit, k_max, backend=backend)
    else:
        sel = select_parametric_ca(pool, b, beta_miss, beta_hit, lam, k_max, backend=backend)
    assert (sel.nodes, sel.visited) == (best, len(legal))
    f, m = union(pool, best), misses(pool, best)
    assert sel.time == pytest.approx(ca_time(b, beta_miss, beta_hit, best, f, m)
                                     + (beta_miss - beta_hit) * left(pool, best))
    assert pool.in_flight_left(best) == left(pool, best)


def test_in_flight_is_a_fraction_of_a_resident_experts_copy():
    pool = CandidatePool.root_only(0)
    resident = np.zeros((1, 4), bool)
    resident[0, 1] = True
    routes = np.array([[[1, 2]]])  # [1, L=1, k=2]
    with pytest.raises(ValueError, match="resident experts"):
        pool.view(routes, 4, resident, np.array([[0.0, 0.0, 0.5, 0.0]]))  # 2 is not resident
    view = pool.view(routes, 4, resident, np.array([[0.0, 0.5, 0.0, 0.0]]))
    assert view.in_flight_left(()) == 0.5 and view.expert_misses(()) == 1
    assert pool.view(routes, 4, resident, np.zeros((1, 4))).in_flight is None  # nothing in flight
