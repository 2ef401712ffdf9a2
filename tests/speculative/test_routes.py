import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specfit.errors import SpecFitError
from specfit.io import write_parquet
from specfit.results.records import ATLAS_SCHEMA, atlas_row
from specfit.selection.pool import CandidatePool
from specfit.speculative.cycle import Cycle
from specfit.speculative.routes import AtlasRoutes, LiveRoutes, NoisyRoutes, find_source

L, K, N = 4, 3, 16


class Fixed:
    full_pool = False

    def __init__(self, routes):
        self.value = routes

    def routes(self, cycle, pool):
        return self.value[: pool.n + 1]


def fixture(n=6, seed=0):
    rng = np.random.default_rng(seed)
    routes = np.stack([[rng.permutation(N)[:K] for _ in range(L)] for _ in range(n + 1)])  # [n+1, L, K]
    pool = CandidatePool.root_only(1)
    for v in range(n):
        pool.add(v // 2, v, 0.5)
    return Fixed(routes), pool, Cycle(request_id=3, index=5, prefix_len=10, output=[])


def test_full_accuracy_keeps_the_routes():
    base, pool, cycle = fixture()
    assert (NoisyRoutes(base, 1.0, seed=0, num_experts=N).routes(cycle, pool) == base.value).all()


def test_zero_accuracy_replaces_every_expert_with_distinct_outsiders():
    base, pool, cycle = fixture()
    noisy = NoisyRoutes(base, 0.0, seed=0, num_experts=N).routes(cycle, pool)
    for v in range(pool.n + 1):
        for layer in range(L):
            row = noisy[v, layer]
            assert len(set(row)) == K and not set(row) & set(base.value[v, layer])


def test_noise_is_seeded_per_request_cycle_and_node():
    base, pool, cycle = fixture()
    a = NoisyRoutes(base, 0.5, seed=7, num_experts=N).routes(cycle, pool)
    assert (a == NoisyRoutes(base, 0.5, seed=7, num_experts=N).routes(cycle, pool)).all()
    assert (a != NoisyRoutes(base, 0.5, seed=8, num_experts=N).routes(cycle, pool)).any()
    kept = (a == base.value).mean()
    assert 0.3 < kept < 0.7
    # a smaller pool (fewer levels drafted) sees the same noise on its nodes
    small = CandidatePool(pool.token[:3], pool.parent[:3], pool.path_prob[:3], pool.level[:3])
    assert (NoisyRoutes(base, 0.5, seed=7, num_experts=N).routes(cycle, small) == a[:3]).all()


# ----- AtlasRoutes: nodes looked up by content ------------------------------------------------------------------
#
# The request's sequence x: prompt x[0..9], then 100, 11, 12, 13, 14, ... The atlas run's cycle 0 (prefix 10)
# accepted 11, 12 and got 13 as the next root, so its cycle 1 sits at prefix 13.

ROW_A = (100, [(0, 11, 0.6), (0, 21, 0.3), (1, 12, 0.7), (1, 31, 0.2), (2, 22, 0.5), (2, 41, 0.4),
               (3, 13, 0.8), (3, 51, 0.1), (4, 32, 0.6), (4, 61, 0.3)])  # levels 1, 2, 3
ROW_B = (13, [(0, 14, 0.9), (0, 71, 0.05), (1, 15, 0.8), (1, 72, 0.1), (2, 73, 0.5), (2, 74, 0.4)])  # levels 1, 2


def make_pool(root, nodes, scale=1.0):
    pool = CandidatePool.root_only(root)
    for parent, token, prob in nodes:
        pool.add(parent, token, prob * scale)
    return pool


def upto(pool, depth):
    """The pool as drafted up to ``depth`` levels (node ids are assigned level by level)."""
    m = sum(1 for lv in pool.level if lv <= depth)
    return CandidatePool(pool.token[:m], pool.parent[:m], pool.path_prob[:m], pool.level[:m])


def random_routes(n, seed):
    rng = np.random.default_rng(seed)
    return np.stack([[rng.permutation(N)[:K] for _ in range(L)] for _ in range(n + 1)])  # [n+1, L, K]


SEQ = [100, 11, 12, 13, 14, 15]  # x[10..]: the output both runs commit


def cycle_at(index, prefix_len, request_id=0, output=None):
    """The cycle at ``prefix_len``, carrying the output so far (x[10..prefix_len], the root last)."""
    output = SEQ[: prefix_len - 9] if output is None else output
    return Cycle(request_id=request_id, index=index, prefix_len=prefix_len, output=output)


@pytest.fixture
def atlas(tmp_path):
    """(path, {prefix_len: (pool, routes)}) of a two-row atlas for request 0."""
    rows, held = [], {}
    for index, (prefix, (root, nodes)) in enumerate(((10, ROW_A), (13, ROW_B))):
        pool = make_pool(root, nodes)
        routes = random_routes(pool.n, seed=prefix)
        rows.append(atlas_row(0, index, prefix, pool, routes))
        held[prefix] = (pool, routes)
    path = tmp_path / "atlas.parquet"
    write_parquet(atlas_table(rows), path)
    return path, held


def test_exact_replay_returns_the_atlas_routes_and_no_misses(atlas, caplog):
    path, held = atlas
    source = AtlasRoutes(path)
    for index, prefix in enumerate((10, 13)):
        pool, routes = held[prefix]
        cycle = cycle_at(index, prefix)
        for depth in range(1, pool.depth + 1):  # as SpecFit asks: after every drafted level
            small = upto(pool, depth)
            got = source.routes(cycle, small)
            assert got.dtype == np.int64 and np.array_equal(got, routes[: small.n + 1])
    assert source.nodes_looked_up == 11 + 7  # each node once per cycle, roots included
    assert source.nodes_missed == source.nodes_from_earlier_rows == source.prob_mismatches == 0
    assert not caplog.records
    assert find_source(NoisyRoutes(source, 0.5, seed=0, num_experts=N), AtlasRoutes) is source
    assert find_source(Fixed(None), AtlasRoutes) is None


def test_a_flipped_leaf_gets_its_parents_routes_and_counts_one_miss(atlas, caplog):
    path, held = atlas
    source = AtlasRoutes(path)
    pool, routes = held[13]
    root, nodes = ROW_B
    flipped = make_pool(root, [*nodes[:-1], (2, 99, 0.4)])  # node 6 (a leaf, child of node 2): 74 -> 99
    got = source.routes(cycle_at(1, 13), flipped)
    assert np.array_equal(got[:6], routes[:6])
    assert np.array_equal(got[6], routes[2])
    assert (source.nodes_looked_up, source.nodes_missed) == (7, 1)
    assert "node 6 (token 99) is in no atlas row; using the routes of node 2" in caplog.text


def test_a_flipped_inner_node_takes_its_subtree_with_it(atlas):
    path, held = atlas
    source = AtlasRoutes(path)
    pool, routes = held[10]
    root, nodes = ROW_A
    flipped = make_pool(root, [nodes[0], (0, 98, 0.3), *nodes[2:]])  # node 2: 21 -> 98; its children 5, 6 go too
    got = source.routes(cycle_at(0, 10), flipped)
    for v in (2, 5, 6):  # the nearest resolved ancestor is the root
        assert np.array_equal(got[v], routes[0])
    keep = [v for v in range(11) if v not in (2, 5, 6)]
    assert np.array_equal(got[keep], routes[keep])
    assert source.nodes_missed == 3


def test_a_shifted_cycle_boundary_resolves_from_the_earlier_row(atlas):
    """This run accepted only 11 at cycle 0, so its cycle 1 sits at prefix 12 (root 12), which no row has: row A
    holds x[11..12] as nodes 1 -> 3, so the root and its drafted children come from there."""
    path, held = atlas
    source = AtlasRoutes(path)
    pool_a, routes_a = held[10]
    source.routes(cycle_at(0, 10), pool_a)
    shifted = make_pool(12, [(0, 13, 0.8), (0, 51, 0.1), (1, 14, 0.9)])  # 13 -> A's node 7, 51 -> 8; 14: beyond A
    got = source.routes(cycle_at(1, 12), shifted)
    assert np.array_equal(got[:3], routes_a[[3, 7, 8]])
    assert np.array_equal(got[3], routes_a[7])  # node 3 is deeper than row A: its parent's routes
    assert (source.nodes_from_earlier_rows, source.nodes_missed) == (3, 1)
    pool_b, routes_b = held[13]  # the trajectories meet again at prefix 13
    assert np.array_equal(source.routes(cycle_at(2, 13), pool_b), routes_b)
    assert source.nodes_missed == 1


def test_an_earlier_row_is_matched_on_the_committed_tokens_not_on_the_root_alone(tmp_path):
    """Row 10 holds token 12 at level 2 under both 11 and 21: the cycle's output says which one x[11] was."""
    pool = make_pool(100, [(0, 11, 0.6), (0, 21, 0.3), (1, 12, 0.7), (2, 12, 0.5)])
    routes = random_routes(pool.n, seed=1)
    path = tmp_path / "atlas.parquet"
    write_parquet(atlas_table([atlas_row(0, 0, 10, pool, routes)]), path)
    source = AtlasRoutes(path)
    got = source.routes(cycle_at(1, 12, output=[100, 11, 12]), CandidatePool.root_only(12))
    assert np.array_equal(got[0], routes[3]) and source.nodes_missed == 0
    got = source.routes(cycle_at(1, 12, output=[100, 21, 12]), CandidatePool.root_only(12))
    assert np.array_equal(got[0], routes[4]) and source.nodes_missed == 0
    got = source.routes(cycle_at(1, 12, output=[100, 31, 12]), CandidatePool.root_only(12))  # in no row
    assert np.array_equal(got[0], routes[0]) and source.nodes_missed == 1  # the nearest earlier row's root


def test_earlier_rows_are_not_searched_while_the_own_row_answers(atlas, monkeypatch):
    path, held = atlas
    source = AtlasRoutes(path)
    monkeypatch.setattr("specfit.speculative.routes._anchor", lambda *a: pytest.fail("searched earlier rows"))
    pool, routes = held[13]
    assert np.array_equal(source.routes(cycle_at(1, 13), pool), routes)


def test_probabilities_off_in_the_last_bits_pass_silently_larger_ones_are_logged(atlas, caplog):
    path, held = atlas
    root, nodes = ROW_B
    source = AtlasRoutes(path)
    for scale in (1 + 1e-7, 1 - 1e-5):  # last bits of one fp32 probability; a few ulps compounded over 5 levels
        close = source.routes(cycle_at(1, 13), make_pool(root, nodes, scale=scale))
        assert np.array_equal(close, held[13][1])
    assert source.prob_mismatches == source.nodes_missed == 0 and not caplog.records
    far = source.routes(cycle_at(1, 13), make_pool(root, nodes, scale=1 + 1e-3))  # logged and counted, not fatal
    assert np.array_equal(far, held[13][1])
    assert source.prob_mismatches == 6 and source.nodes_missed == 0
    assert "path probability of node 1" in caplog.text


def test_an_inconsistent_atlas_is_a_clear_error(atlas, tmp_path):
    path, held = atlas
    source = AtlasRoutes(path)
    pool, _ = held[10]
    with pytest.raises(SpecFitError, match="request 7, cycle 0: the atlas has no rows for this request"):
        source.routes(cycle_at(0, 10, request_id=7), pool)
    # a prefix without a row (the build verified the root alone there, or other prompts): misses, not errors
    for cycle in (cycle_at(0, 11, output=[999]), cycle_at(3, 9, output=[998])):
        before = source.nodes_missed
        routes = source.routes(cycle, make_pool(cycle.output[-1], []))
        assert source.nodes_missed == before + 1 and np.array_equal(routes[0], held[10][1][0])
    bare = tmp_path / "bare.parquet"
    write_parquet(pq.read_table(path).drop_columns(["pool_prob"]), bare)
    with pytest.raises(SpecFitError, match=r"lacks columns \['pool_prob'\]"):
        AtlasRoutes(bare)


def test_a_tampered_atlas_row_no_longer_aborts_the_run(target, oracle, prompts, limits, tmp_path):
    """A node flipped in the atlas (as a drafting near-tie would flip it in the run) costs misses, not the run."""
    from specfit.speculative.config import MethodConfig
    from specfit.speculative.methods import SpecFit, build_method
    from specfit.speculative.request import decode_request

    def decode(method, drafter=None):
        result = decode_request(target, drafter, method, prompts[0], request_id=0, question_id=100, limits=limits)
        return result.request["output_ids"], result.cycles

    reference, _ = decode(build_method({"name": "ar"}))
    oracle.sequence = prompts[0] + reference
    live = LiveRoutes()
    decode(SpecFit(MethodConfig("specfit"), [1.0 + 0.1 * i for i in range(8)], 0.05, live, 8), oracle)
    rows = [dict(r) for r in live.rows]
    rows[3]["pool_token"] = [rows[3]["pool_token"][0], rows[3]["pool_token"][1] + 1, *rows[3]["pool_token"][2:]]
    path = tmp_path / "atlas.parquet"
    write_parquet(atlas_table(rows), path)
    source = AtlasRoutes(path)
    output, cycles = decode(SpecFit(MethodConfig("specfit"), [1.0 + 0.1 * i for i in range(8)], 0.05, source, 8),
                            oracle)
    assert output == reference  # lossless whatever the routes
    assert source.nodes_missed >= 1 and source.nodes_looked_up > source.nodes_missed


def atlas_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ATLAS_SCHEMA)
