"""The paired stage (specfit.paired): sides of one cell timed in one process, on a tiny pair."""

import json

import pyarrow.parquet as pq
import pytest

from specfit import paired
from specfit.errors import SpecFitError
from specfit.intervals import ROUND, round_id
from test_decode import spec


def test_sides_take_turns_in_one_process_and_stay_lossless(files, tmp_path):
    """Three sides, two slot counts (one target each), two rounds: every side decodes every prompt each round, the
    greedy outputs all equal the first side's, and the rows pair across sides by (round, request)."""
    sides = [spec("ar"), spec("eagle3"), dict(spec("ar"), slots=0)]
    out = {"requests": tmp_path / "requests.parquet", "metrics": tmp_path / "metrics.json"}
    paired.run({"names": ["ar@4", "eagle3@4", "ar@0"], "sides": sides, "repeats": 2},
               {k: files[k] for k in ("prompts", "target", "drafter")}, out)
    rows = pq.read_table(out["requests"]).to_pylist()
    assert pq.read_schema(out["requests"]).equals(paired.SCHEMA)
    assert sorted((r["side"], r["round"], r["request_id"]) for r in rows) == sorted(
        (side, rnd, i) for side in ("ar@4", "eagle3@4", "ar@0") for rnd in (0, 1) for i in (0, 1))
    outputs = {(r["round"], r["request_id"]): r["output_ids"] for r in rows if r["side"] == "ar@4"}
    assert all(r["output_ids"] == outputs[r["round"], r["request_id"]] for r in rows)
    assert all(r["n_output"] == 12 and r["t_request_s"] > r["t_prefill_s"] > 0 for r in rows)
    metrics = json.loads(out["metrics"].read_text())
    assert sorted(metrics["sides"]) == ["ar@0", "ar@4", "eagle3@4"]
    assert (metrics["requests"], metrics["repeats"], metrics["link_emulated"]) == (2, 2, False)
    for side in metrics["sides"].values():
        assert side["identical_to_first"] == 4 and side["tps_dec"]["n"] == 4
        assert side["tps_dec"]["low"] <= side["tps_dec"]["value"] <= side["tps_dec"]["high"]
    assert metrics["sides"]["ar@4"]["cycles"] == 2 * 2 * 11  # AR commits one token a cycle after prefill's first
    assert metrics["sides"]["eagle3@4"]["cycles"] <= metrics["sides"]["ar@4"]["cycles"]  # a random drafter
    assert round_id(rows[0])["request_id"] == rows[0]["round"] * ROUND + rows[0]["request_id"]


def test_a_side_of_another_workload_or_a_single_side_is_refused(files, tmp_path):
    out = {"requests": tmp_path / "r.parquet", "metrics": tmp_path / "m.json"}
    inputs = {k: files[k] for k in ("prompts", "target", "drafter")}
    with pytest.raises(SpecFitError, match="two or more sides"):
        paired.run({"names": ["ar@4"], "sides": [spec("ar")], "repeats": 1}, inputs, out)
    with pytest.raises(SpecFitError, match="must share the model, device, precision and workload limits"):
        paired.run({"names": ["ar@4", "eagle3@4"], "sides": [spec("ar"), dict(spec("eagle3"), max_new_tokens=6)],
                    "repeats": 1}, inputs, out)
    with pytest.raises(SpecFitError, match="one distinct name each"):
        paired.run({"names": ["ar@4", "ar@4"], "sides": [spec("ar"), spec("ar")], "repeats": 1}, inputs, out)
    assert not out["requests"].exists()
