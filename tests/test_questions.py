"""Workload questions read with Hugging Face datasets, offline: Spec-Bench's question.jsonl by default, any local
file or folder or locally cached Hub dataset with a field mapping, and clear errors naming the config key."""

import copy
import json
import socket

import datasets
import huggingface_hub.constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from specfit.errors import SpecFitError
from specfit.planning.config import validate_config
from specfit.planning.matrix import evaluated_question_ids
from specfit.questions import (
    SPEC_BENCH_CATEGORIES,
    category_ids,
    load_questions,
    load_source,
    workload_file,
    workload_source,
)

PAPER_IDS = set(range(242, 321, 2)) | set(range(401, 481))  # 40 even CNN/DailyMail articles, 80 GSM8K questions
MATH = [
    {"question": "Ann has 3 apples and buys 4 more. How many apples does she have?", "answer": "#### 7"},
    {"question": "A train runs 60 km in 1.5 hours. What is its speed in km/h?", "answer": "#### 40"},
    {"question": "Tom reads 12 pages a day. How many pages does he read in a week?", "answer": "#### 84"},
    {"question": "A box holds 6 eggs. How many boxes do 30 eggs fill?", "answer": "#### 5"},
    {"question": "Sara saves 5 dollars a week for 9 weeks. How much does she save?", "answer": "#### 45"},
]


@pytest.fixture(scope="module")
def config(root):
    return validate_config(yaml.safe_load((root / "config.yaml").read_text()),
                           root / "workflow/schemas/config.schema.yaml")


def source(**given):
    """A validated-looking source: the schema's defaults, then ``given`` (``fields`` merged)."""
    fields = {"id": "question_id", "prompt": "turns", "category": "category", **given.pop("fields", {})}
    return {"path": None, "hub": None, "name": None, "split": "train", **given, "fields": fields}


@pytest.fixture()
def math_jsonl(tmp_path):
    path = tmp_path / "gsm8k-test.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in MATH))
    return path


@pytest.fixture()
def offline_caches(tmp_path, monkeypatch):
    """Empty datasets and hub caches, and a record of every connection attempted (there must be none)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return {"hub": tmp_path / "hub-cache", "attempts": attempts}


def test_spec_bench_is_read_with_datasets_as_the_lines_say(questions_path):
    """The same questions, ids, categories and turns, in file order, as a reader of the JSON lines gets."""
    lines = [json.loads(line) for line in questions_path.read_text().splitlines() if line.strip()]
    assert load_questions(questions_path) == [
        {"question_id": q["question_id"], "category": q["category"], "turns": q["turns"]} for q in lines
    ]


def test_spec_bench_categories_are_the_files(questions_path):
    """The table a config's drafter categories are checked against at load (no file read then) is the file's."""
    seen: dict[str, list[int]] = {}
    for q in load_questions(questions_path):
        seen.setdefault(q["category"], []).append(q["question_id"])
    assert {c: list(category_ids(c)) for c in SPEC_BENCH_CATEGORIES} == seen


def test_spec_bench_default_source_reads_the_same_questions(questions_path, tmp_path):
    """Spec-Bench's file named as a workload's source, with Spec-Bench's fields, gives what load_questions gives."""
    copied = tmp_path / "question.jsonl"
    copied.write_bytes(questions_path.read_bytes())
    assert load_source(source(path=str(copied)), "spec") == load_questions(questions_path)


