"""The exact selector against a brute force over all ancestor-closed subsets, on both backends."""

from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfit.selection import (
    BACKENDS,
    Pool,
    holds_level,
    select_min_union,
    select_parametric,
    select_specfit,
    select_top_prob,
)

PROBS = (0.0, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0)  # a coarse grid, so that rewards tie
INTERCEPTS = (1.0, 2.0, 2.5)  # few values, so that times tie
BETAS = (0.0, 0.1, 0.5, 1.0)


@st.composite
def pools(draw, max_nodes=8, level_order=False):
    """A small pool with ties on purpose: gridded probabilities, few experts, copied route rows."""
    n = draw(st.integers(0, max_nodes))
    if level_order:  # parents from the previous level only, so V_<=d is a prefix
        parent, level = [-1], [0]
        for v in range(1, n + 1):
            deeper = v > 1 and draw(st.booleans())
            depth = level[-1] + 1 if deeper or v == 1 else level[-1]
            parent.append(draw(st.sampled_from([u for u in range(v) if level[u] == depth - 1])))
            level.append(depth)
    else:
        parent = [-1] + [draw(st.integers(0, v - 1)) for v in range(1, n + 1)]
    prob = [1.0] + [draw(st.sampled_from(PROBS)) for _ in range(n)]
    num_experts = draw(st.sampled_from([3, 64, 65, 128, 130]))
    layers, top_k = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    palette = sorted({-1, 0, 1, 2, 63 % num_experts, 64 % num_experts, num_experts - 1})  # -1 is padding
    routes = np.array(
        [draw(st.sampled_from(palette)) for _ in range((n + 1) * layers * top_k)], dtype=np.int64
    ).reshape(n + 1, layers, top_k)
    for v in range(1, n + 1):
        if draw(st.booleans()):
            routes[v] = routes[draw(st.integers(0, v - 1))]  # a duplicate route row
    return Pool(parent, prob, routes, num_experts)


coefficients = st.tuples(st.lists(st.sampled_from(INTERCEPTS), min_size=8, max_size=8), st.sampled_from(BETAS))


def legal_subtrees(pool, k_max):
    """All ancestor-closed S with |S| <= min(k_max, |V|), in lexicographic order of sorted node ids."""
    parent = pool.parent.tolist()
    nodes = range(1, pool.n + 1)
    legal = [
        s
        for size in range(min(k_max, pool.n) + 1)
        for s in combinations(nodes, size)
        if all(parent[v] == 0 or parent[v] in s for v in s)
    ]
    return sorted(legal)


def reward(pool, s):
    r = 1.0
    for v in s:  # increasing node id
        r += float(pool.path_prob[v])
    return r


def union(pool, s):
    """F(S) of Eq. 4 from sets of expert ids."""
    return sum(
        len({int(e) for v in (0, *s) for e in pool.routes[v, layer] if e >= 0}) for layer in range(pool.routes.shape[1])
    )


def brute_force(pool, k_max, primary, size=None):
    """Maximize (primary, R̂, -F, -|S|) over legal subtrees; the first in lexicographic order wins ties."""
    best, best_key = None, None
    legal = legal_subtrees(pool, k_max)
    for s in legal:
        if size is not None and len(s) != size:
            continue
        r, f = reward(pool, s), union(pool, s)
        key = (primary(s, r, f), r, -f, -len(s))
        if best is None or key > best_key:
            best, best_key = s, key
    return best, len(legal)


def check(sel, pool, expected, visited, b=None, beta=None):
    assert sel.nodes == expected
    assert sel.reward == reward(pool, expected)
    assert sel.union == union(pool, expected)
    if b is not None:
        assert sel.time == b[len(expected)] + beta * union(pool, expected)
    assert sel.visited == visited


@pytest.mark.parametrize("backend", BACKENDS)
@settings(deadline=None, max_examples=150)
@given(pool=pools(), coef=coefficients, k_max=st.integers(0, 7))
def test_specfit_is_the_brute_force_argmax(backend, pool, coef, k_max):
    b, beta = coef
    expected, visited = brute_force(pool, k_max, lambda s, r, f: r / (b[len(s)] + beta * f))
    check(select_specfit(pool, b, beta, k_max, backend=backend), pool, expected, visited, b, beta)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(deadline=None, max_examples=100)
@given(pool=pools(), coef=coefficients, k_max=st.integers(0, 7), lam=st.sampled_from([0.0, 0.2, 0.5, 1.0, 3.0]))
def test_parametric_is_the_brute_force_argmax(backend, pool, coef, k_max, lam):
    b, beta = coef
    expected, visited = brute_force(pool, k_max, lambda s, r, f: r - lam * (b[len(s)] + beta * f))
    check(select_parametric(pool, b, beta, lam, k_max, backend=backend), pool, expected, visited, b, beta)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(deadline=None, max_examples=100)
