"""The theory stage on a real SpecFit run: atlas build, measured run with atlas routes, Table 5."""

import json

import pyarrow.parquet as pq
import pytest

from specfit import atlas, decode, theory


@pytest.fixture(scope="module")
def run(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("theory")
    spec = {"method": {"name": "specfit"}, "slots": 4, "max_inflight": 2, "link": None, "torch_device": "cpu",
            "dtype": "float32", "limit_tokens": 40, "max_new_tokens": 16, "seed": 0, "warmup_tokens": 3}
    build = {k: out / f"build.{k}" for k in ("atlas", "requests", "cycles", "metrics")}
    atlas.run(spec, files, build)
    measured = {k: out / f"run.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(spec, dict(files, atlas=build["atlas"]), measured)
    table = out / "theory.json"
    theory.run({"beta_multiplier": 2.0, "k_max": 7, "max_depth": 5}, {"cycles": measured["cycles"], "requests": measured["requests"],
                                          "atlas": build["atlas"], "coefficients": files["coefficients"]},
               {"theory": table})
    return measured, json.loads(table.read_text())


def test_table_5_on_recorded_pools(run):
    measured, table = run
    cycles = [c for c in pq.read_table(measured["cycles"]).to_pylist() if len(c["pool_parent"]) > 1]
    assert table["cycles"] == len(cycles) > 0
    # the selector rerun on each recorded pool with the atlas routes reproduces every recorded selection
    assert table["recorded_selection_differs_pct"] == 0.0
    assert 0.0 <= table["gap_pct"] <= table["bound_pct"] + 1e-9
    assert table["theta"] <= table["lambda_star"]
    assert table["union_per_reward_2beta"] <= table["union_per_reward_beta"] + 1e-9
    levels = [c["drafted_levels"] for c in cycles]
    assert table["drafted_levels_mean"] == pytest.approx(sum(levels) / len(levels))
    assert table["stopped_early_pct"] == pytest.approx(100 * sum(lv < 5 for lv in levels) / len(levels))


def test_accepted_paths_extend_past_the_verified_subtree():
    # root 0 -> 1 -> 3 matches the continuation [a, c]; only node 1 was verified
    path = theory.accepted_path_in_pool([-1, 0, 0, 1, 1], [9, 10, 11, 12, 13], [10, 12, 99])
    assert path == (1, 3)
    assert theory.committed((1,), path) == 2 and theory.committed((1, 3), path) == 3
