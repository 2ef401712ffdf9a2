"""The toy's training is budgeted in steps and seeded: same seed and config, same weights (sha256 recorded)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from specfit import numerics
from specfit.errors import SpecFitError
from specfit.questions import load_questions, training_questions
from specfit.stages import toy_drafter, toy_target
from specfit.toy import train as toy_train
from specfit.toy.spec import toy_spec
from specfit.toy.tokenizer import train_tokenizer
from specfit.toy.train import SENTENCE_END, lead, span_conversations, split, state_digest, train_loop

# overrides of the schema's defaults (specfit.toy.toy_spec fills the rest)
TINY_TARGET = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "num_experts": 4, "top_k": 2,
               "moe_intermediate_size": 16, "seq_len": 128, "batch_size": 1, "lr": 0.004, "steps": 4,
               "span_conversations": 40, "max_minutes": None, "seed": 0}
TINY_DRAFTER = {"steps": 3, "max_minutes": None, "seed": 0, "intermediate_size": 32, "draft_vocab_size": 256,
                "distill_prompts": 4, "distill_new_tokens": 4, "distill_max_prompt": 256, "seq_len": 128,
                "acceptance_prompts": 1, "acceptance_new_tokens": 4}


@pytest.fixture(scope="module")
def tokenizer_dir(questions_path, tmp_path_factory):
    train, _ = split(questions_path, toy_spec("tokenizer"))
    path = tmp_path_factory.mktemp("tok") / "tokenizer"
    train_tokenizer([t for q in train for t in q["turns"]], 300).save_pretrained(path)
    return path


def train_target(questions_path, tokenizer_dir, out, **overrides):
    toy_target.run(toy_spec("target", **TINY_TARGET | overrides),
                   {"questions": questions_path, "tokenizer": tokenizer_dir}, {"target": out})
    return json.loads((out / "training.json").read_text())


def test_same_seed_same_weights_and_digest(questions_path, tokenizer_dir, tmp_path):
    a = train_target(questions_path, tokenizer_dir, tmp_path / "a")
    b = train_target(questions_path, tokenizer_dir, tmp_path / "b")
    c = train_target(questions_path, tokenizer_dir, tmp_path / "c", seed=1)
    assert a["steps"] == b["steps"] == 4 and a["tokens"] == 4 * 128
    assert a["sha256"] == b["sha256"] != c["sha256"]
    assert a["loss"] == b["loss"] and a["heldout_loss"] == b["heldout_loss"]
    assert {"seconds", "threads", "heldout_reply_loss"} <= set(a)
    # the digest is of the saved weights, not of something else
    from transformers import AutoModelForCausalLM

    assert state_digest(AutoModelForCausalLM.from_pretrained(tmp_path / "a")) == a["sha256"]
    wa, wb = load_file(tmp_path / "a/model.safetensors"), load_file(tmp_path / "b/model.safetensors")
    assert all((wa[k] == wb[k]).all() for k in wa)


def test_training_runs_on_the_specs_threads_not_the_jobs(questions_path, tokenizer_dir, tmp_path):
    """The toy trains on the spec's torch threads (``train_threads``) whatever the process had (Snakemake's
    OMP_NUM_THREADS gives a job 1 under ``--cores 1``): the weights depend on the count, so it is the config's."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        two = train_target(questions_path, tokenizer_dir, tmp_path / "two", threads=2)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(3)
        one = train_target(questions_path, tokenizer_dir, tmp_path / "one", threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert (two["threads"], one["threads"]) == (2, 1)
    assert two["numerics"] == numerics.described()  # what the weights were computed with: this process's kernels


def fresh(code: str, *args: str, **env: str) -> str:
    """What ``code`` prints in a new Python process whose environment sets none of `numerics.PINNED` but ``env``."""
    clean = {k: v for k, v in os.environ.items() if k not in numerics.PINNED}
    return subprocess.run([sys.executable, "-c", code, *args], env=clean | env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_cpu_kernels_are_pinned_before_torch_computes():
    """`specfit.numerics`: importing specfit pins torch's kernel dispatch (and MKL's branch) unless the
    environment already sets them."""
    code = "import specfit, torch; print(torch.backends.cpu.get_cpu_capability())"
    assert fresh(code, ATEN_CPU_CAPABILITY="default") == "DEFAULT"
    if numerics.pinnable():
        assert fresh(code) == "AVX2"


def test_timing_stages_switch_mkl_to_its_auto_branch_and_training_stages_keep_the_pin():
    """`specfit.planning.stage.stage_main`: a stage that trains keeps the training pin (MKL's compatible branch);
    any other switches to MKL's AUTO branch before it computes (`numerics.for_timing`). A value the user set stays."""
    code = ("import os, sys, specfit\n"
            "from specfit.planning.stage import stage_main\n"
            "def run(spec, inputs, outputs): print(os.environ.get('MKL_CBWR'))\n"
            "stage_main(run, trains=sys.argv[1] == 'train')([])\n")
    if numerics.pinnable():
        assert (fresh(code, "train"), fresh(code, "time")) == (numerics.PINNED["MKL_CBWR"], numerics.TIMING_MKL_CBWR)
    assert fresh(code, "train", MKL_CBWR="AVX2") == fresh(code, "time", MKL_CBWR="AVX2") == "AVX2"


@pytest.mark.skipif(not torch.backends.mkl.is_available() or not numerics.pinnable(), reason="no MKL to pin")
def test_a_timing_stage_computes_with_mkls_auto_branch_though_specfit_pinned_another_at_import():
    """What `numerics.for_timing` relies on: MKL reads ``MKL_CBWR`` at its first call, so switching it after a
    decode stage's imports, before its first GEMM, is the branch MKL computes with (the pinned compatible branch and
    AUTO round differently, so the test tells them apart)."""
    code = ("import hashlib, sys\n"
            "import specfit.stages.decode, torch\n"
            "from specfit import numerics\n"
            "if sys.argv[1] == 'timing': numerics.for_timing()\n"
            "torch.set_num_threads(1)\n"
            "g = torch.Generator().manual_seed(0)\n"
            "a, b = torch.randn(512, 128, generator=g), torch.randn(128, 384, generator=g)\n"
            "print(hashlib.sha256((a @ b).numpy().tobytes()).hexdigest())\n")
    auto = fresh(code, "pinned", MKL_CBWR=numerics.TIMING_MKL_CBWR)
    assert fresh(code, "pinned") != auto  # the training pin rounds otherwise, so the next line can fail
    assert fresh(code, "timing") == auto


def test_drafter_same_seed_same_weights(questions_path, tokenizer_dir, tmp_path):
    train_target(questions_path, tokenizer_dir, tmp_path / "target")
    digests = []
    for name in ("a", "b"):
        toy_drafter.run(toy_spec("drafter", **TINY_DRAFTER),
                        {"questions": questions_path, "target": tmp_path / "target"}, {"drafter": tmp_path / name})
        stats = json.loads((tmp_path / name / "acceptance.json").read_text())
        assert stats["steps"] == 3 and stats["tokens"] > 0 and 0 <= stats["top1_agreement"] <= 1
        data = stats["data"]  # chat: the categories no workload evaluates, summarization's not among them
        assert "summarization" not in data["categories"] and "math_reasoning" not in data["categories"]
        assert 0 < data["pieces"] <= TINY_DRAFTER["distill_prompts"] and 0 < data["draft_vocab_coverage"] <= 1
        assert data["reply_tokens"] <= data["pieces"] * TINY_DRAFTER["distill_new_tokens"]
        digests.append(stats["sha256"])
    assert digests[0] == digests[1]


def test_a_budget_that_cannot_fit_stops_before_training(questions_path, tokenizer_dir, tmp_path):
    with pytest.raises(SpecFitError, match=r"toy\.target\.max_minutes.*toy\.target\.steps"):
        train_target(questions_path, tokenizer_dir, tmp_path / "t", steps=10**7, max_minutes=1)
    assert not (tmp_path / "t").exists()


def test_the_rate_of_a_tenth_of_the_run_stops_what_the_first_steps_did_not(monkeypatch):
    """Steps of 1 s for the first 50 and 3 s after (the drafter's windows differ as much): the first three predict
    16.7 min and pass, the first tenth (the 100 after the first, 50 x 1 s + 50 x 3 s) predicts 33.3 min and stops
    there."""
    clock, calls = [0.0], []
    monkeypatch.setattr(toy_train.time, "perf_counter", lambda: clock[0])

    def step(i, progress):
        calls.append(i)
        clock[0] += 1.0 if i <= 50 else 3.0
        return {}

    with pytest.raises(SpecFitError, match=r"about 33\.3 min .*\(2\.00 s per step\), over `toy\.drafter\.max_minutes`"):
        train_loop(step, 1000, "toy drafter", max_minutes=30, key="toy.drafter")
    assert len(calls) == 101  # the first step, then a tenth of the run
    clock[0], calls[:] = 0.0, []
    assert train_loop(step, 1000, "toy drafter", max_minutes=34)["steps"] == 1000
    assert len(calls) == 1000


def test_span_conversations_copy_the_lead_of_training_text_only(questions_path):
    spec = toy_spec("target")
    exclude = set(spec["exclude_question_ids"])
    train = training_questions(load_questions(questions_path), exclude)
    chats = span_conversations(train, 200, 3, spec["span_max_words"])
    assert chats == span_conversations(train, 200, 3, spec["span_max_words"])
    assert chats != span_conversations(train, 200, 4, spec["span_max_words"])
    corpus = " ".join(" ".join(t.split()) for q in train for t in q["turns"])
    evaluated = [q for q in load_questions(questions_path) if q["question_id"] in exclude]
    assert len(evaluated) == len(exclude) == 120
    for user, assistant in chats:
        text = user["content"].removeprefix("Summarize: ")
        assert assistant["content"] == lead(text)
        assert len(SENTENCE_END.split(assistant["content"])) <= 3
        assert text[:200] in corpus  # a span of the training text
    # none of the spans comes from an evaluated question's text alone
    probes = [" ".join(q["turns"][0].split()[:30]) for q in evaluated]
    assert not any(p in " ".join(u["content"] for u, _ in chats) for p in probes if len(p) > 100)
