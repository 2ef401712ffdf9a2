"""One request at batch size 1: prefill, then verification cycles until EOS or the length limit.

A cycle drafts the pool level by level while the method asks for more (`draft`), verifies root + the selected
subtree in one target forward (`Target.verify`) and commits the root and the accepted path (`commit`). KV and
draft state are new per request; the offload engine's expert cache carries over between requests.

Output tokens: the first comes from prefill; every cycle adds its accepted tokens and the target's next token
(the next root), so ``committed`` sums to ``N - 1`` over a request, as Eq. 10 attributes the first to prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import torch

from specfit.models.eagle3 import Eagle3Drafter
from specfit.spec.cycle import Cycle, Stopwatch
from specfit.spec.methods import Decision, Method
from specfit.spec.pool import CandidatePool, DraftState, draft_level, new_draft_state, sync
from specfit.spec.verify import Target, Verdict

REQUEST_SCHEMA = pa.schema([
    ("request_id", pa.int64()),
    ("question_id", pa.int64()),
    ("output_ids", pa.list_(pa.int64())),  # generated tokens, EOS included
    ("n_output", pa.int64()),
    ("t_request_s", pa.float64()),
    ("t_prefill_s", pa.float64()),  # target and drafter prefill
    ("h2d_transfers", pa.int64()),  # prefill included
])

CYCLE_SCHEMA = pa.schema([
    ("request_id", pa.int64()),
    ("cycle", pa.int64()),
    ("prefix_len", pa.int64()),
    ("pool_parent", pa.list_(pa.int64())),  # index 0 is the root
    ("pool_token", pa.list_(pa.int64())),
    ("pool_prob", pa.list_(pa.float64())),
    ("pool_level", pa.list_(pa.int64())),
    ("selected", pa.list_(pa.int64())),
    ("drafted_levels", pa.int64()),
    ("accepted", pa.int64()),  # draft nodes accepted
    ("accepted_path", pa.list_(pa.int64())),
    ("committed", pa.int64()),  # tokens added to the output, after EOS / limit truncation
    ("t_draft_s", pa.float64()),
    ("t_select_s", pa.float64()),
    ("t_verify_s", pa.float64()),
    ("t_commit_s", pa.float64()),
    ("h2d_transfers", pa.int64()),
])


@dataclass(frozen=True)
class Limits:
    limit_tokens: int  # input + output tokens
    max_new_tokens: int
    eos_ids: frozenset[int]

    def room(self, prompt_len: int, n_output: int) -> int:
        """Output tokens still allowed."""
        return min(self.limit_tokens - prompt_len - n_output, self.max_new_tokens - n_output)


@dataclass
class RequestResult:
    request: dict  # a row of REQUEST_SCHEMA
    cycles: list[dict]  # rows of CYCLE_SCHEMA


def h2d_transfers(engine) -> int:
    return engine.h2d_transfers if engine is not None else 0


def prefill(target: Target, drafter: Eagle3Drafter | None, prompt_ids: list[int]) -> tuple[int, DraftState | None]:
    """Run the prompt through the target and the drafter; returns the first output token (the first root)."""
    root, aux = target.prefill(prompt_ids)
    if drafter is None:
        return root, None
    state = new_draft_state()
    state.pending = (prompt_ids[1:] + [root], aux)  # drafter row t reads (x_{t+1}, h_t)
    sync(drafter, state)
    return root, state


def draft(
    drafter, state: DraftState, method: Method, cycle: Cycle, root: int, depth_cap: int, times: dict
) -> tuple[CandidatePool, Decision]:
    """Draft the pool level by level until the method selects; ``depth_cap`` bounds the levels."""
    pool = CandidatePool.root_only(root)
    clock = cycle.clock
    if depth_cap > 0 and state.pending is not None:
        with clock.section(times, "draft"):
            sync(drafter, state)
    for depth in range(1, depth_cap + 1):
        with clock.section(times, "draft"):
            draft_level(drafter, state, pool, method.config.top_k_expand)
        with clock.section(times, "select"):
            decision = method.select(cycle, pool, final=depth == depth_cap)
        if decision is not None:
            return pool, decision
    with clock.section(times, "select"):
        return pool, method.select(cycle, pool, final=True)


def commit(output: list[int], pool: CandidatePool, verdict: Verdict, room: int, limits: Limits,
           state: DraftState | None) -> int:
    """Append the accepted path and the next root to ``output``, cut at EOS and at the limit; returns the count."""
    new = [pool.token[v] for v in verdict.accepted] + [verdict.next_root]
    new = new[:room]
    eos = next((i for i, t in enumerate(new) if t in limits.eos_ids), None)
    if eos is not None:
        new = new[: eos + 1]
    output.extend(new)
    if state is not None:  # the drafter catches up on these at the start of the next cycle
        state.pending = ([pool.token[v] for v in verdict.accepted] + [verdict.next_root], verdict.aux)
    return len(new)


def decode_request(
    model, drafter: Eagle3Drafter | None, method: Method, prompt_ids: list[int], *, request_id: int,
    question_id: int, limits: Limits, engine=None,
) -> RequestResult:
    """Greedy decoding of one prompt with ``method``; times in seconds, synchronized around every section."""
    clock = Stopwatch(model.device)
    drafter = drafter if method.drafts else None
    target = Target(model, engine, drafter.aux_layer_ids if drafter is not None else None)
    h2d_start = h2d_transfers(engine)
    start = clock.now()
    times: dict[str, float] = {}
    with torch.inference_mode():
        with clock.section(times, "prefill"):
            root, state = prefill(target, drafter, prompt_ids)
        output = [root]
        cycles = []
        while output[-1] not in limits.eos_ids and (room := limits.room(len(prompt_ids), len(output))) > 0:
            h2d_cycle = h2d_transfers(engine)
            times_c: dict[str, float] = {"draft": 0.0, "select": 0.0, "verify": 0.0, "commit": 0.0}
            cycle = Cycle(request_id, len(cycles), target.prefix_len, target, clock, output)
            pool, decision = draft(drafter, state, method, cycle, output[-1], min(method.max_depth, room - 1), times_c)
            with clock.section(times_c, "verify"):
                verdict = target.verify(pool, decision.nodes)
            with clock.section(times_c, "commit"):
                target.commit(verdict)
                committed = commit(output, pool, verdict, room, limits, state)
            cycles.append({
                "request_id": request_id, "cycle": cycle.index, "prefix_len": cycle.prefix_len,
                "pool_parent": pool.parent, "pool_token": pool.token, "pool_prob": pool.path_prob,
                "pool_level": pool.level, "selected": list(decision.nodes),
                "drafted_levels": decision.drafted_levels, "accepted": len(verdict.accepted),
                "accepted_path": verdict.accepted, "committed": committed,
                **{f"t_{k}_s": v for k, v in times_c.items()},
                "h2d_transfers": h2d_transfers(engine) - h2d_cycle,
            })
    t_request = clock.now() - start - clock.excluded_s
    request = {
        "request_id": request_id, "question_id": question_id, "output_ids": output, "n_output": len(output),
        "t_request_s": t_request, "t_prefill_s": times["prefill"], "h2d_transfers": h2d_transfers(engine) - h2d_start,
    }
    return RequestResult(request, cycles)
