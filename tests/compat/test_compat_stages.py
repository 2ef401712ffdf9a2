"""The real-model path end to end on CPU: a per-expert, sharded, bf16 qwen3_moe target with a tokenizer and a
speculators EAGLE-3 drafter (reduced draft vocabulary, norm_before_residual) through the workflow's own stages:
extract -> calibrate -> atlas -> decode (ar, eagle3, specfit), every method lossless against AR.

bf16: the verification forward of a tree and AR's one-token forwards may round differently, so a method could
leave AR at a near-tie of the target's top-2 logits. metrics.json records the margin at each divergence; the
test allows a divergence only where that margin is within bf16 rounding of the logits, and says so.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from compat_fakes import (
    AUX,
    DEVICE,
    DRAFT_VOCAB,
    EOS,
    LIMIT,
    MODEL,
    NEW,
    build_drafter,
    build_target,
    per_expert_state,
    run_files,
    stream_spec,
)
from safetensors.torch import load_file

from specfit.models import Eagle3Drafter, load_drafter, load_target
from specfit.stages import atlas, calibrate, decode

BF16_TIE = 0.1  # logits of this fake are O(1): a bf16 near-tie is a top-2 margin within a few bf16 ulps


def assert_lossless(metrics: dict, n: int) -> None:
    lossless = metrics["lossless"]
    assert lossless["n_requests"] == n and lossless["missing"] == 0
    near_ties = [d for d in lossless["divergences"] if d["margin"] <= BF16_TIE]
    assert lossless["divergences"] == near_ties, f"a divergence from AR that is no bf16 near-tie: {lossless}"
    assert lossless["n_identical"] + len(near_ties) == n


def test_the_fake_is_laid_out_as_the_hub_checkpoint(target_dir, drafter_dir):
    index = json.loads((target_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert "model.layers.3.mlp.experts.7.gate_proj.weight" in index["weight_map"]
    assert not any("gate_up_proj" in k for k in index["weight_map"])
    config = json.loads((target_dir / "config.json").read_text())
    assert config["num_experts"] == 8 and "num_local_experts" not in config and config["torch_dtype"] == "bfloat16"
    tensors = load_file(target_dir / shards[0])
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    drafter = json.loads((drafter_dir / "config.json").read_text())
    assert drafter["speculators_model_type"] == "eagle3" and drafter["norm_before_residual"] is True
    assert drafter["draft_vocab_size"] == DRAFT_VOCAB < config["vocab_size"]
    assert {"d2t", "t2d", "embed_tokens.weight"} <= set(load_file(drafter_dir / "model.safetensors"))


def test_per_expert_shards_load_into_the_fused_experts(tmp_path):
    """transformers 5 fuses the hub's per-expert tensors on load: every expert lands where the model reads it."""
    written = build_target(tmp_path / "target", seed=3)
    model, tokenizer = load_target(tmp_path / "target", "bfloat16", key=f"models.{MODEL}.target")
    assert model.dtype == torch.bfloat16 and type(model).__name__ == "Qwen3MoeForCausalLM"
    loaded, expected = model.state_dict(), written.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)
    assert per_expert_state(model).keys() == per_expert_state(written).keys()
    assert tokenizer.eos_token_id == EOS and len(tokenizer) == 259 < model.config.vocab_size
    build_drafter(tmp_path / "drafter")
    drafter = load_drafter(tmp_path / "drafter", model, key=f"models.{MODEL}.drafter")
    assert isinstance(drafter, Eagle3Drafter) and drafter.fc.weight.dtype == torch.bfloat16
    assert drafter.aux_layer_ids == tuple(AUX) and drafter.norm_before_residual
    assert drafter.t2d.sum() == DRAFT_VOCAB and not drafter.embed_from_target


