"""The toy trains on what the config does not evaluate, and its every default lives in the config schema."""

import copy
import json
import re
import subprocess
import sys

import pytest
import yaml

from specfit.errors import SpecFitError
from specfit.planning.code import code_closure
from specfit.planning.config import validate_config
from specfit.planning.matrix import evaluated_question_ids
from specfit.questions import load_questions, training_questions
from specfit.stages import toy_drafter, toy_target, toy_tokenizer
from specfit.toy.spec import PARTS, toy_spec
from specfit.toy.train import split

STAGES = {"tokenizer": toy_tokenizer, "target": toy_target, "drafter": toy_drafter}
PAPER_IDS = set(range(242, 321, 2)) | set(range(401, 481))  # 40 even CNN/DailyMail articles, 80 GSM8K questions


@pytest.fixture()
def config(root):
    return yaml.safe_load((root / "config.yaml").read_text())


@pytest.fixture()
def schema(root):
    return yaml.safe_load((root / "workflow/schemas/config.schema.yaml").read_text())


@pytest.fixture(scope="module")
def questions(questions_path):
    return load_questions(questions_path)


def merged(config: dict, over: dict) -> dict:
    """``over`` merged into ``config`` as snakemake merges a second --configfile (nested dicts update)."""
    out = copy.deepcopy(config)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "runs":
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def test_shipped_configs_exclude_the_papers_ids(root, config):
    """config.yaml (and the smoke config over it) exclude exactly the paper's 120 evaluated questions, the
    calibration ids (401..403) among them: the toy trains on what it trained on before the ids came from the config."""
    smoke = merged(config, yaml.safe_load((root / "tests/smoke.yaml").read_text()))
    schema = root / "workflow/schemas/config.schema.yaml"
    for cfg in (config, smoke):
        assert set(evaluated_question_ids(validate_config(cfg, schema))) == PAPER_IDS
    for part in PARTS:
        assert set(toy_spec(part)["exclude_question_ids"]) == PAPER_IDS
        assert toy_spec(part, config)["exclude_question_ids"] == sorted(PAPER_IDS)


def test_a_new_workload_moves_its_ids_out_of_training(config, questions, questions_path):
    """A workload on the writing questions 81..90 takes them out of every toy stage's training questions."""
    writing = set(range(81, 91))
    before = toy_spec("target", config)
    pool = {q["question_id"] for q in training_questions(questions, before["exclude_question_ids"])}
    assert writing <= pool and not pool & PAPER_IDS

    config["workloads"]["writing"] = {"question_ids": {"start": 81, "stop": 90}, "limit_tokens": 512, "tune_folds": 2}
    config["runs"][0]["workloads"].append("writing")
    assert {q["category"] for q in questions if q["question_id"] in writing} == {"writing"}
    with pytest.raises(SpecFitError, match=r"'toy\.drafter\.categories' names 'writing', a workload"):
        toy_spec("drafter", config)  # the drafter's chat, until the config leaves the category out
    config["toy"]["drafter"]["categories"].remove("writing")
    for part in PARTS:
        spec = toy_spec(part, config)
        assert set(spec["exclude_question_ids"]) == PAPER_IDS | writing
        after = {q["question_id"] for q in training_questions(questions, spec["exclude_question_ids"])}
        assert after == pool - writing
        train, heldout = split(questions_path, spec)
        assert {q["question_id"] for q in train + heldout} == after and len(heldout) == spec["heldout"]


def test_calibration_ids_are_excluded_too(config):
    config["calibration"]["question_ids"] = [500, 501]
    with pytest.raises(SpecFitError, match=r"'toy\.drafter\.categories' names 'rag', which holds 2 evaluated "
                                           r"question\(s\) \(500, 501;"):
        toy_spec("tokenizer", config)  # probed by calibration, so out of the drafter's chat
    config["toy"]["drafter"]["categories"].remove("rag")
    assert set(toy_spec("tokenizer", config)["exclude_question_ids"]) == PAPER_IDS | {500, 501}


