"""What a method sees of the cycle it decides in, and the request's stopwatch. Torch-free: the theory stage
replays recorded cycles through the same route lookup."""

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


class Stopwatch:
    """Wall time with device synchronization (``sync``, e.g. ``torch.cuda.synchronize``) around every timed
    section.

    ``excluded()`` marks work outside the request timer (a live route query); it is subtracted from the request
    and from any section that encloses it.
    """

    def __init__(self, sync: Callable[[], None] | None = None):
        self._sync = sync or (lambda: None)
        self.excluded_s = 0.0

    def now(self) -> float:
        self._sync()
        return time.perf_counter()

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
