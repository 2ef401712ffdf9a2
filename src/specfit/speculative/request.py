"""One request at batch size 1: prefill, then verification cycles until EOS or the length limit.

A `Session` holds one request's state (the target's KV cache, the drafter's state, the output so far) and owns
its operations: `Session.prefill` runs the prompt, `Session.draft` drafts the pool level by level while the method
asks for more, `Session.verify` verifies root + the selected subtree in one target forward and `Session.commit`
keeps the root and the accepted path (KV rows, output, drafter state); the `Target` (`specfit.speculative.verify`)
only runs the forwards. `decode_request` (the decode stage) and the calibration probes both run cycles through
it. KV and draft state are new per request; the offload engine's expert cache carries over.

Output tokens: the first comes from prefill; every cycle adds its accepted tokens and the target's next token
(the next root), so ``committed`` sums to ``N - 1`` over a request, as Eq. 10 attributes the first to prefill.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import torch

from specfit.models.eagle3 import Eagle3Drafter
from specfit.results.records import in_flight_fractions, pool_columns, resident_ids
from specfit.selection.pool import CandidatePool
from specfit.speculative.cycle import Cycle, Stopwatch, VirtualClock
from specfit.speculative.draft import DraftState, draft_level, new_draft_state, sync
from specfit.speculative.methods import Decision, Method
from specfit.speculative.prefill import SharedPrefills
from specfit.speculative.sampler import Noise, next_positions, rejection_path, warp
from specfit.speculative.sampling import GREEDY, Sampling
from specfit.speculative.tree import keep_rows
from specfit.speculative.verify import Target, Verdict, greedy_path

SECTIONS = ("draft", "select", "verify", "commit")  # the timed parts of a cycle (CYCLE_SCHEMA's t_*_s)

@dataclass(frozen=True)
class Limits:
    limit_tokens: int  # input + output tokens
    max_new_tokens: int
    eos_ids: frozenset[int]
    sampling: Sampling = GREEDY  # how each position's token is chosen (`specfit.speculative.sampling`); greedy at T=0

    def room(self, prompt_len: int, n_output: int) -> int:
        """Output tokens still allowed."""
        return min(self.limit_tokens - prompt_len - n_output, self.max_new_tokens - n_output)


@dataclass
class RequestResult:
    request: dict  # a row of REQUEST_SCHEMA
    cycles: list[dict]  # rows of CYCLE_SCHEMA


def h2d_transfers(engine) -> int:
    return engine.h2d_transfers if engine is not None else 0


def clock_for(model, engine) -> Stopwatch:
    """A request's clock: the emulated device's virtual one, else wall time (synchronized on a GPU)."""
    if engine is not None and engine.timeline is not None:
        return VirtualClock(engine.timeline)
    return Stopwatch(torch.cuda.synchronize if model.device.type == "cuda" else None)


class Session:
    """One request's decoding state and its cycles; every part of a cycle is timed into the ``times`` it is given.

    ``drafter`` is None for methods that do not draft (AR): every cycle then verifies the root alone.
    """

    def __init__(self, model, drafter: Eagle3Drafter | None, prompt_ids: list[int], limits: Limits, *,
                 request_id: int = 0, engine=None, noise_key: int | None = None):
        """``noise_key``: the request's key in the sampling noise (the question id; default ``request_id``), so
        that AR and every method draw the same noise for the same question."""
        self.drafter, self.prompt_ids, self.limits, self.request_id = drafter, prompt_ids, limits, request_id
        self.sampling = limits.sampling
        self.noise_key = request_id if noise_key is None else noise_key
        self.noise: Noise | None = None  # made at prefill (it reads the target's vocabulary), None when greedy
        self.target = Target(model, engine, drafter.aux_layer_ids if drafter is not None else None)
        self.clock = clock_for(model, engine)
        self.state: DraftState | None = None
        self.output: list[int] = []  # output tokens so far; the last is the next cycle's root
        self.cycles = 0  # cycles committed

    def prefill(self) -> None:
        """Run the prompt through the target and the drafter; the first output token is the first root."""
        logits, aux = self.target.forward(self.prompt_ids, last=True)  # [1, V], [1, P, 3H] (None without a drafter)
        if self.sampling.greedy:
            root = int(logits[-1].argmax())
        else:
            self.noise = Noise(self.sampling, self.noise_key, logits.shape[-1])
            root = self.noise.sample(logits[-1:], [0])[0]  # output position 0
        self.output = [root]
        if self.drafter is not None:
            self.state = new_draft_state()
            self.state.pending = (self.prompt_ids[1:] + [root], [aux])  # drafter row t reads (x_{t+1}, h_t)
            sync(self.drafter, self.state)

    @property
    def room(self) -> int:
        """Output tokens still allowed."""
        return self.limits.room(len(self.prompt_ids), len(self.output))

    @property
    def done(self) -> bool:
        return self.output[-1] in self.limits.eos_ids or self.room <= 0

    def cycle(self) -> Cycle:
        """The next cycle, as a method sees it."""
        return Cycle(self.request_id, self.cycles, self.target.prefix_len, self.output, self.target, self.clock,
                     self.drafter, self.state)

    def draft(self, method: Method, times: dict) -> tuple[Cycle, CandidatePool, Decision]:
        """Draft the pool level by level until the method selects (at most ``room - 1`` levels: every cycle
        commits the root, so a deeper node could never be kept)."""
        cycle = self.cycle()
        depth_cap = min(method.max_depth, self.room - 1) if self.drafter is not None else 0
        root_only = False  # the method verifies the root alone this cycle
        if depth_cap > 0:
            with self.clock.section(times, "select"):
                root_only = not method.wants_draft(cycle)
            if root_only and method.live is None:
                depth_cap = 0  # nothing drafted; the drafter catches up on the committed tokens later
            # an atlas build (live routes) drafts and records the pool anyway, so that measured runs, whose cache
            # and so whose decisions differ, find this prefix in the atlas
        pool, decision = self._draft_levels(method, cycle, depth_cap, times)
        return cycle, pool, (Decision((), 0) if root_only else decision)

    def _draft_levels(self, method: Method, cycle: Cycle, depth_cap: int, times: dict):
        """The pool drafted level by level, at most ``depth_cap`` levels, and the method's decision."""
        pool = CandidatePool.root_only(self.output[-1])
        if depth_cap > 0 and self.state.pending is not None:
            with self.clock.section(times, "draft"):
                sync(self.drafter, self.state)
        choose = self._draft_choice(method.config.top_k_expand)
        for depth in range(1, depth_cap + 1):
            with self.clock.section(times, "draft"):
                draft_level(self.drafter, self.state, pool, method.config.top_k_expand, choose)
            with self.clock.section(times, "select"):
                decision = method.select(cycle, pool, final=depth == depth_cap)
            if decision is not None:
                return pool, decision
        with self.clock.section(times, "select"):
            return pool, method.select(cycle, pool, final=True)

    def _draft_choice(self, k: int):
        """Sampling: the children and their commit probabilities as the mode has them (coupled: drafted by the
        Gumbel-max rule at their output position, `Noise.draft`; rejection: the drafter's top-k at the warped
        temperature, `Noise.proposals`); None when greedy (the drafter's top-k and its probabilities)."""
        if self.sampling.greedy:
            return None
        if self.sampling.rejection:
            return lambda logits, depth: self.noise.proposals(logits, k)
        n = len(self.output)  # a child of a level-d node is output position n + d
        target_ids = {}

        def choose(logits: torch.Tensor, depth: int):
            Vd = logits.shape[-1]
            if Vd not in target_ids:
                target_ids[Vd] = self.drafter.to_target_ids(torch.arange(Vd, device=logits.device)).cpu()  # [Vd]
            return self.noise.draft(logits, n + depth, target_ids[Vd], k)

        return choose

    def _accept(self, pool: CandidatePool, rows: tuple[int, ...], logits: torch.Tensor) -> tuple[list[int], int]:
        """The accepted path and the next root from the verify's ``logits`` [q, V] (row i: node ``rows[i]``)."""
        row_of = {v: i for i, v in enumerate(rows)}
        if self.sampling.rejection:
            n = len(self.output)
            probs = warp(logits, self.sampling).softmax(-1)  # [q, V]
            children: dict[int, list[int]] = {}
            for v in rows[1:]:
                children.setdefault(pool.parent[v], []).append(v)
            return rejection_path(children, pool.token, {v: probs[row_of[v]] for v in rows}, self.noise, n,
                                  {v: pool.level[v] for v in rows})
        if self.sampling.greedy:
            predicted = logits.argmax(-1).tolist()  # [q] the target's next token after each row
        else:  # coupled: AR's token at each row's output position
            predicted = self.noise.sample(logits, [len(self.output) + pool.level[v] for v in rows])
        accepted = greedy_path(pool, rows, predicted)
        return accepted, predicted[row_of[accepted[-1]] if accepted else 0]

    def verify(self, pool: CandidatePool, nodes: tuple[int, ...], times: dict) -> Verdict:
        """Verify root + ``nodes`` (ancestor-closed, ascending) in one tree forward of the target; `commit` prunes
        its cache."""
        with self.clock.section(times, "verify"):
            target = self.target
            past = target.prefix_len
            rows = (0, *nodes)
            row_of = {v: i for i, v in enumerate(rows)}
            parent = [row_of.get(pool.parent[v], -1) for v in rows]
            logits, aux = target.forward([pool.token[v] for v in rows], parent, [pool.level[v] for v in rows])
            accepted, next_root = self._accept(pool, rows, logits)
            kept = [0] + [row_of[v] for v in accepted]  # query rows on the committed path
            return Verdict(
                accepted=accepted,
                next_root=next_root,
                aux=aux[:, kept] if aux is not None else None,  # [1, len(kept), 3H]
                past_len=past,
                kept=kept,
            )

    def commit(self, pool: CandidatePool, verdict: Verdict, times: dict) -> int:
        """Keep the root and the accepted path: the target's KV rows, the output (cut at EOS and at the limit)
        and what the drafter catches up on next cycle. Returns the tokens added to the output."""
        with self.clock.section(times, "commit"):
            keep_rows(self.target.cache, verdict.past_len, verdict.kept)  # drop the rejected nodes' KV rows
            new = [pool.token[v] for v in verdict.accepted] + [verdict.next_root]
            if self.state is not None:  # the drafter catches up on these at the start of the next drafted cycle
                tokens, chunks = self.state.pending or ([], [])  # after a cycle that did not draft: earlier ones
                self.state.pending = (tokens + new, [*chunks, verdict.aux])  # a new tuple: snapshots keep theirs
            new = new[: self.room]
            eos = next((i for i, t in enumerate(new) if t in self.limits.eos_ids), None)
            if eos is not None:
                new = new[: eos + 1]
            self.output.extend(new)
        self.cycles += 1
        return len(new)

    def step(self, method: Method) -> dict:
        """One whole cycle; returns its row of `specfit.results.records.CYCLE_SCHEMA`.

        ``resident`` is the residency the method read in this cycle (`Method.residency`: no engine query of its own),
        null when it read none: methods without a cache-aware cost, and specfit-ca's cycles with no room left to
        draft (specfit-ca reads it also when it skips drafting, off the timers); ``in_flight`` of those, the copy left
        of each (specfit-prefetch's prefetches still in flight), null when none.
        """
        engine = self.target.engine
        h2d = h2d_transfers(engine)
        times = dict.fromkeys(SECTIONS, 0.0)
        cycle, pool, decision = self.draft(method, times)
        if self.noise is not None:  # the next cycle's positions, drawn while the device verifies (Noise.ahead)
            self.noise.ahead(next_positions(len(self.output), method.max_depth, self.room))
        verdict = self.verify(pool, decision.nodes, times)
        committed = self.commit(pool, verdict, times)
        with self.clock.section(times, "select"):  # the method's host work on the outcome (calibration, history)
            method.verified(pool, decision, verdict.accepted)
            method.committed(cycle, decision, len(verdict.accepted))
        return {
            "request_id": cycle.request_id, "cycle": cycle.index, "prefix_len": cycle.prefix_len,
            **pool_columns(pool), "selected": list(decision.nodes), "drafted_levels": decision.drafted_levels,
            "accepted": len(verdict.accepted), "accepted_path": verdict.accepted, "committed": committed,
            **{f"t_{k}_s": v for k, v in times.items()}, "h2d_transfers": h2d_transfers(engine) - h2d,
            "resident": resident_ids(method.residency(cycle)),
            "in_flight": in_flight_fractions(method.residency(cycle), method.in_flight(cycle)),
        }


