"""Dataset extraction: the paper's two workloads, first-turn prompts in the chat template, skips reported."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from specfit import workflow
from specfit.errors import SpecFitError
from specfit.extract import build_prompts
from specfit.questions import load_questions, training_questions
from specfit.toy.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def config(root):
    return workflow.validate_config(yaml.safe_load((root / "config.yaml").read_text()),
                                    root / "workflow/schemas/config.schema.yaml")


@pytest.fixture(scope="module")
def questions(questions_path):
    return load_questions(questions_path)


@pytest.fixture(scope="module")
def tokenizer(questions, config):
    texts = [t for q in training_questions(questions, workflow.evaluated_question_ids(config)) for t in q["turns"]]
    return train_tokenizer(texts, vocab_size=1024)


@pytest.fixture(scope="module")
def workload_ids(config):
    """The ids config.yaml's workload ``name`` evaluates."""
    return lambda name: workflow.workload_ids(config, name)


def test_summarization_is_the_40_even_articles(questions, workload_ids):
    ids = workload_ids("summarization")
    assert ids == list(range(242, 321, 2)) and len(ids) == 40
    by_id = {q["question_id"]: q for q in questions}
    assert {by_id[i]["category"] for i in ids} == {"summarization"}
    assert all(by_id[i]["turns"][0].startswith("Summarize") for i in ids)


def test_gsm8k_is_questions_401_to_480(questions, workload_ids):
    ids = workload_ids("gsm8k")
    assert ids == list(range(401, 481)) and len(ids) == 80
    assert {q["category"] for q in questions if q["question_id"] in ids} == {"math_reasoning"}


def test_prompts_are_first_turns_in_the_chat_template(questions, tokenizer, workload_ids):
    spec = {"question_ids": workload_ids("gsm8k"), "limit_tokens": 100_000, "max_requests": None}
    rows, skipped = build_prompts(questions, tokenizer, spec)
    assert skipped == []
    assert rows["request_id"] == list(range(80))
    assert rows["question_id"] == list(range(401, 481))
    first = next(q for q in questions if q["question_id"] == 401)
    assert rows["prompt"][0] == f"<|user|>{first['turns'][0]}<|end|><|assistant|>"
    assert rows["prompt_ids"][0] == tokenizer(rows["prompt"][0], add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(rows["prompt_ids"][0]) == rows["prompt"][0]


def test_too_long_prompts_are_reported_and_skipped_not_cut(questions, tokenizer, workload_ids):
    spec = {"question_ids": workload_ids("summarization"), "limit_tokens": 400, "max_requests": None}
    rows, skipped = build_prompts(questions, tokenizer, spec)
    assert skipped and len(rows["request_id"]) + len(skipped) == 40
    assert all(s["n_prompt"] >= 400 for s in skipped)
    assert all(n < 400 for n in rows["n_prompt"])
    kept = dict(zip(rows["question_id"], rows["request_id"]))
    assert all(kept[qid] == (qid - 242) // 2 for qid in kept)  # request ids keep their workload positions


def test_subset_takes_the_first_requests(questions, tokenizer, workload_ids):
    spec = {"question_ids": workload_ids("gsm8k"), "limit_tokens": 512, "max_requests": 4}
    rows, _ = build_prompts(questions, tokenizer, spec)
    assert rows["question_id"] == [401, 402, 403, 404]


def test_unknown_question_id_is_a_clear_error(questions, tokenizer):
    with pytest.raises(SpecFitError, match=r"question ids \[9999\] are not in question.jsonl"):
        build_prompts(questions, tokenizer, {"question_ids": [401, 9999], "limit_tokens": 512})


def test_stage_writes_parquet(questions_path, tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "tok")
    out = tmp_path / "p.parquet"
    spec = {"question_ids": [401, 402], "limit_tokens": 512, "max_requests": None}
    subprocess.run(
        [sys.executable, "-m", "specfit.extract", "--spec", json.dumps(spec), "--in", f"questions={questions_path}",
         "--in", f"tokenizer={tmp_path / 'tok'}", "--out", f"prompts={out}"],
        check=True, capture_output=True, timeout=120,
    )
    table = pq.read_table(out)
    assert table.column_names == ["request_id", "question_id", "category", "prompt", "prompt_ids", "n_prompt"]
    assert table.schema.field("prompt_ids").type.value_type == pa.int64()
    assert table.column("question_id").to_pylist() == [401, 402]
    assert json.loads(table.schema.metadata[b"skipped"]) == []
    assert not list(tmp_path.glob(".tmp-*"))


def test_missing_question_file_says_where_to_put_it(tmp_path):
    with pytest.raises(SpecFitError, match="no Spec-Bench questions at .*spec_bench.path"):
        load_questions(tmp_path / "question.jsonl")
