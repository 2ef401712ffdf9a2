"""The host-to-device copiers of the offload engine: each copies an expert's host rows into its device slot rows,
at most ``max_inflight`` copies in flight. `StreamCopier` on CUDA (copy streams joined by events), `ThreadCopier`
on a CPU with a waited (emulated) link (a worker pool), `SyncCopier` on a CPU otherwise (in the calling thread).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from specfit.engine.link import Link

# A copy job: the (slot row, host row) pairs of one expert's tensors, and its bytes.
CopyJob = tuple[list[tuple[torch.Tensor, torch.Tensor]], int]


class ThreadCopier:
    """CPU: copies run on a small worker pool, split into at most ``max_inflight`` lanes per hand-off.

    One hand-off per lane, not per expert: a hand-off costs tens of microseconds, a copy of a large expert a few
    milliseconds. A lane copies its experts one after another, so at most ``max_inflight`` copies are in flight.
    """

    def __init__(self, max_inflight: int, link: Link | None) -> None:
        self.max_inflight = max_inflight
        self.link = link
        self.pool = ThreadPoolExecutor(max_inflight, thread_name_prefix="specfit-h2d")

    def submit(self, jobs: list[CopyJob], ahead: bool = False) -> list[Future]:
        lanes = min(self.max_inflight, len(jobs))
        return [self.pool.submit(self._run_lane, jobs[i::lanes]) for i in range(lanes)]

    def _run_lane(self, jobs: list[CopyJob]) -> None:
        for pairs, nbytes in jobs:
            issued_at = time.perf_counter()
            for slot_row, host_row in pairs:
                slot_row.copy_(host_row)
            if self.link is not None:
                self.link.transfer(nbytes, issued_at)

    def wait(self, handles: list[Future]) -> None:
        for handle in handles:
            handle.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class SyncCopier:
    """CPU without a waited link (an emulated device, whose link is modelled, or none): copies run at memory speed in
    the calling thread. A hand-off to a worker costs more than the copy of a small expert, and hides nothing here.

    Copies issued ``ahead`` of a forward (a prefetch) run when the forward waits for them, inside it: on a GPU they
    are asynchronous, so the host work between forwards (drafting, selection) must not pay for them on the CPU.
    """

    def submit(self, jobs: list[CopyJob], ahead: bool = False) -> list:
        if ahead:
            return [jobs]
        self._copy(jobs)
        return []

    def wait(self, handles: list) -> None:
        for jobs in handles:
            self._copy(jobs)

    @staticmethod
    def _copy(jobs: list[CopyJob]) -> None:
        for pairs, _ in jobs:
            for slot_row, host_row in pairs:
                slot_row.copy_(host_row)

    def close(self) -> None:
        pass


class StreamCopier:
    """CUDA: pinned host rows copied with ``non_blocking`` on ``max_inflight`` copy streams, joined by events."""

    def __init__(self, max_inflight: int, device: torch.device) -> None:
        self.device = device
        self.streams = [torch.cuda.Stream(device) for _ in range(max_inflight)]

    def submit(self, jobs: list[CopyJob], ahead: bool = False) -> list[torch.cuda.Event]:
        compute = torch.cuda.current_stream(self.device)
        # Slots being overwritten were last read by compute enqueued before this point.
        slots_free = compute.record_event()
        lanes = min(len(self.streams), len(jobs))
        done = []
        for i in range(lanes):
            stream = self.streams[i]
            stream.wait_event(slots_free)
            with torch.cuda.stream(stream):
                for pairs, _ in jobs[i::lanes]:
                    for slot_row, host_row in pairs:
                        slot_row.copy_(host_row, non_blocking=True)
            done.append(stream.record_event())
        return done

    def wait(self, handles: list[torch.cuda.Event]) -> None:
        compute = torch.cuda.current_stream(self.device)
        for event in handles:
            compute.wait_event(event)

    def close(self) -> None:
        pass
