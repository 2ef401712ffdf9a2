"""The tune stage: every tree of the grid decodes the tuning prompts, the one of highest decode TPS is chosen, and a
method of kind eagle3-tuned decodes with that tree, losslessly."""

import json

import pyarrow.parquet as pq
import pytest

from specfit.errors import SpecFitError
from specfit.results.records import read_prompts
from specfit.speculative.methods import build_method
from specfit.speculative.tuning import TREE_KEYS, best, choice, grid
from specfit.stages import decode, tune, tune_choice

TREES = grid({"max_depth": [1, 3], "top_k_expand": [1, 2]})
EMULATE = {"name": "A100", "fixed_ms": 74.02, "token_ms": 1.423, "expert_ms": 4.786, "copy_ms": 4.575,
           "draft_ms": 10.24}


def test_the_grid_and_the_choice():
    assert TREES == [{"max_depth": 1, "top_k_expand": 1, "k_max": 1}, {"max_depth": 1, "top_k_expand": 2, "k_max": 2},
                     {"max_depth": 3, "top_k_expand": 1, "k_max": 3}, {"max_depth": 3, "top_k_expand": 2, "k_max": 6}]
    rows = [{**t, "tps_dec": v} for t, v in zip(TREES, (5.0, 7.0, 7.0, 6.0))]
    assert best(rows) == TREES[1]  # the first of equals, in grid order


def stream(name, slots=4, **method):
    """A decode spec on the emulated A100 (the virtual clock: a tree's TPS follows its cycles, not the CPU)."""
    return {"method": {"name": name, **method}, "slots": slots, "max_inflight": 2, "link": None, "emulate": EMULATE,
            "torch_device": "cpu", "dtype": "float32", "limit_tokens": 40, "max_new_tokens": 12, "seed": 0,
            "warmup_tokens": 3, "model": "tiny", "logits_dtype": "model", "verify": "exact"}


def test_the_tune_stage_chooses_the_fastest_tree_and_the_tuned_method_decodes_with_it(files, tmp_path):
    out = tmp_path / "grid.json"
    inputs = {k: files[k] for k in ("prompts", "target", "drafter")}
    tune.run({"streams": {"4": stream("eagle3-tuned"), "0": stream("eagle3-tuned", 0)}, "trees": TREES,
              "decodes": []}, inputs, {"grid": out})
    sweep = json.loads(out.read_text())
    assert sweep["slots"]["4"]["clocked"] == "decoded"
    assert sweep["slots"]["0"]["clocked"] == "priced on the decodes at 4 slots"
    result = choice(sweep, 4)
    assert [{k: t[k] for k in TREE_KEYS} for t in result["trees"]] == TREES
    assert all(t["tps_dec"] > 0 and t["n_output_tokens"] == 24 for t in result["trees"])
    assert result["chosen"] == best(result["trees"])
    assert result["timing_label"].endswith("virtual clock") and len(result["question_ids"]) == 2
    # without a cache the same cycles, every one dearer: each forward copies its whole union
    none = choice(sweep, 0)
    for cached, uncached in zip(result["trees"], none["trees"]):
        assert uncached["cycles"] == cached["cycles"] and uncached["ms_per_cycle"] > cached["ms_per_cycle"]
    with pytest.raises(SpecFitError, match="no slot count 8"):
        choice(sweep, 8)
    path = tmp_path / "slots4.json"
    tune_choice.run({"slots": 4}, {"grid": out}, {"tune": path})  # rule tune_choice
    assert json.loads(path.read_text()) == result

    # each tree's TPS is that of a decode run of plain EAGLE-3 at that tree (the same code, the same clock)
    chosen = result["chosen"]
    plain = {k: tmp_path / f"plain.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(stream("eagle3", **chosen), files, plain)
    row = next(t for t in result["trees"] if {k: t[k] for k in TREE_KEYS} == chosen)
    assert json.loads(plain["metrics"].read_text())["cycles"] == row["cycles"]

    ar = {k: tmp_path / f"ar.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(stream("ar"), files, ar)
    tuned = {k: tmp_path / f"tuned.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(stream("eagle3-tuned"), dict(files, tune=path, reference=ar["requests"]), tuned)
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


def test_a_cross_fitted_tuned_method_decodes_each_question_with_its_folds_tree(files, tmp_path):
    """Under cross-fitting each tune job names the questions its tree decodes (its fold); the tuned method decodes
    each question with its fold's tree, and stays lossless."""
    first, second = (p["question_id"] for p in read_prompts(files["prompts"], None))
    folds = []
    for f, (tree, decodes) in enumerate(((TREES[0], [first]), (TREES[3], [second]))):  # a 1-node chain, a 6-node tree
        folds.append(tmp_path / f"slots4.fold{f}.json")
        folds[-1].write_text(json.dumps({"chosen": tree, "trees": [tree], "question_ids": [], "decodes": decodes}))
    ar = {k: tmp_path / f"ar.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(stream("ar"), files, ar)
    tuned = {k: tmp_path / f"tuned.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(stream("eagle3-tuned"), dict(files, tune=[str(p) for p in folds], reference=ar["requests"]), tuned)
    assert json.loads(tuned["metrics"].read_text())["lossless"]["n_identical"] == 2
    cycles = pq.read_table(tuned["cycles"]).to_pylist()
    requests = {r["request_id"]: r["question_id"] for r in pq.read_table(tuned["requests"]).to_pylist()}
    widest = {}
    for c in cycles:
        q = requests[c["request_id"]]
        widest[q] = max(widest.get(q, 0), len(c["selected"]))  # draft nodes verified
    assert widest[first] <= TREES[0]["k_max"] and widest[second] > TREES[0]["k_max"]


def test_tuning_questions_that_the_tree_would_decode_are_refused(files, tmp_path):
    ids = [p["question_id"] for p in read_prompts(files["prompts"], None)]
    inputs = {k: files[k] for k in ("prompts", "target", "drafter")}
    with pytest.raises(SpecFitError, match=rf"the tuning questions hold questions the tree will decode \({ids[0]}\)"):
        tune.run({"streams": {"4": stream("eagle3-tuned")}, "trees": TREES[:1], "decodes": ids[:1]}, inputs,
                 {"grid": tmp_path / "grid.json"})
    twice = []
    for f in range(2):
        twice.append(tmp_path / f"fold{f}.json")
        twice[-1].write_text(json.dumps({"chosen": TREES[0], "decodes": ids[:1]}))
    with pytest.raises(SpecFitError, match=f"question {ids[0]} is decoded by two folds' trees"):
        build_method({"name": "eagle3-tuned"}, {"tune": [str(p) for p in twice]})
