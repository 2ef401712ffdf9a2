"""Other slot counts priced on an engine's own forwards (`price`): what a run at another cache size would clock when
it decodes the same tokens, as a method that reads nothing of the cache (EAGLE-3 at a fixed tree) does at every slot
count. The tune stage prices every slot count of its cell on one decode per tree (`specfit.stages.tune`).

Each priced slot count has an LRU per layer (`specfit.engine.cache.ExpertCache`), fed the unions of the engine's own
forwards (`specfit.engine.layer.OffloadedLayer.run`), and a virtual clock of its own (`specfit.engine.device
.Timeline`) that follows the engine's: each forward begins and ends with it and the same drafter forwards and host
work advance it, while each layer's modelled time comes from its own cache's plan. Nothing is computed twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specfit.engine.cache import ExpertCache
from specfit.engine.device import Timeline
from specfit.errors import SpecFitError

if TYPE_CHECKING:
    from specfit.engine.offload import OffloadEngine


@dataclass
class PricedSlots:
    """One slot count priced beside an engine: its caches, one per layer, and its clock."""

    slots: int
    caches: list[ExpertCache]
    timeline: Timeline

    def begin(self) -> None:
        """A forward begins: without an expert cache (slots 0) it is cleared first, as the engine's own is."""
        if self.slots == 0:
            self.clear()

    def admit(self, index: int, tokens: int, union: list[int]) -> None:
        """Layer ``index`` of the forward in progress routes its ``tokens`` to ``union``: its plan, on the clock."""
        self.timeline.layer(index, tokens, self.caches[index].admit(union)[2])

    def clear(self) -> None:
        for cache in self.caches:
            cache.clear()


def can_price(engine: OffloadEngine) -> bool:
    """Whether ``engine``'s clock prices other slot counts: an emulated device's virtual clock, modelled from the
    cache's plan (a measured clock times the one cache that ran; a resident device has one slot count)."""
    return engine.timeline is not None and not engine.all_resident


def price(engine: OffloadEngine, slots: int) -> Timeline:
    """Price ``slots`` slots per layer on ``engine``'s forwards from now on (an empty cache of that size) and return
    its virtual clock. Only on an emulated device, whose clock is modelled from the cache's plan (a measured clock
    times the one cache that ran), and never beside a prefetch, which reads the cache it copies into."""
    if not can_price(engine):
        raise SpecFitError(f"{engine.timing_label}: only an emulated device's virtual clock prices other slot "
                           "counts; decode once per slot count here")
    capacity = engine.num_experts if slots == 0 else min(slots, engine.num_experts)
    timeline = Timeline(engine.timeline.model, clock_s=engine.timeline.clock_s)
    engine.priced.append(PricedSlots(slots, [ExpertCache(capacity) for _ in engine.layers], timeline))
    engine.timeline.followers.append(timeline)
    return timeline
