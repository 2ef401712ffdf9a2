"""An emulated GPU for CPU-only machines: what a batch-1 forward of the offloaded target costs on the GPU it stands for,
on a virtual clock.

A link-only emulation (:mod:`specfit.engine.link`) makes copies cost what they cost on a GPU, but leaves the rest of a
forward at the CPU's own speed, where an executed expert costs microseconds; on the paper's A100 an executed expert
costs about as much as a copy. :class:`DeviceModel` prices a target forward the way that GPU would run the engine's
own plan (``ExpertCache.admit``):

- a fixed part by the forward's tokens, ``fixed_ms + token_ms * (T - 1)`` (attention, dense layers, norms, LM head);
- per MoE layer, ``expert_ms`` per executed expert (each distinct expert of the layer's union, resident or copied);
- the link: ``copy_ms`` per expert copy, one expert at a time, issued when the layer's routes are known, so that
  copies overlap the compute of the hits, and a group of misses runs once its copies have landed;

and a drafter forward (one drafted level, or the catch-up forward of the first) at ``draft_ms``. An optional
``select_ms`` is what one selection costs on the emulated GPU's host, as specfit-ca's drafting cost D(d) prices it
(`specfit.selection.coefficients.DraftCost`); the clock never reads it (it charges a selection's measured time).

:class:`Timeline` keeps the **virtual clock** of a run on such a device: each forward advances it by its modelled time,
never its CPU time (nothing sleeps), copies move on one modelled link in virtual time, and the host work a GPU
deployment runs on its CPU (selection, route prediction, a prefetch's decisions) advances it by its measured wall
time (`specfit.speculative.cycle.VirtualClock`). The same config so gives the same timings on any CPU but for that
host work. docs/device.md derives the parameters from the paper's Tables 2-4 and Appendix B, and says which side of
the clock each part of a cycle is on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specfit.errors import SpecFitError

PARAMETERS = ("fixed_ms", "token_ms", "expert_ms", "copy_ms", "draft_ms")
HOST_PARAMETERS = ("select_ms",)  # optional: the emulated host's work as a method prices it, never on the clock


@dataclass(frozen=True)
class DeviceModel:
    """The batch-1 costs of one emulated GPU, in milliseconds (see the module docstring)."""

    name: str
    fixed_ms: float
    token_ms: float
    expert_ms: float
    copy_ms: float
    draft_ms: float

    def __post_init__(self) -> None:
        check_parameters(self.__dict__, f"device model {self.name!r}")

    @classmethod
    def from_spec(cls, spec: dict, key: str = "emulate") -> DeviceModel:
        """From a device entry's ``emulate`` mapping; a missing, negative or non-numeric parameter names its key (the
        host's ``select_ms`` too, which the calibrate stage reads off the mapping: the model never does)."""
        check_parameters(spec, key)
        return cls(str(spec.get("name", "GPU")), *(float(spec[p]) for p in PARAMETERS))

    @property
    def label(self) -> str:
        """How timings taken on this device are labelled wherever they are shown."""
        return f"emulated {self.name}, virtual clock"

    def fixed(self, tokens: int) -> float:
        """The fixed part of a target forward over ``tokens`` tokens (ms)."""
        return self.fixed_ms + self.token_ms * (tokens - 1)

    def layer_ms(self, steps: list, link_free: float, now: float,
                 landing: dict[int, float] | None = None, tokens: int = 1) -> tuple[float, float]:
        """Walk one layer's plan (``ExpertCache.admit`` steps) from ``now``; return (end, link free at).

        A ``load`` step puts its copies on the link one after another; a ``compute`` step runs its group after the
        copies issued so far when it waits for them, else at once (the hits, while the misses' copies are in flight).
        ``landing`` gives the hits still in flight (a prefetch's copies that have not landed): expert -> when it
        lands (ms from the forward's start); a group runs its landed experts first and each other one once it lands.
        """
        for step in steps:
            if step[0] == "load":
                link_free = max(link_free, now) + self.copy_ms * len(step[1])
                continue
            _, group, wait = step
            if wait:
                now = max(now, link_free)
            if landing and any(e in landing for e, _ in group):
                for lands in sorted(landing.get(e, 0.0) for e, _ in group):
                    now = max(now, lands) + self.expert_ms
            else:
                now += self.expert_ms * len(group)
        return now, link_free

    def compute_ms(self, steps: list, tokens: int) -> float:
        """The layer's expert execution alone, without waits: ``expert_ms`` per executed expert."""
        return self.expert_ms * sum(len(step[1]) for step in steps if step[0] == "compute")

    def mean_layer_ms(self, union: float, misses: float) -> float:
        """One layer of mean counts: the hits run while the misses' copies move, then the misses run (ms).

        With ``misses == union`` (no expert cache: nothing is resident) the copies and the execution add up. This is
        the plan of a layer whose union fits its slots, evaluated on means (``python -m specfit.bench device``).
        """
        hits = union - misses
        return max(hits * self.expert_ms, misses * self.copy_ms) + misses * self.expert_ms