@given(pool=pools(), coef=coefficients, data=st.data())
def test_min_union_is_the_brute_force_argmin(backend, pool, coef, data):
    b, beta = coef
    k = data.draw(st.integers(0, min(pool.n, 7)))
    expected, visited = brute_force(pool, k, lambda s, r, f: -f, size=k)
    check(select_min_union(pool, k, b, beta, backend=backend), pool, expected, visited, b, beta)
    assert select_min_union(pool, k, backend=backend).time is None


@settings(deadline=None, max_examples=100)
@given(pool=pools(), coef=coefficients, k_max=st.integers(0, 7))
def test_top_prob_takes_the_most_probable_nodes(pool, coef, k_max):
    b, beta = coef
    expected = tuple(sorted(sorted(range(1, pool.n + 1), key=lambda v: (-pool.path_prob[v], v))[:k_max]))
    check(select_top_prob(pool, k_max, b, beta), pool, expected, 0, b, beta)
    bare = select_top_prob(pool, k_max)
    assert (bare.nodes, bare.union, bare.time) == (expected, None, None)


@settings(deadline=None, max_examples=100)
@given(pool=pools(max_nodes=10, level_order=True), coef=coefficients)
def test_adaptive_depth_stops_as_lemma_2_says(pool, coef):
    b, beta = coef
    figures = lambda sel: (sel.nodes, sel.reward, sel.union, sel.time)  # noqa: E731
    depth, sel = 0, select_specfit(pool.upto_level(0), b, beta)
    while depth < pool.level.max():
        previous, depth = sel, depth + 1
        sel = select_specfit(pool.upto_level(depth), b, beta)
        if not holds_level(pool, sel, depth):
            assert figures(sel) == figures(previous)  # Ŝ_d without a level-d node is Ŝ_{d-1}
            break
    full = select_specfit(pool, b, beta)
    if all(pool.level[v] <= depth for v in full.nodes):
        assert figures(sel) == figures(full)


def test_prefix_shares_the_encoding_and_selects_as_a_fresh_pool():
    rng = np.random.default_rng(0)
    parent = [-1, 0, 0, 1, 1, 2, 3]
    prob = [1.0, 0.6, 0.3, 0.4, 0.1, 0.2, 0.3]
    routes = rng.integers(0, 128, size=(7, 4, 2))
    pool = Pool(parent, prob, routes, 128)
    _ = pool.words  # encoded once per cycle
    sub = pool.prefix(4)
    assert np.shares_memory(sub.words, pool.words)
    fresh = Pool(parent[:5], prob[:5], routes[:5], 128)
    assert select_specfit(sub, [1.0] * 8, 0.1) == select_specfit(fresh, [1.0] * 8, 0.1)
    assert pool.level.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert pool.upto_level(2).n == 5


def test_ties_go_to_larger_reward_then_smaller_union_then_fewer_nodes_then_smaller_ids():
    no_experts = np.full((4, 1, 2), -1)
    # Equal ratio 0.5: root alone (1 / 2) against {1} (2 / 4); the larger reward wins.
    pool = Pool([-1, 0, 0, 0], [1.0, 1.0, 0.0, 0.0], no_experts, 4)
    assert select_specfit(pool, [2.0, 4.0, 9.0, 9.0], 0.0).nodes == (1,)
    # Equal ratio 1.5 / 16: {1} (T = 10 + 2 * 3) against {2, 3} (T = 12 + 2 * 2); the smaller union wins.
    routes = np.array([[[0, -1]], [[2, 3]], [[1, -1]], [[1, -1]]])
    pool = Pool([-1, 0, 0, 0], [1.0, 0.5, 0.25, 0.25], routes, 4)
    sel = select_specfit(pool, [99.0, 10.0, 12.0, 99.0], 2.0)
    assert (sel.nodes, sel.reward, sel.union, sel.time) == ((2, 3), 1.5, 2, 16.0)
    # Equal ratio, reward and union: {3} against {1, 2}; the fewer nodes win.
    routes = np.array([[[0]], [[2]], [[2]], [[1]]])
    pool = Pool([-1, 0, 0, 0], [1.0, 0.25, 0.25, 0.5], routes, 4)
    assert select_specfit(pool, [99.0, 10.0, 10.0, 99.0], 10.0).nodes == (3,)
    # Two identical siblings: the smaller id wins, for every objective.
    pool = Pool([-1, 0, 0], [1.0, 0.5, 0.5], np.array([[[0]], [[1]], [[1]]]), 4)
    assert select_specfit(pool, [1.0] * 3, 1.0, k_max=1).nodes == (1,)
    assert select_parametric(pool, [1.0] * 3, 1.0, 0.1, k_max=1).nodes == (1,)
    assert select_min_union(pool, 1).nodes == (1,)
    assert select_top_prob(pool, 1).nodes == (1,)


