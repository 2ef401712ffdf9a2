"""What a method sees of the cycle it decides in, and the request's clock (wall time, or an emulated device's virtual
clock). Torch-free: the theory stage replays recorded cycles through the same route lookup."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specfit.models.eagle3 import Eagle3Drafter
    from specfit.speculative.draft import DraftState
    from specfit.speculative.verify import Target


# The parts of a cycle that a GPU deployment runs on its CPU, the host work the paper measured and included (Section
# 4.6): the selector, route prediction, a prefetch's decisions and what a method learns from a verification's outcome
# all run inside the "select" sections. Everything else of a cycle (drafting, verification, commit) is device work,
# inside the modelled costs (docs/device.md).
HOST_SECTIONS = frozenset({"select"})


class Stopwatch:
    """Wall time with device synchronization (``sync``, e.g. ``torch.cuda.synchronize``) around every timed
    section: a GPU's, or the CPU's own (a link-only device).

    ``excluded()`` marks work outside the request timer (a live route query); it is subtracted from the request
    and from any section that encloses it.
    """

    def __init__(self, sync: Callable[[], None] | None = None):
        self._sync = sync or (lambda: None)
        self.excluded_s = 0.0

    def wall(self) -> float:
        """Wall time (perf_counter seconds), after synchronizing the device."""
        self._sync()
        return time.perf_counter()

    def now(self) -> float:
        """The time the request is measured on."""
        return self.wall()

    @contextlib.contextmanager
    def section(self, times: dict[str, float], key: str) -> Iterator[None]:
        """Add the block's time to ``times[key]``."""
        start, excluded = self.now(), self.excluded_s
        yield
        times[key] = times.get(key, 0.0) + self.now() - start - (self.excluded_s - excluded)

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        start = self.now()
        yield
        self.excluded_s += self.now() - start


class VirtualClock(Stopwatch):
    """The emulated device's virtual clock (`specfit.engine.device.Timeline`): forwards advance it by their modelled
    time; a section of `HOST_SECTIONS` advances it by its measured wall time, less what it excluded. Nothing sleeps."""

    def __init__(self, timeline):
        super().__init__()
        self.timeline = timeline
        self.excluded_wall_s = 0.0

    def now(self) -> float:
        return self.timeline.clock_s

    @contextlib.contextmanager
    def section(self, times: dict[str, float], key: str) -> Iterator[None]:
        if key not in HOST_SECTIONS:
            with super().section(times, key):
                yield
            return
        wall, excluded_wall = time.perf_counter(), self.excluded_wall_s
        with super().section(times, key):
            yield
            self.timeline.host(time.perf_counter() - wall - (self.excluded_wall_s - excluded_wall))

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        start, wall = self.now(), time.perf_counter()
        yield
        self.excluded_s += self.now() - start
        self.excluded_wall_s += time.perf_counter() - wall


@dataclass
class Cycle:
    """One verification cycle of one request: where it stands, the target for route queries and the drafter state
    for route predictions (None when a recorded cycle is replayed)."""

    request_id: int
    index: int
    prefix_len: int  # committed tokens the target holds in its KV cache; the root is next
    output: Sequence[int]  # the request's output so far, the root (at position prefix_len) last
    target: Target | None = None
    clock: Stopwatch = dataclasses.field(default_factory=Stopwatch)
    drafter: Eagle3Drafter | None = None  # the drafter and its state after drafting: a learned route source's input
    draft: DraftState | None = None