def check_parameters(spec: dict, key: str) -> None:
    """Refuse a missing, non-numeric or negative parameter (an optional host parameter may be absent or null), and a
    forward that would cost nothing, naming the key."""
    for p in PARAMETERS + HOST_PARAMETERS:
        value = spec.get(p)
        if p in HOST_PARAMETERS and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecFitError(f"{key}.{p} must be a number of milliseconds, got {value!r}")
        if value < 0:
            raise SpecFitError(f"{key}.{p} = {value} is negative: a cost in milliseconds is >= 0")
    if spec["fixed_ms"] <= 0 or spec["draft_ms"] <= 0:
        raise SpecFitError(f"{key}: fixed_ms and draft_ms must be > 0, or a forward would cost nothing on the "
                           f"emulated device (got fixed_ms={spec['fixed_ms']}, draft_ms={spec['draft_ms']})")


def scaled(gpu: dict, reference_step_ms: float, step_ms: float, experts_per_token: int) -> dict:
    """The toy's parameters from a GPU's (``gpu``, as `specfit.engine.paper_gpus.derive` gives them): one rule.

    One unit for every GPU: a millisecond of the reference GPU's cached AR step (``reference_step_ms``, the A100's)
    becomes ``step_ms / reference_step_ms`` on the toy, so each GPU keeps its speed relative to the reference; a time
    per expert also scales by the experts one AR token executes (the paper's L * k = 48 * 8 = 384, the toy's
    ``experts_per_token``), so that an AR token's expert union costs the same share of its step on both. The host's
    ``select_ms`` does not scale: host work is the CPU's, not the GPU's (and the clock charges it as measured).
    """
    unit = step_ms / reference_step_ms
    per_expert = unit * gpu["experts_per_token"] / experts_per_token
    return {
        "name": gpu["name"],
        "fixed_ms": gpu["fixed_ms"] * unit,
        "token_ms": gpu["token_ms"] * unit,
        "expert_ms": gpu["expert_ms"] * per_expert,
        "copy_ms": gpu["copy_ms"] * per_expert,
        "draft_ms": gpu["draft_ms"] * unit,
        **{p: gpu[p] for p in HOST_PARAMETERS if gpu.get(p) is not None},
    }


@dataclass
class Forwards:
    """Forwards of one kind on the emulated device: how many, their modelled time (what the clock advanced by) and,
    for information only, the CPU time the toy took to compute them."""

    forwards: int = 0
    modelled_s: float = 0.0
    cpu_s: float = 0.0

    def add(self, modelled_s: float, cpu_s: float) -> None:
        self.forwards += 1
        self.modelled_s += modelled_s
        self.cpu_s += cpu_s

    def as_dict(self) -> dict:
        return {"forwards": self.forwards, "modelled_s": self.modelled_s, "cpu_s": self.cpu_s}


# A target forward over more tokens than this is a prefill: outside the decode time every throughput is measured on
# (Eq. 10), so it is counted apart. A decode forward verifies at most K + 1 = 8 tokens.
PREFILL_TOKENS = 16


