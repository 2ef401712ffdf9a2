"""What the toy stages share: the training conversations, the held-out split and a time-boxed training loop."""

from __future__ import annotations

import logging
import math
import os
import random
import re
import time
from typing import Callable

import torch
from tqdm import tqdm

from specfit.questions import load_questions, training_questions

log = logging.getLogger(__name__)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def lead(text: str, sentences: int = 3, max_words: int = 60) -> str:
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


def split(questions_path, heldout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) among the questions no workload evaluates; held-out ones only measure the toy."""
    pool = training_questions(load_questions(questions_path))
    random.Random(seed).shuffle(pool)
    return pool[heldout:], pool[:heldout]


def seed_everything(seed: int) -> None:
    """Seed every generator, and train on every core this job may use.

    Snakemake sets OMP_NUM_THREADS to a job's threads (1 under ``--cores 1``); a training budget is wall-clock
    time, and ``--cores 1`` already runs one job at a time, so the toy takes the whole machine while it trains.
    """
    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(len(os.sched_getaffinity(0)))


def train_loop(step: Callable[[int, float], dict], seconds: float, max_steps: int, desc: str) -> dict:
    """Call ``step(i, progress)`` until ``seconds`` pass or ``max_steps`` are done; it returns floats to log.

    ``progress`` in [0, 1) is how far the run is through whichever of its two limits comes first.
    """
    start = time.perf_counter()
    bar = tqdm(total=max_steps, desc=desc, mininterval=5)
    stats: dict = {}
    i = 0
    while i < max_steps and time.perf_counter() - start < seconds:
        stats = step(i, max(i / max_steps, (time.perf_counter() - start) / seconds))
        i += 1
        bar.update()
        if i % 20 == 0 or i == 1:
            bar.set_postfix(stats)
            log.info("%s step %d: %s", desc, i, " ".join(f"{k}={v:.4f}" for k, v in stats.items()))
    bar.close()
    elapsed = time.perf_counter() - start
    log.info("%s: %d steps in %.1f s (cap %d steps, budget %.0f s): %s", desc, i, elapsed, max_steps, seconds, stats)
    return {"steps": i, "seconds": round(elapsed, 1), **stats}


def windows(stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """[B, T] random windows of a token stream (conversations back to back)."""
    start = torch.randint(0, len(stream) - seq_len, (batch_size,), generator=generator)
    return torch.stack([stream[s : s + seq_len] for s in start.tolist()])


def cosine_lr(lr: float, progress: float, warmup: float = 0.05) -> float:
    if progress < warmup:
        return lr * progress / warmup
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup)))))