@pytest.fixture(scope="module")
def stages(target_dir, drafter_dir, prompt_files, ar_run, tmp_path_factory):
    """Every stage once, as the workflow runs them for models.qwen3-30b-a3b (extract: `prompt_files`)."""
    out = tmp_path_factory.mktemp("stages")
    prompts, calib = prompt_files["prompts"], prompt_files["calibration"]
    pair = {"target": target_dir, "drafter": drafter_dir}
    device = {"model": MODEL, "logits_dtype": "model", "verify": "exact",
    "dtype": "bfloat16", "torch_device": DEVICE, "max_inflight": 2,
              "link": None, "emulate": None, "slots": 4, "seed": 0,
              "protocol": {"cycle_boundaries": [0], "sizes": 3, "repeats": 1, "limit_tokens": LIMIT}}
    fitted = {"coefficients": out / "fit.json", "points": out / "fit.points.parquet"}
    calibrate.run(dict(device, coefficients="fit"), dict(pair, prompts=calib), fitted)
    # the paper's A100 coefficients (devices.coefficients: paper-a100): on a CPU the fit makes every draft node
    # cost more than it brings, so SpecFit verifies the root alone; with these it selects and commits trees
    paper = {"coefficients": out / "paper.json", "points": out / "paper.points.parquet"}
    calibrate.run(dict(device, coefficients="paper-a100"), dict(pair, prompts=calib), paper)
    runs = {"ar": ar_run}
    inputs = dict(pair, prompts=prompts, reference=runs["ar"]["requests"])
    runs["eagle3"] = run_files(out, "eagle3")
    decode.run(stream_spec("eagle3"), inputs, runs["eagle3"])
    for name, coefficients, method in (("fit", fitted, stream_spec("specfit", k_max=2)),  # b_0..b_2: 3 sizes
                                       ("paper", paper, stream_spec("specfit"))):
        ins = dict(inputs, coefficients=coefficients["coefficients"])
        runs[f"atlas-{name}"] = run_files(out, f"atlas-{name}", atlas=True)
        atlas.run(method, ins, runs[f"atlas-{name}"])
        runs[f"specfit-{name}"] = run_files(out, f"specfit-{name}")
        decode.run(method, dict(ins, atlas=runs[f"atlas-{name}"]["atlas"]), runs[f"specfit-{name}"])
    return {"prompts": prompts, "coefficients": fitted, "runs": runs}


def test_extract_renders_prompts_with_the_target_tokenizer(stages):
    rows = pq.read_table(stages["prompts"]).to_pylist()
    assert [r["question_id"] for r in rows] == [1, 2]
    assert all(r["prompt"].startswith("<|im_start|>user\n") and r["prompt_ids"][0] == 257 for r in rows)
    assert all(r["n_prompt"] == len(r["prompt_ids"]) < LIMIT for r in rows)


def test_calibration_fits_on_the_pair(stages):
    fit = json.loads(stages["coefficients"]["coefficients"].read_text())
    points = pq.read_table(stages["coefficients"]["points"]).to_pylist()
    assert fit["source"] == "fit" and len(fit["b"]) == 3 and fit["n_points"] == len(points) > 0
    assert {p["k"] for p in points} <= {0, 1, 2} and {p["question_id"] for p in points} == {3}


@pytest.mark.parametrize("method", ["eagle3", "atlas-fit", "specfit-fit", "atlas-paper", "specfit-paper"])
def test_every_method_is_lossless_against_ar(stages, method):
    metrics = json.loads(stages["runs"][method]["metrics"].read_text())
    assert metrics["n_output_tokens"] > 0 and metrics["h2d_per_token"] > 0
    if not method.endswith("-fit"):  # drafts are accepted: tree nodes are committed, not only roots
        assert metrics["accepted_per_cycle"] > 0
    assert_lossless(metrics, 2)


@pytest.mark.parametrize("name", ["fit", "paper"])
def test_the_atlas_covers_the_measured_specfit_run(stages, name):
    runs = stages["runs"]
    assert pq.read_table(runs[f"atlas-{name}"]["atlas"]).num_rows > 0
    metrics = json.loads(runs[f"specfit-{name}"]["metrics"].read_text())
    assert metrics["atlas_nodes"] > 0 and metrics["atlas_nodes_missed"] == 0
    ar = pq.read_table(runs["ar"]["requests"]).column("output_ids").to_pylist()
    assert all(len(ids) == NEW or ids[-1] == EOS for ids in ar)
