"""Prefetching methods: specfit-prefetch and eagle3-prefetch copy their subtree's predicted experts while
the drafter drafts; outputs stay AR's, EAGLE-3's trees stay EAGLE-3's, the cost sees what the prefetch bought."""

import copy
import functools
import json

import numpy as np
import pyarrow as pa
import pytest
from decode_helpers import decode_prompts

from specfit.engine.offload import make_engine
from specfit.io import write_parquet
from specfit.results.records import ATLAS_SCHEMA, CYCLE_SCHEMA, in_flight_fractions, in_flight_matrix, resident_ids
from specfit.selection.coefficients import DraftCost
from specfit.selection.pool import CandidatePool
from specfit.speculative.config import MethodConfig
from specfit.speculative.cycle import Cycle
from specfit.speculative.methods import build_method
from specfit.speculative.prefetching import Eagle3Prefetch, SpecFitPrefetch, prefetch_order
from specfit.speculative.routes import AtlasRoutes, LiveRoutes

B = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]
DRAFTING = DraftCost(0.2, 0.2, 0.0)  # a level 0.2 ms: with β_miss 0.05 (no modelled link) 4 copies per level


def prefetching(routes, config="specfit-prefetch"):
    return SpecFitPrefetch(MethodConfig(config), B, 0.05, 0.01, DRAFTING, routes, num_experts=8)


@pytest.fixture
def offloaded(target):
    """The tiny target offloaded with 3 of its 8 experts per layer cached (a fresh copy per test)."""
    model = copy.deepcopy(target)
    return model, make_engine(model, slots=3)


run = functools.partial(decode_prompts, clear_cache=True)  # every request from an empty cache


@pytest.fixture(scope="module")
def ar(target, prompts, limits):
    model = copy.deepcopy(target)
    engine = make_engine(model, slots=3)
    return [r.request["output_ids"] for r in run(model, None, build_method({"name": "ar"}), prompts, limits, engine)]


def test_prefetch_order_ranks_by_the_probability_of_the_node_needing_the_expert():
    routes = np.array([[[0, 1], [2, 3]],  # root
                       [[1, 4], [5, -1]],  # node 1, p 0.9
                       [[6, 4], [7, 2]]])  # node 2, p 0.5 ([n+1=3, L=2, k=2])
    order, needed = prefetch_order(routes, [1.0, 0.9, 0.5], (1, 2))
    assert order == [(0, 0), (0, 1), (1, 2), (1, 3), (0, 4), (1, 5), (0, 6), (1, 7)]
    assert needed == [{0, 1, 4, 6}, {2, 3, 5, 7}]
    assert prefetch_order(routes, [1.0, 0.9, 0.5], (1,))[1] == [{0, 1, 4}, {2, 3, 5}]


def test_specfit_prefetch_is_lossless_live_and_from_its_atlas_and_prefetches(offloaded, oracle, prompts, limits, ar,
                                                                           tmp_path):
    model, engine = offloaded
    live = LiveRoutes()
    built = run(model, oracle, prefetching(live), prompts, limits, engine, ar)
    assert [r.request["output_ids"] for r in built] == ar
    assert engine.stats()["prefetch"]["issued"] == 0  # an atlas build has no routes before the full pool
    path = tmp_path / "atlas.parquet"
    write_parquet(pa.Table.from_pylist(live.rows, schema=ATLAS_SCHEMA), path)
    engine.reset_stats()
    measured = run(model, oracle, prefetching(AtlasRoutes(path)), prompts, limits, engine, ar)
    assert [r.request["output_ids"] for r in measured] == ar
    p = engine.stats()["prefetch"]
    assert p["issued"] > 0 and p["used"] > 0
    assert p["issued"] == p["used"] + p["evicted_unused"] + p["idle"]  # every prefetch settled by its forward
    # the prefetched copies are transfers too, counted in the requests' (and the cycles') h2d_transfers
    assert sum(r.request["h2d_transfers"] for r in measured) == engine.h2d_transfers


