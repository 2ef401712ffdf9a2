"""Workload questions, read with Hugging Face ``datasets`` offline, and the split between the evaluated Spec-Bench
questions and the text the toy models train on.

A workload's questions come from Spec-Bench's question.jsonl (``spec_bench.path``, the default) or from the dataset
its ``source`` names: a local file or folder, or a Hub dataset already in the local Hugging Face cache. Either way
they become dicts with ``question_id``, ``category`` and ``turns`` (the user turns; the first is the prompt). Nothing
is ever downloaded here: the Hub is read with ``HF_DATASETS_OFFLINE=1`` semantics.

Which ids are evaluated is the config's business: the ids of every workload whose source is Spec-Bench and the
calibration ids (``specfit.planning.matrix.evaluated_question_ids``; with config.yaml, the paper's 40 even-numbered
CNN/DailyMail articles 242..320 and the 80 GSM8K questions 401..480). The toy rules pass them to their stages as
``exclude_question_ids``; everything else in Spec-Bench may train the toy tokenizer, target and drafter.

``datasets`` is imported only by the functions that read, so that importing this module (the Snakefile does,
through `specfit.planning`) stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from specfit.errors import SpecFitError

# The fields of Spec-Bench's question.jsonl: the default of `workloads.<name>.source.fields`.
SPEC_BENCH_FIELDS = {"id": "question_id", "prompt": "turns", "category": "category"}
SOURCE_DEFAULTS = {"path": None, "hub": None, "name": None, "split": "train"}
# Data files a local `source.path` may be, by suffix (each optionally compressed), and their datasets builder.
DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")


# --------------------------------------------------------------------------------------------- the config
def workload_source(config: dict, workload: str) -> dict | None:
    """``workloads.<workload>.source`` with its defaults filled, or None when the workload reads Spec-Bench's
    question.jsonl: neither ``path`` nor ``hub`` set, or ``path`` is the ``spec_bench.path`` file itself (then
    Spec-Bench's own fields are read and its question ids are evaluated ids, whatever ``fields`` says)."""
    given = config["workloads"][workload].get("source") or {}
    source = {**SOURCE_DEFAULTS, **given, "fields": {**SPEC_BENCH_FIELDS, **(given.get("fields") or {})}}
    if source["hub"] is None:
        spec_bench = config.get("spec_bench", {}).get("path", "data/raw/spec_bench/question.jsonl")
        if source["path"] is None or os.path.abspath(source["path"]) == os.path.abspath(spec_bench):
            return None
    return source


def workload_file(config: dict, workload: str) -> str | None:
    """The local file or folder the extract rule declares as a workload's questions (so an edit reruns it):
    Spec-Bench's question.jsonl (the spec_bench rule's output; also for the calibration prompts, ``workload`` =
    "calibration"), the source's ``path``, or None for a Hub dataset (read from the local cache)."""
    source = None if workload not in config["workloads"] else workload_source(config, workload)
    if source is None:
        return config["spec_bench"]["path"]
    return source["path"]


def describe_source(source: dict) -> str:
    """A source in words, for messages: "local dataset data/gsm8k.jsonl (split 'test')"."""
    what = f"local dataset {source['path']}" if source["path"] is not None else f"Hub dataset {source['hub']!r}"
    config = f"config {source['name']!r}, " if source.get("name") else ""
    return f"{what} ({config}split {source['split']!r})"


# --------------------------------------------------------------------------------------------- reading
@contextlib.contextmanager
def _offline_datasets():
    """``datasets`` as with HF_DATASETS_OFFLINE=1 (and HF_HUB_OFFLINE=1), whatever the environment says: no request
    ever leaves the machine, and a Hub dataset is read from the local cache or not at all. Progress bars off.
    The flags (which both libraries read at call time) are restored on exit, so the rest of the process keeps
    its own settings."""
    import datasets
    import huggingface_hub.constants as hub_constants

    flags = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
             (hub_constants, "HF_HUB_OFFLINE")]
    saved = [getattr(obj, name, None) for obj, name in flags]
    bars = datasets.is_progress_bar_enabled()
    for obj, name in flags:
        setattr(obj, name, True)
    datasets.disable_progress_bars()
    try:
        yield datasets
    finally:
        for (obj, name), value in zip(flags, saved):
            setattr(obj, name, value)
        if bars:
            datasets.enable_progress_bars()