def test_a_malformed_spec_bench_line_is_named(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text('{"question_id": 1, "category": "x", "turns": ["a"]}\n\n{"question_id": 2, "turns": \n')
    with pytest.raises(SpecFitError, match=r"question\.jsonl:3 is not a Spec-Bench question \(JSONDecodeError"):
        load_questions(path)
    path.write_text('{"question_id": 1, "category": "x", "turns": ["a"]}\n{"question_id": 2, "category": "x"}\n')
    with pytest.raises(SpecFitError, match=r"question\.jsonl:2 is not a Spec-Bench question \(KeyError: 'turns'"):
        load_questions(path)


def test_a_local_jsonl_with_a_field_mapping(math_jsonl):
    """GSM8K's own fields: no id (rows are numbered by position), the prompt in `question`, no category."""
    questions = load_source(source(path=str(math_jsonl), split="test",
                                   fields={"id": None, "prompt": "question", "category": None}), "gsm8k-full")
    assert [q["question_id"] for q in questions] == [0, 1, 2, 3, 4]
    assert [q["turns"] for q in questions] == [[row["question"]] for row in MATH]
    assert {q["category"] for q in questions} == {"gsm8k-full"}


def test_a_saved_dataset_folder_and_its_split(tmp_path):
    saved = tmp_path / "saved"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"qid": 1, "text": "train question", "kind": "k"}]),
        "test": datasets.Dataset.from_list([{"qid": 7, "text": "test question", "kind": "k"}]),
    }).save_to_disk(str(saved))
    fields = {"id": "qid", "prompt": "text", "category": "kind"}
    assert load_source(source(path=str(saved), split="test", fields=fields), "w") == [
        {"question_id": 7, "category": "k", "turns": ["test question"]}
    ]
    with pytest.raises(SpecFitError, match=r"workloads\.w\.source: .*saved has no split 'validation'; its splits: "
                                           r"train, test"):
        load_source(source(path=str(saved), split="validation", fields=fields), "w")


def test_a_missing_field_names_it_and_the_fields_there_are(math_jsonl):
    with pytest.raises(SpecFitError, match=r"workloads\.gsm8k-full\.source\.fields\.prompt: local dataset "
                                           r".*gsm8k-test\.jsonl \(split 'test'\) has no field 'problem'; "
                                           r"its fields: question, answer"):
        load_source(source(path=str(math_jsonl), split="test", fields={"id": None, "prompt": "problem"}),
                    "gsm8k-full")
    with pytest.raises(SpecFitError, match=r"source\.fields\.id: .* has no field 'question_id'; its fields: "
                                           r"question, answer"):
        load_source(source(path=str(math_jsonl), fields={"prompt": "question", "category": None}), "gsm8k-full")


