"""`specfit generate` on the Qwen3-30B-A3B fakes, as a user runs it from a workflow root with
config.qwen3-30b-a3b.yaml: every deployable method prints AR's output, the text streams as --json
records it, and bad input is one line and exit status 2."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest
import torch
import yaml
from compat_fakes import COEFFICIENTS, DEVICE, MODEL, NEW, QUESTIONS, ROOT

from specfit import cli
from specfit.planning import paths
from specfit.planning.config import SCHEMA
from specfit.stages import predictor

PROMPT = QUESTIONS[1]["turns"][0]  # a prompt the fake drafter was taught the answer of: drafts are accepted
DEPLOYABLE = [["--method", "ar"], ["--method", "eagle3"], ["--method", "specfit-learned"],
              ["--method", "specfit-ca", "--routes", "learned"]]


@pytest.fixture(scope="module")
def workflow(target_dir, drafter_dir, prompt_files, tmp_path_factory):
    """A workflow root: the repository's config and schema, the model's overlay and one of this checkout's naming
    the fakes, and what the workflow would have made: the a100 calibration and the route predictor."""
    root = tmp_path_factory.mktemp("workflow")
    (root / "workflow/schemas").mkdir(parents=True)
    (root / SCHEMA).write_text((ROOT / SCHEMA).read_text())
    (root / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    (root / "here.yaml").write_text(yaml.safe_dump({
        "models": {MODEL: {"target": str(target_dir), "drafter": str(drafter_dir)}},
        "devices": {"a100": {"torch_device": DEVICE}, "rtx4090": {"torch_device": DEVICE}},
    }))
    calibration = root / paths.calibration(MODEL, "a100", "cache")
    calibration.parent.mkdir(parents=True)
    calibration.write_text(json.dumps(COEFFICIENTS))
    predictor.run({"model": MODEL, "dtype": "bfloat16", "logits_dtype": "model", "verify": "exact",
    "torch_device": DEVICE,
                   "limit_tokens": 96, "max_new_tokens": NEW, "k_max": 7, "max_depth": 5, "top_k_expand": 2,
                   "validation_requests": 1, "steps": 30, "batch_size": 64, "lr": 0.003, "seed": 0, "threads": 1},
                  {"prompts": prompt_files["prompts"], "target": target_dir, "drafter": drafter_dir},
                  {"predictor": root / paths.predictor(MODEL)})
    return root


def generate(workflow, monkeypatch, capsys, *args, stdin: str | None = None):
    """``specfit generate`` in the workflow root: (exit status, stdout, stderr)."""
    monkeypatch.chdir(workflow)
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    argv = ["generate", "--configfile", str(ROOT / "config.qwen3-30b-a3b.yaml"), "--configfile", "here.yaml",
            "--slots", "4", "--max-new-tokens", str(NEW), *args]
    threads = torch.get_num_threads()
    try:
        cli.main(argv)
        status = 0
    except SystemExit as exit:
        status = exit.code
    finally:
        torch.set_num_threads(threads)  # the CLI sets 1 (--threads) for the whole process
    out, err = capsys.readouterr()
    return status, out, err


def test_every_deployable_method_prints_ars_output(workflow, monkeypatch, capsys):
    records = {}
    for method in DEPLOYABLE:
        compare = ["--compare", "ar"] if method[1] == "specfit-ca" else []  # AR on the same target, within the run
        status, out, _ = generate(workflow, monkeypatch, capsys, "--model", MODEL, "--device", "a100", *method,
                                  "--json", *compare, PROMPT)
        assert status == 0
        records[method[1]] = record = json.loads(out)
        assert record["model"] == MODEL and record["device"] == "a100" and record["slots"] == 4
        assert record["n_output_tokens"] == len(record["output_ids"]) > 1
    assert records["specfit-ca"]["compare"]["identical"] and records["specfit-ca"]["compare"]["speedup"] > 0
    ar = records["ar"]["output_ids"]
    assert all(r["output_ids"] == ar for r in records.values())
    assert records["eagle3"]["committed_per_cycle"] > 1  # drafts were accepted: trees were committed
    assert records["ar"]["draft_nodes_per_cycle"] == 0


def test_the_streamed_text_is_the_records_and_the_summary_goes_to_stderr(workflow, monkeypatch, capsys):
    args = ("--model", MODEL, "--device", "a100", "--method", "specfit-learned")
    _, out, _ = generate(workflow, monkeypatch, capsys, *args, "--json", PROMPT)
    record = json.loads(out)
    status, out, err = generate(workflow, monkeypatch, capsys, *args, stdin=PROMPT + "\n")
    assert status == 0 and out == record["text"] + "\n"
    assert err.startswith(f"specfit-learned (learned routes) on {MODEL}, a100 (4 slots): {record['n_output_tokens']} "
                          "tokens, ")
    assert "committed tokens" in err and "expert copies per token" in err


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (["--model", "llama", "--device", "a100", "--method", "ar", PROMPT], None, "unknown model 'llama': the config "
     f"defines toy, {MODEL}"),
    (["--model", MODEL, "--device", "h100", "--method", "ar", PROMPT], None, "unknown device 'h100'"),
    (["--model", MODEL, "--device", "a100", PROMPT], None, r"no method given: pass --method \(the config's "
     r"deployable methods are ar, eagle3, specfit-learned, [^)]*\)$"),
    (["--model", MODEL, "--device", "a100", "--method", "specfit", PROMPT], None, "reads its expert routes from an "
     "atlas .* experiment oracle"),
    (["--model", MODEL, "--device", "rtx4090", "--method", "specfit-learned", PROMPT], None,
     f"no calibration of {MODEL} on rtx4090 at .*`snakemake --cores 1 data/calibration/{MODEL}/rtx4090/cache.json`"),
    (["--model", MODEL, "--device", "a100", "--method", "ar"], "", "no prompt: give it as an argument or on stdin"),
    (["--model", MODEL, "--device", "a100", "--method", "ar", "--threads", "0", PROMPT], None,
     "--threads must be at least 1, got 0"),
    (["--model", MODEL, "--device", "a100", "--method", "ar", "x" * 600], None, "the prompt is 6.. tokens, and "
     f"{MODEL} takes at most 512 tokens"),
])
def test_bad_input_is_one_line_and_exit_status_2(args, stdin, message, workflow, monkeypatch, capsys):
    status, out, err = generate(workflow, monkeypatch, capsys, *args, stdin=stdin)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert re.search(message, err), err
