"""What the toy stages share: the training conversations, the held-out split and a step-budgeted training loop."""

from __future__ import annotations

import hashlib
import logging
import math
import random
import re
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from specfit import numerics
from specfit.errors import SpecFitError
from specfit.questions import load_questions, training_questions

log = logging.getLogger(__name__)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def lead(text: str, sentences: int = 3, max_words: int = 100) -> str:
    """The first sentences of ``text`` (Lead-3, the classic CNN/DailyMail baseline), cut at ``max_words``."""
    text = text.removeprefix("Summarize: ")
    words = " ".join(SENTENCE_END.split(text.strip())[:sentences]).split()
    return " ".join(words[:max_words])


def conversations(questions: list[dict]) -> list[list[dict]]:
    """Chat messages for each question; the assistant replies with the Lead-3 of the user turn.

    Spec-Bench has questions only. An extractive reply gives the toy target a reply format that ends with
    the end-of-turn token, as a chat model's does, and a copy pattern a drafter can learn.
    """
    chats = []
    for q in questions:
        messages = []
        for turn in q["turns"]:
            messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": lead(turn)}]
        chats.append(messages)
    return chats


def span_conversations(questions: list[dict], n: int, seed: int, max_words: int,
                       summarize_share: float = 0.5) -> list[list[dict]]:
    """``n`` more Lead-3 conversations over random sentence spans of the training text.

    Spec-Bench's training questions hold about 140k tokens, which a toy memorizes within a few epochs (1,500
    steps of 4 x 512 tokens on the questions alone: train loss 0.8, held-out 7.8). A span that starts at a
    random sentence of a random document, of a log-uniform length between 8 and ``max_words`` words, makes
    many more distinct (prompt, reply) pairs of the same text, so the toy memorizes less. A ``summarize_share``
    of the spans (half, for the target) get the summarization prompt's "Summarize: " prefix; the drafter's chat
    prompts get none. (A toy this size does not learn to copy the lead within the DAG's budget; docs/toy.md.)
    """
    rng = random.Random(seed)
    docs = [SENTENCE_END.split(t.strip()) for q in questions for t in q["turns"]]
    weights = [len(" ".join(d).split()) for d in docs]
    chats = []
    for _ in range(n):
        doc = rng.choices(docs, weights)[0]
        want = int(math.exp(rng.uniform(math.log(8), math.log(max_words))))
        start = rng.randrange(len(doc))
        words: list[str] = []
        for sentence in doc[start:]:
            if len(words) >= want:
                break
            words += sentence.split()
        text = " ".join(words)
        prompt = ("Summarize: " if rng.random() < summarize_share else "") + text
        chats.append([{"role": "user", "content": prompt}, {"role": "assistant", "content": lead(text)}])
    return chats


def split(questions_path, spec: dict) -> tuple[list[dict], list[dict]]:
    """(train, held-out) among the questions the toy may train on: all but ``spec["exclude_question_ids"]``, the ids
    some workload evaluates or calibration probes, shuffled by ``spec["seed"]``; the first ``spec["heldout"]`` only
    measure the toy. Every toy stage splits the same way, so their held-out questions are the same.

    A spec without ``exclude_question_ids`` is refused: the toy would train on the questions it is evaluated on.
    """
    if spec.get("exclude_question_ids") is None:
        raise SpecFitError(
            "the toy stage's spec has no `exclude_question_ids`: the Spec-Bench question ids that the workloads "
            "evaluate and calibration probes (specfit.planning.matrix.evaluated_question_ids), which the toy must not "
            "train on. The workflow's toy rules pass them; outside the workflow build the spec with "
            "specfit.toy.spec.toy_spec"
        )
    pool = training_questions(load_questions(questions_path), spec["exclude_question_ids"])
    random.Random(spec["seed"]).shuffle(pool)
    return pool[spec["heldout"]:], pool[: spec["heldout"]]


def seed_everything(seed: int, threads: int) -> None:
    """Seed every generator, and train on ``threads`` torch threads (the config's ``train_threads``).

    The thread count is the spec's, not the cores Snakemake gives the job (OMP_NUM_THREADS, 1 under ``--cores 1``,
    which already runs one job at a time) nor the machine's: how a kernel splits its sums between threads changes
    its rounding, so the same seed trained other weights on 1 and 2 threads. With a fixed count, step budgets and
    the CPU kernels pinned (`specfit.numerics`), a busy machine trains the same weights later and one with more
    cores the same weights (on another CPU: docs/toy.md says where MKL guarantees it).
    """
    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)


def state_digest(module: torch.nn.Module) -> str:
    """sha256 over a module's parameters and buffers (names, dtypes, shapes and bytes), in name order."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def probe_checks(steps: int, probe_steps: int = 3) -> tuple[int, ...]:
    """The steps after which the rate so far (from the second step) predicts the run: after ``probe_steps``, so a
    budget far off stops at once, and after a tenth of the run, whose rate is steadier: the drafter's windows are as
    long as their piece, so its first few steps can say half its time (docs/toy.md has the figures)."""
    return tuple(sorted({probe_steps, max(probe_steps, steps // 10)}))


def train_loop(step: Callable[[int, float], dict], steps: int, desc: str, max_minutes: float | None = None,
               key: str = "toy", probe_steps: int = 3) -> dict:
    """Call ``step(i, progress)`` for ``i`` in ``range(steps)``, ``progress = i / steps``; it returns floats to log.

    The budget is a step count, so a busy machine trains the same model, only later. The step rate measured over
    the first steps (`probe_checks`) predicts the whole run; a prediction over ``max_minutes`` stops with an error
    naming ``key`` (the config section) there, before the long part of training.
    """
    start = time.perf_counter()
    bar = tqdm(total=steps, desc=desc, mininterval=5)
    stats: dict = {}
    checks = probe_checks(steps, probe_steps)
    for i in range(steps):
        stats = step(i, i / steps)
        bar.update()
        if i == 0:
            warm = time.perf_counter()  # the first step pays one-off allocations: the probe starts after it
        if i in checks and max_minutes is not None:
            per_step = (time.perf_counter() - warm) / i
            predicted = per_step * steps / 60
            log.info("%s: %d steps predicted to take %.1f min (limit %.1f min)", desc, steps, predicted, max_minutes)
            if predicted > max_minutes:
                raise SpecFitError(
                    f"{desc}: {steps} steps would take about {predicted:.1f} min on this machine "
                    f"({per_step:.2f} s per step), over `{key}.max_minutes` = {max_minutes}: "
                    f"lower `{key}.steps` (or the model size), or raise `{key}.max_minutes`"
                )
        if (i + 1) % 20 == 0 or i == 0:
            bar.set_postfix(stats)
            log.info("%s step %d: %s", desc, i + 1, " ".join(f"{k}={v:.4f}" for k, v in stats.items()))
    bar.close()
    elapsed = time.perf_counter() - start
    log.info("%s: %d steps in %.1f s: %s", desc, steps, elapsed, stats)
    return {"steps": steps, "seconds": round(elapsed, 1), "threads": torch.get_num_threads(),
            "numerics": numerics.described(), **stats}


def cosine_lr(lr: float, progress: float, warmup: float = 0.05) -> float:
    if progress < warmup:
        return lr * progress / warmup
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup)))))
