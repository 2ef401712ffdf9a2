"""The tune stage: every tree of the grid decodes the tuning prompts, the one of highest decode TPS is chosen, and a
method of kind eagle3-tuned decodes with that tree, losslessly."""

import json

import pytest

from specfit.errors import SpecFitError
from specfit.speculative.methods import build_method
from specfit.speculative.tuning import TREE_KEYS, best, grid
from specfit.stages import decode, tune

TREES = grid({"max_depth": [1, 3], "top_k_expand": [1, 2]})
EMULATE = {"name": "A100", "fixed_ms": 74.02, "token_ms": 1.423, "expert_ms": 4.786, "copy_ms": 4.575,
           "draft_ms": 10.24}


def stream(name, **method):
    """A decode spec on the emulated A100 (the virtual clock: a tree's TPS follows its cycles, not the CPU)."""
    return {"method": {"name": name, **method}, "slots": 4, "max_inflight": 2, "link": None, "emulate": EMULATE,
            "torch_device": "cpu", "dtype": "float32", "limit_tokens": 40, "max_new_tokens": 12, "seed": 0,
            "warmup_tokens": 3, "model": "tiny", "logits_dtype": "model", "verify": "exact"}


def test_the_grid_and_the_choice():
    assert TREES == [{"max_depth": 1, "top_k_expand": 1, "k_max": 1}, {"max_depth": 1, "top_k_expand": 2, "k_max": 2},
                     {"max_depth": 3, "top_k_expand": 1, "k_max": 3}, {"max_depth": 3, "top_k_expand": 2, "k_max": 6}]
    rows = [{**t, "tps_dec": v} for t, v in zip(TREES, (5.0, 7.0, 7.0, 6.0))]
    assert best(rows) == TREES[1]  # the first of equals, in grid order


def test_the_tune_stage_chooses_the_fastest_tree_and_the_tuned_method_decodes_with_it(files, tmp_path):
    out = tmp_path / "tune.json"
    inputs = {k: files[k] for k in ("prompts", "target", "drafter")}
    tune.run({"stream": stream("eagle3-tuned"), "trees": TREES}, inputs, {"tune": out})
    result = json.loads(out.read_text())
    assert [{k: t[k] for k in TREE_KEYS} for t in result["trees"]] == TREES
    assert all(t["tps_dec"] > 0 and t["n_output_tokens"] == 24 for t in result["trees"])
    assert result["chosen"] == best(result["trees"])
    assert result["timing_label"].endswith("virtual clock") and len(result["question_ids"]) == 2

    # each tree's TPS is that of a decode run of plain EAGLE-3 at that tree (the same code, the same clock)
    chosen = result["chosen"]
    plain = {k: tmp_path / f"plain.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(stream("eagle3", **chosen), files, plain)
    row = next(t for t in result["trees"] if {k: t[k] for k in TREE_KEYS} == chosen)
    assert json.loads(plain["metrics"].read_text())["cycles"] == row["cycles"]

    ar = {k: tmp_path / f"ar.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(stream("ar"), files, ar)
    tuned = {k: tmp_path / f"tuned.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(stream("eagle3-tuned"), dict(files, tune=out, reference=ar["requests"]), tuned)
    metrics = json.loads(tuned["metrics"].read_text())
    assert metrics["lossless"]["n_identical"] == 2 and metrics["cycles"] == row["cycles"]
    assert max(int(w) for w in metrics["verify_widths"]) <= chosen["k_max"] + 1


def test_a_tuned_method_without_its_choice_is_refused(tmp_path):
    with pytest.raises(SpecFitError, match="give the `tune` input"):
        build_method({"name": "eagle3-tuned"}, {})
    bad = tmp_path / "tune.json"
    bad.write_text(json.dumps({"chosen": {"max_depth": 0}}))
    with pytest.raises(SpecFitError, match="no tuned tree"):
        build_method({"name": "eagle3-tuned"}, {"tune": str(bad)})
