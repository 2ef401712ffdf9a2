"""Recorded cycles replayed through a SpecFit kind's selection (`specfit.bench.host.replay`) decide as the run did,
cycle for cycle: the view grown per level decides as the view rebuilt per level (the selection before it)."""

import copy

import pyarrow as pa
import pytest
from decode_helpers import decode_prompts

from specfit.bench import host
from specfit.engine.offload import make_engine
from specfit.io import write_parquet
from specfit.results.records import ATLAS_SCHEMA
from specfit.selection.coefficients import DraftCost
from specfit.speculative.config import MethodConfig
from specfit.speculative.methods import SpecFitCA, build_method
from specfit.speculative.online import SpecFitOnline
from specfit.speculative.routes import AtlasRoutes, LiveRoutes

B = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]


def method(cls, config, routes):
    """A SpecFit kind over the tiny target's 8 experts, drafting at a cost, its expert term on."""
    return cls(config, B, 0.05, 0.01, DraftCost(0.3, 0.2, 0.01), routes, num_experts=8)


@pytest.fixture(scope="module")
def offloaded(target):
    model = copy.deepcopy(target)
    return model, make_engine(model, slots=3)


@pytest.mark.parametrize("cls, name", [(SpecFitCA, "specfit-ca"), (SpecFitOnline, "specfit-online")])
def test_replayed_cycles_decide_as_recorded_by_the_rebuilt_view(offloaded, oracle, prompts, limits, tmp_path, cls,
                                                                 name):
    model, engine = offloaded
    ar = [r.request["output_ids"] for r in decode_prompts(model, None, build_method({"name": "ar"}), prompts, limits,
                                                          engine)]
    live = LiveRoutes()
    decode_prompts(model, oracle, method(cls, MethodConfig(name), live), prompts, limits, engine, ar)
    atlas = tmp_path / "atlas.parquet"
    write_parquet(pa.Table.from_pylist(live.rows, schema=ATLAS_SCHEMA), atlas)
    before = method(cls, MethodConfig(name), AtlasRoutes(atlas))
    before.rebuild_view = True  # the selection as it was: the view rebuilt from the lists every level
    runs = decode_prompts(model, oracle, before, prompts, limits, engine, ar)
    assert [r.request["output_ids"] for r in runs] == ar
    cycles = [c for r in runs for c in r.cycles]
    requests = {r.request["request_id"]: r.request for r in runs}
    replay_engine = host.ReplayEngine(8, 2)
    for rebuild in (False, True):
        after = method(cls, MethodConfig(name), AtlasRoutes(atlas))
        after.rebuild_view = rebuild
        seconds, same, decisions = host.replay(after, cycles, requests, limits, replay_engine)
        assert same == len(cycles) > 5  # every cycle: the same subtree, stopped at the same level
        assert [(list(n), d) for n, d in decisions] == [(c["selected"], c["drafted_levels"]) for c in cycles]
        assert all(s > 0 for s in seconds)
    assert sum(c["drafted_levels"] for c in cycles) > len(runs) and any(len(c["selected"]) > 1 for c in cycles)


