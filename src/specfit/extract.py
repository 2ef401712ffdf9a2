"""Stage 1, dataset extraction: a workload's questions -> one prompts Parquet per workload and model.

The questions are Spec-Bench's (question.jsonl) unless the workload names another dataset (``source``: a local
file or folder, or a Hub dataset in the local cache), read with Hugging Face ``datasets`` offline
(`specfit.questions`). Prompts are the first turn of each question, rendered with the model's chat template
(add_generation_prompt, no system prompt) and tokenized with the model's tokenizer. ``request_id`` is
the question's index in the workload's id list, so it is stable across runs and subsets. A prompt that
leaves no room for one output token under ``limit_tokens`` is reported and skipped, never cut.

spec: {"model": its name in config.yaml (errors name models.<model>.target), "question_ids": [int, ...],
      "limit_tokens": int, "max_requests": int | null}, and for a workload whose source is not Spec-Bench
      also "workload": its name and "source": `specfit.questions.workload_source`
inputs: questions (question.jsonl, or the source's local file or folder; none for a Hub dataset), tokenizer (dir)
outputs: prompts (Parquet)

``python -m specfit.extract fetch`` downloads question.jsonl from the pinned Spec-Bench commit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import urllib.request

import pyarrow as pa

from specfit.errors import SpecFitError
from specfit.io import atomic_path, write_parquet
from specfit.models import shipped
from specfit.models.checkpoint import check_tokenizer
from specfit.questions import describe_source, load_questions, load_source
from specfit.records import PROMPTS_SCHEMA
from specfit.stage import stage_main

log = logging.getLogger("specfit.extract")


def load_workload(spec: dict, inputs: dict) -> list[dict]:
    """The questions the spec's ids select from: Spec-Bench's, or those of the workload's own ``source``."""
    if spec.get("source") is None:
        return load_questions(inputs["questions"])
    return load_source(spec["source"], spec["workload"], inputs.get("questions"))


def render_prompt(tokenizer, question: dict) -> tuple[str, list[int]]:
    """The first turn in the model's chat template, as text and token ids."""
    messages = [{"role": "user", "content": question["turns"][0]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text, list(ids)


def build_prompts(questions: list[dict], tokenizer, spec: dict) -> tuple[dict, list[dict]]:
    """Columns of the prompts table and the skipped questions (with the reason)."""
    by_id = {q["question_id"]: q for q in questions}
    ids = spec["question_ids"]
    missing = [qid for qid in ids if qid not in by_id]
    if missing:
        listed = f"{missing[:5]}{'...' if len(missing) > 5 else ''}"
        source = spec.get("source")
        if source is None:
            raise SpecFitError(
                f"question ids {listed} are not in question.jsonl; check the workload's question_ids in config.yaml"
            )
        numbered = (f"field {source['fields']['id']!r}" if source["fields"]["id"] is not None
                    else f"row positions 0..{len(questions) - 1}")
        raise SpecFitError(
            f"question ids {listed} are not in the {describe_source(source)} (its ids: {numbered}); check "
            f"workloads.{spec['workload']}.question_ids in config.yaml"
        )
    if spec["max_requests"]:
        ids = ids[: spec["max_requests"]]
    rows = {name: [] for name in PROMPTS_SCHEMA.names}
    skipped = []
    for request_id, qid in enumerate(ids):
        text, prompt_ids = render_prompt(tokenizer, by_id[qid])
        if len(prompt_ids) >= spec["limit_tokens"]:
            skipped.append({"question_id": qid, "n_prompt": len(prompt_ids), "limit_tokens": spec["limit_tokens"]})
            log.warning("skipped question %d: %d prompt tokens leave no room under the limit of %d",
                        qid, len(prompt_ids), spec["limit_tokens"])
            continue
        values = (request_id, qid, by_id[qid]["category"], text, prompt_ids, len(prompt_ids))
        for name, value in zip(PROMPTS_SCHEMA.names, values):
            rows[name].append(value)
    return rows, skipped


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    from transformers import AutoTokenizer

    key = f"models.{spec['model']}.target"
    shipped.verify(inputs["tokenizer"], key)  # the shipped toy's files against its manifest
    check_tokenizer(inputs["tokenizer"], key)  # else transformers gives an empty one
    questions = load_workload(spec, inputs)
    tokenizer = AutoTokenizer.from_pretrained(inputs["tokenizer"], local_files_only=True)
    rows, skipped = build_prompts(questions, tokenizer, spec)
    table = pa.Table.from_pydict(rows, schema=PROMPTS_SCHEMA)
    table = table.replace_schema_metadata({"skipped": json.dumps(skipped), "spec": json.dumps(spec, sort_keys=True)})
    write_parquet(table, outputs["prompts"])
    log.info("wrote %d prompts (%d skipped) to %s", table.num_rows, len(skipped), outputs["prompts"])


def fetch(spec: dict, inputs: dict, outputs: dict) -> None:
    """Download question.jsonl from the pinned commit and check its sha256; else say where to put it."""
    path = outputs["questions"]
    try:
        with urllib.request.urlopen(spec["url"], timeout=30) as response:
            data = response.read()
    except OSError as err:
        raise SpecFitError(
            f"Spec-Bench's question.jsonl is missing at {path} and could not be downloaded ({err}). "
            f"Put the file from {spec['url']} there, or set spec_bench.path in config.yaml to where it lies."
        ) from err
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec["sha256"]:
        raise SpecFitError(f"downloaded question.jsonl has sha256 {digest}, expected {spec['sha256']}")
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    log.info("downloaded %s (%d bytes, sha256 ok)", path, len(data))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fetch"]:
        stage_main(fetch)(argv[1:])
    else:
        stage_main(run)(argv)


if __name__ == "__main__":
    main()
