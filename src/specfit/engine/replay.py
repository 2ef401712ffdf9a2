"""A target's or drafter's forwards recorded (`record_forwards`) and replayed on the engine without computing them
(`replay_forwards`): what a prompt's prefill admitted, counted and clocked, again, where the same prompt is decoded
again (`specfit.speculative.prefill`, the tune stage's sweep)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from specfit.errors import SpecFitError

if TYPE_CHECKING:
    from specfit.engine.offload import OffloadEngine


def replays_forwards(engine: OffloadEngine) -> bool:
    """Whether a recorded forward can be replayed on ``engine``: an emulated device's virtual clock, which models a
    forward from what it admits, on a host-compute engine, whose slot rows nothing reads."""
    return engine.timeline is not None and engine.host_compute


@contextmanager
def record_forwards(engine: OffloadEngine) -> Iterator[list]:
    """Record every forward inside the block, target and drafter in order, as `replay_forwards` replays them: each
    ("target", its routes [T, L, k], captured where `OffloadEngine.record_routes` captures them) or ("drafter",
    rows)."""
    log: list[tuple[str, object]] = []
    engine.forward_log = log
    try:
        yield log
    finally:
        engine.forward_log = None


def replay_forwards(engine: OffloadEngine, log: list[tuple[str, object]]) -> None:
    """The forwards of ``log`` again, as the cache, the counters and the virtual clock see them, without computing
    them: each target layer admits its recorded routes (`specfit.engine.layer.OffloadedLayer.admit`: hits, misses,
    copies, its modelled time, every priced slot count) and each drafter forward advances the clock by ``draft_ms``.
    Only the CPU seconds the device keeps for information are the replay's own. What the forwards computed is the
    caller's to restore (`specfit.speculative.prefill`)."""
    if not replays_forwards(engine):
        raise SpecFitError(f"{engine.timing_label}: a forward is replayed only on an emulated device's virtual "
                           "clock computed on the host; compute it again here")
    for kind, entry in log:
        if kind == "drafter":
            engine.timeline.drafted(entry, 0.0)
            continue
        engine.begin_forward()
        try:
            for index, layer in enumerate(engine.layers):
                layer.admit(entry[:, index])  # [T, k]
        finally:
            engine.end_forward()
