"""Spec-Bench questions, and the split between the evaluated workloads and the text the toy models train on.

The paper evaluates the 40 even-numbered CNN/DailyMail articles (summarization, ids 242..320) and the 80 GSM8K
questions (ids 401..480). Everything else in Spec-Bench may train the toy tokenizer, target and drafter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specfit.stage import SpecFitError

SUMMARIZATION_IDS = frozenset(range(242, 321, 2))
GSM8K_IDS = frozenset(range(401, 481))
EVALUATED_IDS = SUMMARIZATION_IDS | GSM8K_IDS


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


def training_questions(questions: list[dict]) -> list[dict]:
    """The questions no workload evaluates: the toy models train on these and only these."""
    return [q for q in questions if q["question_id"] not in EVALUATED_IDS]
