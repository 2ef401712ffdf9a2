"""Stage extract: a workload's questions -> one prompts Parquet per workload and model.

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
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa

from specfit.errors import SpecFitError
from specfit.io import write_parquet
from specfit.models import shipped
from specfit.models.checkpoint import check_tokenizer
from specfit.planning.stage import stage_main
from specfit.questions import describe_source, load_questions, load_source, render_prompt
from specfit.results.records import PROMPTS_SCHEMA

log = logging.getLogger("specfit.stages.extract")


def load_workload(spec: dict, inputs: dict) -> list[dict]:
    """The questions the spec's ids select from: Spec-Bench's, or those of the workload's own ``source``."""
    if spec.get("source") is None:
        return load_questions(inputs["questions"])
    return load_source(spec["source"], spec["workload"], inputs.get("questions"))


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
    if ids and not rows["request_id"]:  # nothing to decode: every later stage would fail on it, less clearly
        key = f"workloads.{spec['workload']}.limit_tokens" if "workload" in spec else (
            "the limit_tokens of the job's config entry (workloads.<name>, calibration or predictor)")
        shortest = min(s["n_prompt"] for s in skipped)
        raise SpecFitError(
            f"every one of the {len(ids)} questions has a prompt of at least limit_tokens = {spec['limit_tokens']} "
            f"tokens (the shortest: {shortest}), so none is left to decode: raise {key} above {shortest}, or choose "
            "other question_ids"
        )
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


main = stage_main(run)

if __name__ == "__main__":
    main()
