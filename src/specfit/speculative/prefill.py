"""A prompt's prefill computed once and replayed (`SharedPrefills`): where a stage decodes the same prompts again and
again (the tune stage's sweep decodes every tuning prompt once per tree of its grid), the target's and the drafter's
prefill of a prompt compute the same tensors every time; only the expert cache they meet differs (what the earlier
requests of that tree left in it), and with it the copies and the modelled time.

The first decode of a prompt computes its prefill and keeps what it left: the target's KV cache, the drafter's state,
the first output token (and a sampled decode's noise), and the forwards as the engine saw them
(`specfit.engine.replay.record_forwards`: each layer's expert union, the drafter's rows). Every later decode of that
prompt starts from a copy of them, and the engine replays the recorded forwards
(`specfit.engine.replay.replay_forwards`): the cache admits each layer's union as the computed forward would, counting
the same hits, misses and copies, and the virtual clock advances by the same modelled time. Only where the clock is
modelled from the plan and nothing reads a slot row (an emulated device computed on the host,
`specfit.engine.replay.replays_forwards`); elsewhere every prefill computes (`for_engine` gives None). The tests hold
a replayed request to a computed one: the same tokens, cycles, counters and modelled times.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specfit.engine.replay import record_forwards, replay_forwards, replays_forwards

if TYPE_CHECKING:
    from transformers import DynamicCache

    from specfit.speculative.draft import DraftState
    from specfit.speculative.request import Session
    from specfit.speculative.sampler import Noise


@dataclass
class Kept:
    """What a prompt's prefill left in its session, and its forwards as the engine recorded them."""

    cache: DynamicCache  # the target's KV rows of the prompt
    state: DraftState | None  # the drafter's, after its catch-up on the prompt (None without a drafter)
    output: list[int]  # the first output token
    noise: Noise | None  # a sampled decode's noise, None when greedy
    forwards: list  # `specfit.engine.replay.record_forwards`


class SharedPrefills:
    """Each prompt's prefill, computed at its first decode and replayed at every later one on ``engine``."""

    def __init__(self, engine):
        self.engine = engine
        self.kept: dict[tuple, Kept] = {}
        self.replayed = 0  # prefills replayed instead of computed

    @classmethod
    def for_engine(cls, engine) -> SharedPrefills | None:
        """Shared prefills on ``engine`` where it replays forwards, else None (every prefill computes)."""
        return cls(engine) if engine is not None and replays_forwards(engine) else None

    def prefill(self, session: Session) -> None:
        """``session.prefill()``, or its replay where this prompt was prefilled before (the same request: its
        prompt tokens, noise key and drafter)."""
        key = (tuple(session.prompt_ids), session.noise_key, session.drafter is not None)
        kept = self.kept.get(key)
        if kept is None:
            with record_forwards(self.engine) as forwards:
                session.prefill()
            self.kept[key] = Kept(copy.deepcopy(session.target.cache), copy.deepcopy(session.state),
                                  list(session.output), copy.deepcopy(session.noise), forwards)
            return
        replay_forwards(self.engine, kept.forwards)
        session.target.cache = copy.deepcopy(kept.cache)
        session.state = copy.deepcopy(kept.state)
        session.output = list(kept.output)
        session.noise = copy.deepcopy(kept.noise)
        self.replayed += 1
