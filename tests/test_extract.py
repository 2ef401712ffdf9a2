"""Dataset extraction: the paper's two workloads, first-turn prompts in the chat template, skips reported; workloads
from other datasets (a local file with a field mapping and an id range, a Hub dataset) and their rule wiring."""

import json
import shlex
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from specfit.errors import SpecFitError
from specfit.planning import config as planning_config
from specfit.planning import matrix
from specfit.questions import load_questions, training_questions
from specfit.stages.extract import build_prompts, load_workload, run
from specfit.toy.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def config(root):
    return planning_config.validate_config(yaml.safe_load((root / "config.yaml").read_text()),
                                    root / "workflow/schemas/config.schema.yaml")


@pytest.fixture(scope="module")
def questions(questions_path):
    return load_questions(questions_path)


@pytest.fixture(scope="module")
def tokenizer(questions, config):
    texts = [t for q in training_questions(questions, matrix.evaluated_question_ids(config)) for t in q["turns"]]
    return train_tokenizer(texts, vocab_size=1024)


@pytest.fixture(scope="module")
def workload_ids(config):
    """The ids config.yaml's workload ``name`` evaluates."""
    return lambda name: matrix.workload_ids(config, name)


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
    spec = {"question_ids": workload_ids("summarization"), "limit_tokens": 1000, "max_requests": None}
    rows, skipped = build_prompts(questions, tokenizer, spec)
    assert skipped and rows["request_id"] and len(rows["request_id"]) + len(skipped) == 40
    assert all(s["n_prompt"] >= 1000 for s in skipped)
    assert all(n < 1000 for n in rows["n_prompt"])
    kept = dict(zip(rows["question_id"], rows["request_id"]))
    assert all(kept[qid] == (qid - 242) // 2 for qid in kept)  # request ids keep their workload positions


def test_a_workload_whose_every_prompt_is_too_long_is_refused_by_its_key(questions, tokenizer, workload_ids):
    """Nothing left to decode: refused at extraction, naming the limit and the shortest prompt, not later in theory."""
    spec = {"question_ids": workload_ids("summarization"), "limit_tokens": 200, "max_requests": None,
            "workload": "summarization"}
    with pytest.raises(SpecFitError, match=r"every one of the 40 questions has a prompt of at least limit_tokens = "
                                           r"200 tokens .*raise workloads.summarization.limit_tokens above \d+"):
        build_prompts(questions, tokenizer, spec)


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
    spec = {"model": "toy", "question_ids": [401, 402], "limit_tokens": 512, "max_requests": None}
    subprocess.run(
        [sys.executable, "-m", "specfit.stages.extract", "--spec", json.dumps(spec),
         "--in", f"questions={questions_path}", "--in", f"tokenizer={tmp_path / 'tok'}", "--out", f"prompts={out}"],
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


# --------------------------------------------------------------------------------------------- other datasets
MATH = [f"Question {i}: what is {i} plus {i}?" for i in range(8)]


def test_spec_bench_gives_the_prompts_it_gave_before(questions_path, tokenizer, workload_ids):
    """A workload without a source reads Spec-Bench: the prompts are those of its JSON lines read by hand."""
    by_hand = [json.loads(line) for line in questions_path.read_text().splitlines() if line.strip()]
    for name in ("gsm8k", "summarization"):
        spec = {"question_ids": workload_ids(name), "limit_tokens": 2048, "max_requests": None}
        questions = load_workload(spec, {"questions": questions_path})
        assert build_prompts(questions, tokenizer, spec) == build_prompts(by_hand, tokenizer, spec)


def test_a_local_jsonl_workload_with_a_field_mapping_and_an_id_range(tokenizer, tmp_path):
    """GSM8K's own layout (no id field: rows by position; the prompt in `question`), rows 2..5, through the stage."""
    data = tmp_path / "gsm8k-test.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "#### 0"}) + "\n" for q in MATH))
    tokenizer.save_pretrained(tmp_path / "tok")
    spec = {"model": "toy", "question_ids": [2, 3, 4, 5], "limit_tokens": 512, "max_requests": None,
            "workload": "gsm8k-full", "source": {"path": str(data), "hub": None, "name": None, "split": "test",
                       "fields": {"id": None, "prompt": "question", "category": None}}}
    out = tmp_path / "p.parquet"
    run(spec, {"questions": data, "tokenizer": tmp_path / "tok"}, {"prompts": out})
    table = pq.read_table(out).to_pydict()
    assert table["request_id"] == [0, 1, 2, 3]
    assert table["question_id"] == [2, 3, 4, 5]
    assert table["category"] == ["gsm8k-full"] * 4
    assert table["prompt"] == [f"<|user|>{q}<|end|><|assistant|>" for q in MATH[2:6]]
    assert table["prompt_ids"][0] == tokenizer(table["prompt"][0], add_special_tokens=False)["input_ids"]


def test_a_local_parquet_workload_with_its_own_ids(tokenizer, tmp_path):
    data = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(
        [{"idx": 100 + i, "turns": [q, "a second turn"], "topic": f"t{i % 2}"} for i, q in enumerate(MATH)]
    ), data)
    spec = {"model": "toy", "question_ids": [102, 104, 106], "limit_tokens": 512, "max_requests": 2, "workload": "mine",
            "source": {"path": str(data), "hub": None, "name": None, "split": "train",
                       "fields": {"id": "idx", "prompt": "turns", "category": "topic"}}}
    rows, skipped = build_prompts(load_workload(spec, {"questions": data}), tokenizer, spec)
    assert skipped == [] and rows["question_id"] == [102, 104] and rows["category"] == ["t0", "t0"]
    assert rows["prompt"] == [f"<|user|>{MATH[2]}<|end|><|assistant|>", f"<|user|>{MATH[4]}<|end|><|assistant|>"]
    spec["question_ids"] = [107, 108]
    with pytest.raises(SpecFitError, match=r"question ids \[108\] are not in the local dataset .*rows\.parquet "
                                           r"\(split 'train'\) \(its ids: field 'idx'\); check "
                                           r"workloads\.mine\.question_ids"):
        build_prompts(load_workload(spec, {"questions": data}), tokenizer, spec)


def test_a_hub_workload_not_cached_stops_the_stage_clearly(tokenizer, tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants

    tokenizer.save_pretrained(tmp_path / "tok")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    spec = {"model": "toy", "question_ids": [0, 1], "limit_tokens": 512, "max_requests": None, "workload": "gsm8k-full",
            "source": {"path": None, "hub": "openai/gsm8k", "name": "main", "split": "test",
                       "fields": {"id": None, "prompt": "question", "category": None}}}
    with pytest.raises(SpecFitError, match=r"workloads\.gsm8k-full\.source\.hub: Hub dataset 'openai/gsm8k' is "
                                           r"not available offline"):
        run(spec, {"tokenizer": tmp_path / "tok"}, {"prompts": tmp_path / "p.parquet"})
    assert not (tmp_path / "p.parquet").exists()


def test_the_extract_rule_declares_a_local_source_and_passes_its_spec(root, tmp_path):
    """A workload over a local file gets that file as the extract job's input (a rerun when it changes) and its
    source in the spec; a Hub workload has no questions input; Spec-Bench workloads keep their spec."""
    data = tmp_path / "gsm8k-test.jsonl"
    data.write_text(json.dumps({"question": MATH[0]}) + "\n")
    extra = tmp_path / "more.yaml"
    extra.write_text(yaml.safe_dump({"workloads": {
        "gsm8k-full": {"question_ids": {"start": 0, "stop": 1318}, "limit_tokens": 512,
                       "source": {"path": str(data), "split": "test", "fields": {"id": None, "prompt": "question"}}},
        "gsm8k-hub": {"question_ids": {"start": 0, "stop": 1}, "limit_tokens": 512,
                      "source": {"hub": "openai/gsm8k", "name": "main", "split": "test"}},
    }}))
    targets = [f"data/prompts/toy/{name}.parquet" for name in ("gsm8k-full", "gsm8k-hub", "gsm8k")]
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", *targets, "--configfile",
                           str(extra)], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    commands = {line.split("prompts=data/prompts/toy/")[1].split(".parquet")[0]: line
                for line in proc.stdout.splitlines() if "python -m specfit.launch extract --spec" in line}
    assert f"--in questions={data}" in commands["gsm8k-full"]
    assert "--in questions=" not in commands["gsm8k-hub"]
    assert "--in questions=data/raw/spec_bench/question.jsonl" in commands["gsm8k"]
    specs = {name: json.loads(shlex.split(line.split("Shell command: ")[-1])[5]) for name, line in commands.items()}
    assert specs["gsm8k-full"]["source"]["path"] == str(data) and specs["gsm8k-full"]["workload"] == "gsm8k-full"
    assert specs["gsm8k-hub"]["source"]["hub"] == "openai/gsm8k"
    assert set(specs["gsm8k"]) == {"model", "question_ids", "limit_tokens", "max_requests"}


def test_a_tokenizer_folder_without_tokenizer_files_is_refused_by_key(tmp_path):
    """transformers would hand back an empty tokenizer; the stage names the config key instead."""
    from specfit.errors import SpecFitError
    from specfit.stages.extract import run

    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "config.json").write_text("{}")
    spec = {"model": "qwen3-30b-a3b", "question_ids": [401], "limit_tokens": 512, "max_requests": None}
    with pytest.raises(SpecFitError, match=r"no tokenizer files in .*models\.qwen3-30b-a3b\.target"):
        run(spec, {"questions": tmp_path / "q.jsonl", "tokenizer": tmp_path / "tok"},
            {"prompts": tmp_path / "p.parquet"})