def _builder(path: Path) -> str | None:
    """The ``datasets`` builder of a data file, by suffix (``.jsonl.gz`` is json); None if not a data file."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
    return DATA_FILE_BUILDERS.get(suffixes[-1]) if suffixes else None


def _load_local(datasets, path: Path, source: dict, cache_dir: str):
    """One split of a local file or folder. Data files and data folders are prepared in ``cache_dir`` (a temporary
    folder: no shared cache to go stale, nothing written under the user's home)."""
    split = source["split"]
    if path.is_file():
        builder = _builder(path)
        if builder is None:
            raise SpecFitError(
                f"{path} is not a data file this workflow reads: use one of "
                f"{', '.join(DATA_FILE_BUILDERS)} (optionally {', '.join(COMPRESSIONS)}) or a dataset folder"
            )
        # a single file is the split itself, whatever its name
        return datasets.load_dataset(builder, data_files={split: str(path)}, split=split, cache_dir=cache_dir)
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():  # Dataset(Dict).save_to_disk
        saved = datasets.load_from_disk(str(path))
        if isinstance(saved, datasets.DatasetDict):
            if split not in saved:
                raise SpecFitError(f"{path} has no split {split!r}; its splits: {', '.join(saved)}")
            return saved[split]
        return saved
    return datasets.load_dataset(str(path), source["name"], split=split, cache_dir=cache_dir)


def _load_hub(datasets, source: dict, key: str, cache_dir: str):
    """One split of a Hub dataset from the local cache: the ``datasets`` cache (HF_DATASETS_CACHE), else a snapshot
    of its repository in the hub cache (HF_HUB_CACHE, e.g. from ``hf download --repo-type dataset``)."""
    from huggingface_hub import constants as hub_constants
    from huggingface_hub import snapshot_download

    hub, name, split = source["hub"], source["name"], source["split"]
    try:
        return datasets.load_dataset(hub, name, split=split)
    except (OSError, datasets.exceptions.DatasetNotFoundError) as err:
        not_cached = err
    try:
        folder = snapshot_download(hub, repo_type="dataset", local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure here means: not in the hub cache
        raise SpecFitError(
            f"{key}.hub: Hub dataset {hub!r} is not available offline: it is in neither the datasets cache "
            f"({datasets.config.HF_DATASETS_CACHE}) nor the hub cache ({hub_constants.HF_HUB_CACHE}), and the "
            "workflow never downloads "
            f"({type(not_cached).__name__}: {not_cached}). Download it once where the network allows "
            f"(`hf download {hub} --repo-type dataset`, or datasets.load_dataset), or save it to a local file "
            f"and set {key}.path to it."
        ) from None
    return datasets.load_dataset(folder, name, split=split, cache_dir=cache_dir)


def _columns(dataset, fields: dict[str, str | None], key: str, where: str) -> dict[str, list]:
    """The mapped fields' columns by role (``id``, ``prompt``, ``category``; a role mapped to None is left out)."""
    have = list(dataset.column_names)
    for role, field in fields.items():
        if field is not None and field not in have:
            raise SpecFitError(
                f"{key}.fields.{role}: {where} has no field {field!r}; its fields: {', '.join(have) or '(none)'}"
            )
    wanted = {role: field for role, field in fields.items() if field is not None}
    table = dataset.select_columns(sorted(set(wanted.values()))).to_dict()
    return {role: table[field] for role, field in wanted.items()}


def _rows(columns: dict[str, list], n: int, fields: dict, key: str, where: str, category: str) -> list[dict]:
    """Questions (question_id, category, turns) from the columns; the first problem raises, naming its row."""
    ids = columns.get("id", range(n))
    categories = columns.get("category", [category] * n)
    questions = []
    for row, (qid, prompt, cat) in enumerate(zip(ids, columns["prompt"], categories)):
        if not isinstance(qid, int) or isinstance(qid, bool):
            raise SpecFitError(
                f"{key}.fields.id: row {row} of {where} has id {qid!r} in field {fields['id']!r}; ids must be "
                "integers (set fields.id to null to number the rows 0, 1, ... by position)"
            )
        turns = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise SpecFitError(
                f"{key}.fields.prompt: row {row} of {where} has {str(prompt)[:80]!r} in field {fields['prompt']!r}; "
                "a prompt is a string or a non-empty list of strings (turns, the first is the prompt)"
            )
        questions.append({"question_id": qid, "category": "" if cat is None else str(cat), "turns": turns})
    seen, repeated = set(), set()
    for q in questions:
        (repeated if q["question_id"] in seen else seen).add(q["question_id"])
    if repeated:
        raise SpecFitError(
            f"{key}.fields.id: ids {sorted(repeated)[:5]} occur more than once in field {fields['id']!r} of "
            f"{where}; map fields.id to a unique id field, or to null to number the rows by position"
        )
    return questions


def load_source(source: dict, workload: str, path: str | os.PathLike | None = None) -> list[dict]:
    """The questions of workload ``workload`` from its ``source`` (`workload_source`): dicts with question_id,
    category (the workload's name when ``fields.category`` is null) and turns, in dataset order.

    ``path`` is where the local dataset lies (the rule's input; by default ``source["path"]``). Every problem is a
    SpecFitError naming the config key: a missing file, a Hub dataset not in the local cache, a field the dataset
    lacks (with the fields it has), an id that is not an integer, a prompt that is not text."""
    key = f"workloads.{workload}.source"
    where = describe_source(source)
    fields = source["fields"]
    if "prompt" not in fields or fields["prompt"] is None:
        raise SpecFitError(f"{key}.fields.prompt: name the field that holds the prompt text")
    local = None if source["path"] is None and path is None else Path(path if path is not None else source["path"])
    if local is not None and not local.exists():
        raise SpecFitError(f"{key}.path: no dataset at {local} (a data file or a dataset folder)")
    with _offline_datasets() as datasets, tempfile.TemporaryDirectory(prefix="specfit-datasets-") as cache_dir:
        try:
            if local is not None:
                dataset = _load_local(datasets, local, source, cache_dir)
            else:
                dataset = _load_hub(datasets, source, key, cache_dir)
        except SpecFitError as err:
            raise SpecFitError(str(err) if str(err).startswith(key) else f"{key}: {err}") from None
        except Exception as err:  # noqa: BLE001 - datasets raises many types; each becomes one clear message
            raise SpecFitError(f"{key}: cannot read the {where} ({type(err).__name__}: {err})") from None
        columns = _columns(dataset, fields, key, where)
        n = dataset.num_rows
    return _rows(columns, n, fields, key, where, category=workload)


# --------------------------------------------------------------------------------------------- Spec-Bench
def load_questions(path: str | os.PathLike) -> list[dict]:
    """Spec-Bench's question.jsonl, read with ``datasets``: dicts with question_id, category and turns, in file
    order."""
    path = Path(path)
    if not path.is_file():
        raise SpecFitError(
            f"no Spec-Bench questions at {path}: expected question.jsonl of hemingkx/Spec-Bench "
            "(set by `spec_bench.path` in config.yaml)"
        )
    fields = dict(SPEC_BENCH_FIELDS)
    try:
        with _offline_datasets() as datasets, tempfile.TemporaryDirectory(prefix="specfit-datasets-") as cache_dir:
            dataset = datasets.load_dataset("json", data_files={"train": str(path)}, split="train",
                                            cache_dir=cache_dir)
            columns = _columns(dataset, fields, "spec_bench", str(path))
            n = dataset.num_rows
        return _rows(columns, n, fields, "spec_bench", str(path), category="")
    except Exception as err:  # noqa: BLE001 - say which line is not a question, as a reader of the lines would
        raise SpecFitError(_not_spec_bench(path, err)) from None


def _not_spec_bench(path: Path, err: Exception) -> str:
    """Why ``path`` is not Spec-Bench's question.jsonl: its first line that is not a question, else ``err``."""
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            qid, turns = q["question_id"], q["turns"]
            if not isinstance(qid, int) or not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
                raise TypeError(f"question_id {qid!r} and turns {str(turns)[:60]!r}: want an integer and strings")
            if not turns:
                raise ValueError("no turns")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as bad:
            return f"{path}:{n} is not a Spec-Bench question ({type(bad).__name__}: {bad})"
    return f"{path} is not Spec-Bench's question.jsonl ({type(err).__name__}: {err})"


# Spec-Bench's categories in its pinned question.jsonl (`spec_bench.sha256`), each with its first and last question id:
# what a config names when it selects training text by category (``toy.drafter.categories``), checked at config load
# against the evaluated ids without reading the file (tests/test_questions.py holds it equal to the file).
SPEC_BENCH_CATEGORIES = {
    "writing": (81, 90), "roleplay": (91, 100), "reasoning": (101, 110), "math": (111, 120), "coding": (121, 130),
    "extraction": (131, 140), "stem": (141, 150), "humanities": (151, 160), "translation": (161, 240),
    "summarization": (241, 320), "qa": (321, 400), "math_reasoning": (401, 480), "rag": (481, 560),
}


def category_ids(category: str) -> range:
    """The question ids of one of Spec-Bench's categories (`SPEC_BENCH_CATEGORIES`)."""
    first, last = SPEC_BENCH_CATEGORIES[category]
    return range(first, last + 1)


def training_questions(questions: list[dict], exclude_ids: Iterable[int]) -> list[dict]:
    """The questions whose ids are not in ``exclude_ids`` (the evaluated ones), in file order: the toy models
    train on these and only these."""
    exclude = set(exclude_ids)
    return [q for q in questions if q["question_id"] not in exclude]


def render_prompt(tokenizer, question: dict) -> tuple[str, list[int]]:
    """The first turn in the model's chat template, as text and token ids."""
    messages = [{"role": "user", "content": question["turns"][0]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text, list(ids)