@pytest.mark.parametrize("part", PARTS)
def test_a_stage_refuses_a_spec_without_the_evaluated_ids(part, questions_path, tmp_path):
    spec = toy_spec(part)
    del spec["exclude_question_ids"]
    inputs = {"questions": questions_path, "tokenizer": tmp_path / "none", "target": tmp_path / "none"}
    refusal = r"no `exclude_question_ids`.*must not train on.*specfit\.toy\.spec\.toy_spec"
    with pytest.raises(SpecFitError, match=refusal):
        STAGES[part].run(spec, inputs, {part: tmp_path / part})
    assert not (tmp_path / part).exists()


def test_the_command_line_refuses_it_too(questions_path, tmp_path):
    spec = {k: v for k, v in toy_spec("tokenizer").items() if k != "exclude_question_ids"}
    proc = subprocess.run(
        [sys.executable, "-m", "specfit.stages.toy_tokenizer", "--spec", json.dumps(spec), "--in",
         f"questions={questions_path}", "--out", f"tokenizer={tmp_path / 'tok'}"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "error: the toy stage's spec has no `exclude_question_ids`" in proc.stderr
    assert not (tmp_path / "tok").exists()


def test_toy_spec_is_the_schema_defaults(schema):
    toy = schema["properties"]["toy"]["properties"]
    for part in PARTS:
        defaults = {k: v["default"] for k, v in toy[part]["properties"].items()}
        spec = toy_spec(part)
        threads = {} if part == "tokenizer" else {"threads": schema["properties"]["train_threads"]["default"]}
        assert spec == {**defaults, "seed": 0, **threads, "exclude_question_ids": sorted(PAPER_IDS)}
    assert toy_spec("target", hidden_size=64, seed=3)["hidden_size"] == 64
    assert toy_spec("target", seed=3)["seed"] == 3
    assert toy_spec("drafter", threads=1)["threads"] == 1


def test_toy_spec_checks_overrides_as_the_config_is_checked():
    with pytest.raises(SpecFitError, match=r"'toy\.target\.hidden_sise' is not allowed"):
        toy_spec("target", hidden_sise=64)
    with pytest.raises(SpecFitError, match=r"'toy\.drafter\.steps': 0 is less than the minimum"):
        toy_spec("drafter", steps=0)


def test_every_key_a_stage_reads_has_a_schema_default(root, schema):
    """The modules read ``spec["key"]`` only, and each such key is in the schema (with a default) or added by the
    rule (seed, threads, exclude_question_ids): no default lives in the code."""
    toy = schema["properties"]["toy"]["properties"]
    source = {part: (root / f"src/specfit/toy/{part}.py").read_text() + (root / f"src/specfit/stages/toy_{part}.py")
              .read_text() for part in PARTS}
    source["train"] = (root / "src/specfit/toy/train.py").read_text()
    assert not any("spec.get(" in text for name, text in source.items() if name != "train")
    assert source["train"].count("spec.get(") == 1  # the refusal of a spec without exclude_question_ids
    rule_keys = {"seed", "threads", "exclude_question_ids"}
    shared = set(re.findall(r'spec\["(\w+)"\]', source["train"]))  # split(): read by every stage
    for part in PARTS:
        read = set(re.findall(r'spec\["(\w+)"\]', source[part])) | shared
        assert all("default" in v for v in toy[part]["properties"].values())
        assert read - rule_keys <= set(toy[part]["properties"]), part
        assert read >= set(toy[part]["properties"]), f"toy.{part} keys no stage reads"


@pytest.mark.parametrize("part", PARTS)
def test_the_stages_code_hash_leaves_the_workflow_out(part):
    """toy_spec reads the schema through specfit.planning; no stage runs it, so edits there retrain no toy."""
    closure = code_closure(f"specfit.stages.toy_{part}")
    assert "specfit.toy" in closure and not {"specfit.planning", "specfit.toy.spec"} & set(closure)
