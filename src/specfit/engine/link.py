"""Host-to-device link emulation for machines without one (a CPU-only machine, where host and device share memory).

A :class:`LinkModel` makes every expert copy take ``latency + bytes / bandwidth`` of wall time. The copies in
flight share one link the way H2D copies share a PCIe link: each copy may start moving bytes ``latency`` after it
was issued, but only once the link has finished the bytes of the copies issued before it. The copy itself is still
a real ``copy_`` into the slot buffer that compute reads; the link only decides how long it takes at least.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkModel:
    """An emulated host-to-device link.

    ``virtual=True`` waits nothing: the modelled link time is only added up (``stats()["link_s"]``) so fast tests can
    run with a link; reported runs use ``virtual=False`` and wait it.
    """

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    virtual: bool = False

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s <= 0 or self.latency_s < 0:
            raise ValueError(f"need bandwidth > 0 and latency >= 0, got {self}")

    def copy_s(self, nbytes: int) -> float:
        """Modelled time of one copy of ``nbytes`` on an idle link."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s

    @property
    def label(self) -> str:
        """How timings taken over this link are labelled wherever they are shown."""
        clock = "virtual clock" if self.virtual else "wall clock"
        return (
            f"emulated link ({self.bandwidth_bytes_per_s / 1e9:.3g} GB/s, "
            f"{self.latency_s * 1e6:.3g} us latency, {clock})"
        )


def link_for_copy_share(
    step_compute_s: float,
    transfers_per_step: float,
    expert_bytes: int,
    share: float = 0.75,
    latency_s: float = 0.0,
    virtual: bool = False,
) -> LinkModel:
    """The link under which expert copies take ``share`` of an uncached AR step.

    With ``n`` transfers per step of ``t`` seconds each and ``c`` seconds of compute, copies take
    ``n t / (n t + c) = share`` of the step, so ``t = share / (1 - share) * c / n``. On the paper's A100
    (Table 2) about 400 transfers of 0.41 ms make some 164 of 214 ms per step, a share of about three quarters.
    """
    if not 0 < share < 1 or transfers_per_step <= 0 or step_compute_s <= 0:
        raise ValueError("need 0 < share < 1, transfers_per_step > 0 and step_compute_s > 0")
    per_copy_s = share / (1 - share) * step_compute_s / transfers_per_step
    if per_copy_s <= latency_s:
        raise ValueError(f"latency {latency_s} s leaves no time for the bytes of a {per_copy_s} s copy")
    return LinkModel(expert_bytes / (per_copy_s - latency_s), latency_s, virtual)


class Link:
    """The one shared link at run time: serializes the bytes of the copies in flight (thread safe)."""

    def __init__(self, model: LinkModel) -> None:
        self.model = model
        self._lock = threading.Lock()
        self._free_at = 0.0  # perf_counter time at which the link has moved every byte issued so far
        self.busy_s = 0.0  # modelled time, summed over copies

    def transfer(self, nbytes: int, issued_at: float) -> None:
        """Account one copy issued at ``issued_at``; unless virtual, sleep until the link would have delivered it."""
        move_s = nbytes / self.model.bandwidth_bytes_per_s
        with self._lock:
            start = max(issued_at + self.model.latency_s, self._free_at)
            self._free_at = start + move_s
            done_at = self._free_at
            self.busy_s += self.model.latency_s + move_s
        if not self.model.virtual:
            remaining = done_at - time.perf_counter()
            if remaining > 0:
                time.sleep(remaining)

    def backlog_ms(self) -> float:
        """How long the link still needs for the bytes issued so far (ms from now)."""
        with self._lock:
            return max(0.0, (self._free_at - time.perf_counter()) * 1e3)

    def reset(self) -> None:
        with self._lock:
            self._free_at = 0.0
            self.busy_s = 0.0
