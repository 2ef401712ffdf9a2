"""Spec-Bench questions, and the split between the evaluated questions and the text the toy models train on.

Which ids are evaluated is the config's business: every workload's ids and the calibration ids
(``specfit.workflow.evaluated_question_ids``; with config.yaml, the paper's 40 even-numbered CNN/DailyMail
articles 242..320 and the 80 GSM8K questions 401..480). The toy rules pass them to their stages as
``exclude_question_ids``; everything else in Spec-Bench may train the toy tokenizer, target and drafter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from specfit.errors import SpecFitError


def load_questions(path: str | os.PathLike) -> list[dict]:
    """The JSON lines of Spec-Bench's question.jsonl: dicts with question_id, category and turns."""
    path = Path(path)
    if not path.is_file():
        raise SpecFitError(
            f"no Spec-Bench questions at {path}: expected question.jsonl of hemingkx/Spec-Bench "
            "(set by `spec_bench.path` in config.yaml)"
        )
    questions = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            q["question_id"], q["turns"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise SpecFitError(f"{path}:{n} is not a Spec-Bench question ({err})") from None
        questions.append(q)
    return questions


def training_questions(questions: list[dict], exclude_ids: Iterable[int]) -> list[dict]:
    """The questions whose ids are not in ``exclude_ids`` (the evaluated ones), in file order: the toy models
    train on these and only these."""
    exclude = set(exclude_ids)
    return [q for q in questions if q["question_id"] not in exclude]