def test_ids_must_be_unique_integers(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a1", "q": "x"}, {"id": "a2", "q": "y"}]), path)
    with pytest.raises(SpecFitError, match=r"source\.fields\.id: row 0 .* has id 'a1' in field 'id'; ids must be "
                                           r"integers \(set fields\.id to null"):
        load_source(source(path=str(path), fields={"id": "id", "prompt": "q", "category": None}), "w")
    pq.write_table(pa.Table.from_pylist([{"id": 3, "q": "x"}, {"id": 3, "q": "y"}]), path)
    with pytest.raises(SpecFitError, match=r"ids \[3\] occur more than once"):
        load_source(source(path=str(path), fields={"id": "id", "prompt": "q", "category": None}), "w")


def test_a_missing_local_dataset_is_named(tmp_path):
    with pytest.raises(SpecFitError, match=r"workloads\.w\.source\.path: no dataset at .*nowhere\.jsonl"):
        load_source(source(path=str(tmp_path / "nowhere.jsonl")), "w")
    odd = tmp_path / "rows.txt"
    odd.write_text("x\n")
    with pytest.raises(SpecFitError, match=r"workloads\.w\.source: .*rows\.txt is not a data file"):
        load_source(source(path=str(odd)), "w")


def test_a_hub_dataset_not_cached_is_not_available_offline(offline_caches):
    """Not in the local caches: a clear error naming the workload's key, and no connection attempted."""
    hub = source(hub="openai/gsm8k", name="main", split="test", fields={"id": None, "prompt": "question"})
    with pytest.raises(SpecFitError, match=r"workloads\.gsm8k-full\.source\.hub: Hub dataset 'openai/gsm8k' is not "
                                           r"available offline.*never downloads"):
        load_source(hub, "gsm8k-full")
    assert offline_caches["attempts"] == []


def test_a_hub_dataset_in_the_hub_cache_is_read_offline(offline_caches):
    """A snapshot of the dataset's repository in the hub cache (as `hf download` leaves it) is read, offline."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = offline_caches["hub"] / "datasets--specfit--tiny-math"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in MATH[:2]))
    (snapshot / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in MATH[2:]))
    hub = source(hub="specfit/tiny-math", split="test", fields={"id": None, "prompt": "question", "category": None})
    assert [q["turns"][0] for q in load_source(hub, "w")] == [MATH[0]["question"], MATH[1]["question"]]
    assert offline_caches["attempts"] == []


def test_the_offline_flags_are_restored(offline_caches):
    before = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
    with pytest.raises(SpecFitError):
        load_source(source(hub="specfit/not-cached-anywhere"), "w")
    assert (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE) == before


# --------------------------------------------------------------------------------------------- the config
def with_workload(config, name, **entry):
    config = copy.deepcopy(config)
    config["workloads"][name] = {"question_ids": {"start": 0, "stop": 1318}, "limit_tokens": 512, **entry}
    return config


def test_the_shipped_workloads_read_spec_bench(config):
    for name in config["workloads"]:
        assert workload_source(config, name) is None
        assert workload_file(config, name) == config["spec_bench"]["path"]
    assert workload_file(config, "calibration") == config["spec_bench"]["path"]


def test_only_spec_bench_workloads_count_as_evaluated_questions(config, root):
    """A workload over another dataset evaluates none of Spec-Bench's questions: its ids (positions 0..1318 of
    GSM8K's test set here) leave the toy's training text as it was; one over Spec-Bench's own file moves its ids."""
    schema = root / "workflow/schemas/config.schema.yaml"
    assert set(evaluated_question_ids(config)) == PAPER_IDS
    local = with_workload(config, "gsm8k-full", source={"path": "data/gsm8k/test.jsonl", "split": "test",
                                                        "fields": {"id": None, "prompt": "question"}})
    hub = with_workload(config, "gsm8k-hub", source={"hub": "openai/gsm8k", "name": "main", "split": "test"})
    for other in (local, hub):
        assert set(evaluated_question_ids(validate_config(other, schema))) == PAPER_IDS
    spec_bench = with_workload(config, "writing", question_ids={"start": 81, "stop": 90},
                               source={"path": config["spec_bench"]["path"]})
    with pytest.raises(SpecFitError, match=r"'toy\.drafter\.categories' names 'writing', a workload"):
        validate_config(copy.deepcopy(spec_bench), schema)  # the drafter's chat, until it leaves the category out
    spec_bench["toy"]["drafter"]["categories"].remove("writing")
    assert set(evaluated_question_ids(validate_config(spec_bench, schema))) == PAPER_IDS | set(range(81, 91))
    assert workload_source(validate_config(local, schema), "gsm8k-full") == {
        "path": "data/gsm8k/test.jsonl", "hub": None, "name": None, "split": "test",
        "fields": {"id": None, "prompt": "question", "category": "category"},
    }
    assert workload_file(validate_config(hub, schema), "gsm8k-hub") is None


def test_the_schema_checks_a_source(config, root):
    schema = root / "workflow/schemas/config.schema.yaml"
    both = with_workload(config, "x", source={"path": "a.jsonl", "hub": "openai/gsm8k"})
    with pytest.raises(SpecFitError, match=r"config key 'workloads\.x\.source'.*Set `path` or `hub`, not both"):
        validate_config(both, schema)
    typo = with_workload(config, "x", source={"path": "a.jsonl", "fields": {"text": "question"}})
    with pytest.raises(SpecFitError, match=r"'workloads\.x\.source\.fields\.text' is not allowed here; allowed keys "
                                           r"under workloads\.x\.source\.fields: category, id, prompt"):
        validate_config(typo, schema)