def test_eagle3_prefetch_verifies_eagle3s_trees_and_outputs_ar(offloaded, oracle, prompts, limits, ar, tmp_path):
    model, engine = offloaded
    plain = run(model, oracle, build_method({"name": "eagle3"}), prompts, limits, engine, ar)
    live = LiveRoutes()
    method = Eagle3Prefetch(MethodConfig("eagle3-prefetch"), DRAFTING, 0.05, live, 8)
    run(model, oracle, method, prompts, limits, engine, ar)  # an atlas build: the routes once per cycle
    assert len(live.rows) == sum(len(r.cycles) for r in plain)
    path = tmp_path / "atlas.parquet"
    write_parquet(pa.Table.from_pylist(live.rows, schema=ATLAS_SCHEMA), path)
    engine.reset_stats()
    source = AtlasRoutes(path)
    fetched = run(model, oracle, Eagle3Prefetch(MethodConfig("eagle3-prefetch"), DRAFTING, 0.05, source, 8),
                  prompts, limits, engine, ar)
    assert [r.request["output_ids"] for r in fetched] == ar
    assert [c["selected"] for r in fetched for c in r.cycles] == [c["selected"] for r in plain for c in r.cycles]
    p = engine.stats()["prefetch"]
    assert p["issued"] > 0 and p["used"] > 0 and source.nodes_missed == 0


class FakeEngine:
    copy_ms = 2.0

    def __init__(self, resident, left):
        self._resident, self._left = resident, left

    def resident(self):
        return self._resident.copy()

    def in_flight_ms(self):
        return self._left


class FakeTarget:
    def __init__(self, engine):
        self.engine = engine


def test_an_expert_in_flight_counts_by_what_is_left_of_its_copy():
    resident = np.zeros((2, 8), dtype=bool)
    resident[0, [1, 2, 3]] = True  # 2 and 3 prefetched: 2 has 1.5 ms of its 2 ms copy left, 3 has 0.5 ms
    left = np.zeros((2, 8))
    left[0, 2], left[0, 3] = 1.5, 0.5
    method = prefetching(None)
    cycle = Cycle(0, 0, 1, [5], FakeTarget(FakeEngine(resident, left)))
    method._read_resident(cycle)
    assert method.residency(cycle).tolist() == resident.tolist()
    assert method._in_flight[0, [1, 2, 3]].tolist() == [0.0, 0.75, 0.25] and method._in_flight.sum() == 1.0
    pool = CandidatePool.root_only(5)
    view = pool.view(np.array([[[2, 3], [0, 1]]]), 8, method.residency(cycle), method._in_flight)  # root: 2, 3 | 0, 1
    # T̂(∅) = b_0 + β_miss·2 (0, 1 of layer 1) + β_hit·2 + (β_miss − β_hit)·(0.75 + 0.25)
    assert method.choose(view, 0).time == pytest.approx(1.0 + 0.05 * 2 + 0.01 * 2 + 0.04 * 1.0)


def test_built_from_coefficients(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({
        "b": B, "beta": 0.2,
        "drafting": {"start_ms": 0.9, "level_ms": 0.6, "select_ms": 0.1, "r2": 0.9, "n_points": 10},
        "cache_aware": {"b": [3.0] * 8, "beta_miss": 0.4, "beta_hit": 0.02, "r2": 0.95,
                        "without_drafting": {"b": [2.0] * 8, "beta_miss": 0.3, "beta_hit": 0.01}}}))
    fit = build_method({"name": "specfit-prefetch", "routes": "live"}, {"coefficients": tmp_path / "c.json"}, 0, 8)
    assert isinstance(fit, SpecFitPrefetch) and (fit.beta_miss, fit.drafting) == (0.3, DraftCost(0.9, 0.6, 0.1))
    eagle = build_method({"name": "eagle3-prefetch", "routes": "live"}, {"coefficients": tmp_path / "c.json"}, 0, 8)
    assert isinstance(eagle, Eagle3Prefetch) and (eagle.beta_miss, eagle.drafting.next_level_ms) == (0.3, 0.7)


def test_the_in_flight_column_round_trips_with_the_residency():
    resident = np.array([[True, False, True, False], [False, True, False, False]])  # [L=2, N=4]
    left = np.array([[0.25, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])  # copy left of resident experts
    ids = resident_ids(resident)
    fractions = in_flight_fractions(resident, left)
    assert ids == [[0, 2], [1]] and fractions == [[0.25, 0.0], [1.0]]
    assert np.array_equal(in_flight_matrix(ids, fractions, 4), left)
    rows = pa.Table.from_pylist([{"resident": ids, "in_flight": fractions}], schema=pa.schema(
        [CYCLE_SCHEMA.field("resident"), CYCLE_SCHEMA.field("in_flight")])).to_pylist()
    assert np.array_equal(in_flight_matrix(rows[0]["resident"], rows[0]["in_flight"], 4), left)
    assert in_flight_fractions(resident, np.zeros((2, 4))) is None and in_flight_fractions(None, left) is None
    assert in_flight_matrix(ids, None, 4) is None