def test_min_union_prefers_larger_reward_at_equal_union():
    routes = np.array([[[0, -1]], [[1, -1]], [[1, -1]], [[2, 3]]])
    pool = Pool([-1, 0, 0, 0], [1.0, 0.2, 0.7, 0.9], routes, 4)
    sel = select_min_union(pool, 1)
    assert (sel.nodes, sel.union, sel.reward) == ((2,), 2, 1.7)


def test_route_encoding_counts_each_expert_once_per_layer():
    routes = np.array([[[5, 5, -1], [129, 0, 64]], [[5, 6, 6], [63, 64, 129]]])  # [2, L=2, top_k=3]
    pool = Pool([-1, 0], [1.0, 0.5], routes, 130)
    assert pool.words.shape == (2, 6)  # 3 words per layer for 130 experts
    assert pool.expert_union(()) == 1 + 3
    assert pool.expert_union((1,)) == 2 + 4
    with pytest.raises(ValueError):
        _ = Pool([-1, 0], [1.0, 0.5], routes, 129).words


@pytest.mark.parametrize(
    "parent, prob, routes",
    [
        ([0, 0], [1.0, 0.5], np.zeros((2, 1, 1), int)),  # no root
        ([-1, 1], [1.0, 0.5], np.zeros((2, 1, 1), int)),  # own parent
        ([-1, 0], [1.0], np.zeros((2, 1, 1), int)),  # short prob
        ([-1, 0], [1.0, 0.5], np.zeros((2, 1), int)),  # routes without top_k axis
    ],
)
def test_pool_rejects_malformed_input(parent, prob, routes):
    with pytest.raises(ValueError):
        Pool(parent, prob, routes, 4)


def test_selectors_reject_bad_arguments():
    pool = Pool([-1, 0, 0], [1.0, 0.5, 0.5], np.zeros((3, 1, 1), int), 4)
    with pytest.raises(ValueError):
        select_specfit(pool, [1.0, 1.0], 0.1)  # needs b_0..b_2
    with pytest.raises(ValueError):
        select_min_union(pool, 3)
    with pytest.raises(ValueError):
        select_specfit(pool, [1.0] * 8, 0.1, backend="cuda")


@pytest.mark.parametrize("k_max", [1, 2])
def test_pools_past_one_mask_word_match_the_brute_force(k_max):
    """Past 63 draft nodes the traversal's node masks span several words; ids cross both word boundaries."""
    rng = np.random.default_rng(1)
    n = 150
    parent = [-1] + [int(rng.integers(0, v)) if rng.random() < 0.6 else 0 for v in range(1, n + 1)]
    prob = [1.0] + rng.choice(PROBS, n).tolist()
    routes = rng.integers(-1, 130, size=(n + 1, 2, 2))
    pool = Pool(parent, prob, routes, 130)
    b, beta = [2.0, 2.0, 2.5], 0.1
    assert max(v for v in range(1, n + 1) if parent[v] == 0) > 128  # root children in all three mask words
    expected, visited = brute_force(pool, k_max, lambda s, r, f: r / (b[len(s)] + beta * f))
    for backend in BACKENDS:
        check(select_specfit(pool, b, beta, k_max, backend=backend), pool, expected, visited, b, beta)


@pytest.mark.parametrize("depth,width,k_max", [(5, 2, 7), (5, 2, 16), (3, 3, 16), (2, 4, 16), (5, 1, 16), (4, 3, 7)])
def test_the_config_bound_counts_what_the_exact_search_visits(depth, width, k_max):
    """`specfit.planning.methods.legal_subtrees` (the config's bound on a method's pool) is |A_K| of the full pool
    it describes: the number of subtrees the exact search visits there."""
    from specfit.planning.methods import legal_subtrees
    from specfit.selection.pool import CandidatePool

    pool, expanded = CandidatePool([0]), [0]
    for _ in range(depth):
        children = []
        for parent in expanded:
            for j in range(width):
                pool.add(parent, 1 + pool.n, 0.9 ** (j + 1))
                children.append(pool.n)
        # level 1's nodes are all expanded; after it, the first expanded node's children
        expanded = children[:width]
    visited = select_specfit(pool.view(), np.arange(1.0, k_max + 2), 0.0, k_max).visited
    assert visited == legal_subtrees(depth, width, k_max)