def decode_request(
    model, drafter: Eagle3Drafter | None, method: Method, prompt_ids: list[int], *, request_id: int,
    question_id: int, limits: Limits, engine=None,
) -> RequestResult:
    """Decoding of one prompt with ``method`` (greedy, or sampled as ``limits.sampling`` says); times in seconds,
    synchronized around every section."""
    return drain(decode_cycles(model, drafter, method, prompt_ids, request_id=request_id, question_id=question_id,
                               limits=limits, engine=engine))


def drain(steps: Generator) -> RequestResult:
    """Run `decode_cycles`' remaining steps; the request's `RequestResult`."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def decode_cycles(
    model, drafter: Eagle3Drafter | None, method: Method, prompt_ids: list[int], *, request_id: int,
    question_id: int, limits: Limits, engine=None, prefills: SharedPrefills | None = None,
) -> Generator[list[int], None, RequestResult]:
    """`decode_request` as it goes: yields the tokens each step commits (prefill's first token, then each
    cycle's), and returns the request's `RequestResult`. What the caller does between steps is off the timers.
    ``prefills``: the prompt's prefill replayed where it was computed before (`specfit.speculative.prefill`)."""
    method.begin(question_id)
    session = Session(model, drafter if method.drafts else None, prompt_ids, limits, request_id=request_id,
                      engine=engine, noise_key=question_id)
    clock = session.clock
    h2d_start = h2d_transfers(engine)
    start = clock.now()
    times: dict[str, float] = {}
    with torch.inference_mode(), clock.section(times, "prefill"):
        if prefills is not None:
            prefills.prefill(session)
        else:
            session.prefill()
    with clock.excluded():
        yield list(session.output)
    cycles = []
    while not session.done:
        with torch.inference_mode():
            cycles.append(session.step(method))
        with clock.excluded():
            yield session.output[len(session.output) - cycles[-1]["committed"]:]
    t_request = clock.now() - start - clock.excluded_s
    request = {
        "request_id": request_id, "question_id": question_id, "output_ids": session.output,
        "n_output": len(session.output), "t_request_s": t_request, "t_prefill_s": times["prefill"],
        "h2d_transfers": h2d_transfers(engine) - h2d_start,
    }
    return RequestResult(request, cycles)