@dataclass
class Timeline:
    """The virtual clock of a run on the emulated device (``clock_s``, seconds), the modelled clock of the forward in
    progress (``now``, ms from its start), and the one modelled link.

    The clock advances by each forward's modelled time (`begin` .. `end`, `drafted`) and by the host work measured
    around it (`host`); nothing else moves it. The link is one resource in virtual time (``link_free_at``): a
    forward's copies and the copies a prefetch issues between forwards (`copy_ahead`) queue on it in the order they
    are issued, so a forward that begins while prefetched copies are still moving queues its own misses behind them.
    """

    model: DeviceModel  # or a resident device's `specfit.engine.resident.ResidentModel`
    target: Forwards = field(default_factory=Forwards)  # decode forwards
    prefill: Forwards = field(default_factory=Forwards)
    drafter: Forwards = field(default_factory=Forwards)  # drafted levels (and the catch-up that drafts the first)
    drafter_prefill: Forwards = field(default_factory=Forwards)  # the drafter's catch-up on a prompt
    clock_s: float = 0.0  # the virtual clock
    host_s: float = 0.0  # host work the clock advanced by (measured wall time)
    started: float = 0.0  # the forward in progress: its start on the virtual clock (s)
    cpu_started: float = 0.0  # and on the CPU's (perf_counter), for information
    now: float = 0.0
    link_free: float = 0.0  # ms from the forward's start at which the link is free (during a forward)
    link_free_at: float = 0.0  # virtual seconds at which the link has moved every copy issued so far
    tokens: int = 0
    stall_ms: float = 0.0  # the forward in progress: time its expert execution waited for copies
    copy_stall_s: float = 0.0  # summed over decode forwards: the copy time on their critical path
    # the clocks of other slot counts priced on the same forwards (`specfit.engine.pricing`):
    # each begins and ends every forward with this one and advances by the same drafter forwards and host work; their
    # layers' plans come from their own caches
    followers: list[Timeline] = field(default_factory=list)

    def begin(self) -> None:
        for other in self.followers:
            other.begin()
        self.started, self.cpu_started = self.clock_s, time.perf_counter()
        self.now = self.stall_ms = 0.0
        self.link_free = max(0.0, (self.link_free_at - self.started) * 1e3)  # copies still moving from before

    def layer(self, index: int, tokens: int, steps: list, landing: dict[int, float] | None = None) -> None:
        """One layer's plan; ``landing``: its prefetched hits still in flight, expert -> landing (virtual s)."""
        if index == 0:
            self.tokens = tokens
            self.now += self.model.fixed(tokens)
        if landing:
            landing = {e: (t - self.started) * 1e3 for e, t in landing.items()}  # ms from the forward's start
        start = self.now
        self.now, self.link_free = self.model.layer_ms(steps, self.link_free, self.now, landing, tokens=tokens)
        self.stall_ms += self.now - start - self.model.compute_ms(steps, tokens)  # execution is serial: the rest waited

    def end(self) -> None:
        for other in self.followers:
            other.end()
        self.link_free_at = self.started + self.link_free * 1e-3
        self.clock_s = self.started + self.now * 1e-3
        decode = self.tokens <= PREFILL_TOKENS
        if decode:
            self.copy_stall_s += self.stall_ms * 1e-3
        (self.target if decode else self.prefill).add(self.now * 1e-3, time.perf_counter() - self.cpu_started)

    def drafted(self, rows: int, cpu_s: float) -> None:
        """A drafter forward over ``rows`` new positions ended: ``draft_ms`` on the clock (its catch-up on a prompt,
        more than `PREFILL_TOKENS` rows, outside the decode time as the target's prefill, is counted apart)."""
        for other in self.followers:
            other.drafted(rows, cpu_s)
        self.clock_s += self.model.draft_ms * 1e-3
        (self.drafter_prefill if rows > PREFILL_TOKENS else self.drafter).add(self.model.draft_ms * 1e-3, cpu_s)

    def host(self, seconds: float) -> None:
        """Host work a GPU deployment runs on its CPU took ``seconds`` of wall time: the clock moves by as much."""
        for other in self.followers:
            other.host(seconds)
        self.clock_s += seconds
        self.host_s += seconds

    def copy_ahead(self) -> tuple[float, float]:
        """Put one copy on the link now, between forwards (a prefetch); its (start, landing), virtual seconds."""
        start = max(self.clock_s, self.link_free_at)
        self.link_free_at = start + self.model.copy_ms * 1e-3
        return start, self.link_free_at

    def backlog_ms(self) -> float:
        """How long the link still needs for the copies issued so far (ms from now)."""
        return max(0.0, (self.link_free_at - self.clock_s) * 1e3)

    def in_flight_ms(self, lands: float) -> float:
        """What is left now of a copy landing at ``lands`` (virtual seconds), in ms."""
        return max(0.0, (lands - self.clock_s) * 1e3)

    def reset(self) -> None:
        """Fresh counters; the clock and the link go on (copies in flight still land when they would)."""
        for other in self.followers:
            other.reset()
        self.target, self.prefill, self.drafter, self.drafter_prefill = Forwards(), Forwards(), Forwards(), Forwards()
        self.copy_stall_s = self.host_s = 0.0

    def as_dict(self) -> dict:
        return {"label": self.model.label, "target": self.target.as_dict(),
                "prefill": self.prefill.as_dict(), "drafter": self.drafter.as_dict(),
                "drafter_prefill": self.drafter_prefill.as_dict(), "copy_stall_s": self.copy_stall_s,
                "host_s": self.host_s}
