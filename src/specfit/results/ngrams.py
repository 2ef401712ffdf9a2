"""Cycles inside a loop vs fresh text: does a cycle start on an output 4-gram the output already produced?

Speculative decoding commits long runs on text that repeats itself (a loop); this splits the cycles of a request
stream into "repeated" and "fresh" ones, so that committed tokens per cycle can be read apart from loops.

Offsets follow `specfit.speculative.request`: prefill produces output token 0 (the first root) and leaves the prompt's
P tokens in the target's KV cache; a cycle starts with ``prefix_len`` committed tokens in the KV cache (the
prompt and the output before the root; the root itself is not counted), verifies the root, and appends its
``committed`` tokens (the accepted draft tokens and the next root) at output positions
``prefix_len − P + 1 … prefix_len − P + committed``. So a request's ``committed`` sum to N − 1.

A cycle is "repeated" when the 4-gram of output tokens ending at its first committed token (output positions
j−3 … j) already ended at an earlier output position; the prompt does not count. A cycle whose first
committed token has fewer than 3 output tokens before it is "fresh". Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

N = 4
FRESH, REPEATED = "fresh", "repeated"


def seen_before(output_ids: Sequence[int], n: int = N) -> list[bool]:
    """Per output position i: the n-gram ending at i already ended at an earlier output position."""
    seen: set[tuple[int, ...]] = set()
    out = [False] * len(output_ids)
    for i in range(n - 1, len(output_ids)):
        gram = tuple(output_ids[i - n + 1: i + 1])
        out[i] = gram in seen
        seen.add(gram)
    return out


def first_position(prompt_len: int, cycle: Mapping) -> int:
    """The output position of a cycle's first committed token."""
    return cycle["prefix_len"] - prompt_len + 1


def cycle_kinds(prompt_ids: Sequence[int], output_ids: Sequence[int], cycles: Iterable[Mapping],
                n: int = N) -> list[str]:
    """"fresh" or "repeated" per cycle (rows with ``prefix_len`` and ``committed``), in the given order."""
    repeat = seen_before(output_ids, n)
    kinds = []
    for c in cycles:
        j = first_position(len(prompt_ids), c)
        if j < 1 or j + c["committed"] > len(output_ids):
            raise ValueError(f"a cycle at prefix_len {c['prefix_len']} committing {c['committed']} tokens does not "
                             f"fit a prompt of {len(prompt_ids)} and an output of {len(output_ids)} tokens")
        kinds.append(REPEATED if j < len(output_ids) and repeat[j] else FRESH)
    return kinds


def _mean(values: list[int]) -> float | None:
    return sum(values) / len(values) if values else None


def split(kinds: Sequence[str], committed: Sequence[int]) -> dict:
    """Mean committed tokens of the fresh and the repeated cycles (None where there are none), and their counts."""
    fresh = [c for k, c in zip(kinds, committed) if k == FRESH]
    repeated = [c for k, c in zip(kinds, committed) if k == REPEATED]
    return {"committed_per_cycle_fresh": _mean(fresh), "committed_per_cycle_repeated": _mean(repeated),
            "cycles_fresh": len(fresh), "cycles_repeated": len(repeated)}


def stream_split(prompts: Iterable[Mapping], requests: Iterable[Mapping], cycles: Iterable[Mapping],
                 n: int = N) -> dict:
    """Fresh vs repeated cycles of a request stream: means over all its cycles (as committed_per_cycle), summed counts.

    prompts: rows with ``request_id`` and ``prompt_ids``; requests: rows with ``request_id`` and ``output_ids``;
    cycles: rows with ``request_id``, ``prefix_len`` and ``committed``.
    """
    prompt_ids = {p["request_id"]: p["prompt_ids"] for p in prompts}
    by_request: dict[int, list[Mapping]] = {}
    for c in cycles:
        by_request.setdefault(c["request_id"], []).append(c)
    kinds, committed = [], []
    for r in requests:
        rid = r["request_id"]
        if rid not in prompt_ids:
            raise ValueError(f"request {rid} has no prompt")
        rows = by_request.pop(rid, [])
        kinds += cycle_kinds(prompt_ids[rid], r["output_ids"], rows, n)
        committed += [c["committed"] for c in rows]
    if by_request:
        raise ValueError(f"cycles of requests {sorted(by_request)} that the stream does not hold")
    return split(kinds, committed)
