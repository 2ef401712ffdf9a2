"""Expert offloading for Hugging Face MoE models: host storage, an LRU expert cache of device slots per layer.

Every expert of every MoE layer lives in host memory (pinned when the device is CUDA). Each layer owns ``slots``
device slots, an LRU cache that starts empty. The engine registers itself as an experts implementation of
transformers (``ALL_EXPERTS_FUNCTIONS``), so the target's own router picks the experts and the target's own
experts implementation (``grouped_mm``, ``eager``, ...) does the math, reading the slot buffers in place of the
fused weights through a thin view. Nothing of the modeling code is copied.

Touch order (what decides later evictions; an LRU simulation over the recorded routes reproduces every counter):

1. The layer's demand is the union of the experts that the forward's tokens route to, in increasing expert id.
2. Hits (experts already resident) are touched first, in increasing expert id: each becomes most recently used.
3. Misses follow in increasing expert id: each takes a free slot, else evicts the least recently used expert.

Hits are computed while the misses' copies are in flight. When the union exceeds the slots, an admission whose
victim has not been computed yet first computes the group waiting for it, so the forward runs in groups and every
expert is still loaded at most once per layer forward.

``slots = 0`` means no expert cache: the cache is cleared (and the clearing timed) before every target forward,
prefill included; within a layer forward an expert shared by several tokens is loaded once, into a scratch of
``num_experts`` slots shared by all layers.

What the numbers guarantee, on every machine, for every family and dtype: a layer forward whose experts are all
resident (all hits) is one call of the target's own experts implementation on the same values, so it is
bit-identical to the un-offloaded model. A forward with misses (cold, warm and split into hit and miss groups, no
cache) computes each routed entry's expert output per group and then weights and sums the top-k once, in the
dtypes and the order of the target's own implementation (``SPLIT_ARITHMETIC``: Mixtral's router returns float32
gate weights, under which grouped_mm sums bfloat16 expert outputs in float32 and rounds once), so it differs only
in rounding: fp32 logits agree with the all-hit ones to a few ulps (the tests hold them to 1e-5 absolute), bf16
logits to a few bf16 ulps, and routes and greedy tokens are the same unless a router or argmax margin is itself
within rounding. It is not bit-identical everywhere (the rows a matmul computes together change its blocking on
some CPUs), so whatever compares runs across cache states (the route atlas) tolerates that. Experts
implementations other than those of ``SPLIT_ARITHMETIC`` are refused.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

from specfit.engine.device import DeviceModel, Timeline
from specfit.engine.families import MoEFamily, family_of, moe_experts
from specfit.engine.link import Link, LinkModel

EXPERTS_IMPLEMENTATION = "specfit_offload"

# How each supported experts implementation of transformers combines an entry's expert output with its gate weight,
# which a forward split into cache groups reproduces (an all-hit forward is the implementation's own call):
# "promote": output * weight in the promoted dtype, summed over the top-k there, cast to the states' dtype once;
# "sequential": each weighted entry cast to the states' dtype, added in increasing expert id (every eager forward).
SPLIT_ARITHMETIC = {"grouped_mm": "promote", "batched_mm": "promote", "eager": "sequential"}


@dataclass(frozen=True)
class OffloadConfig:
    """How the experts are offloaded: ``slots`` device slots per layer (0: no expert cache)."""

    slots: int
    max_inflight: int = 2  # host-to-device copies in flight at most
    link: LinkModel | None = None  # emulated link for CPU-only machines; None: copies run at memory speed
    device: DeviceModel | None = None  # emulated GPU for CPU-only machines (its own link): specfit.engine.device

    def __post_init__(self) -> None:
        if self.slots < 0 or self.max_inflight < 1:
            raise ValueError(f"need slots >= 0 and max_inflight >= 1, got {self}")
        if self.link is not None and self.device is not None:
            raise ValueError("an emulated device models its own link (copy_ms): give a link or a device, not both")


# A plan step: ("load", [(expert, slot), ...]) issues copies; ("compute", [(expert, slot), ...], wait) runs the
# target's experts implementation on that group, first waiting for the copies in flight when ``wait``.
Step = tuple


class ExpertCache:
    """The LRU of one layer's device slots (expert id -> slot, least recently used first)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.clear()

    def clear(self) -> None:
        self.slot_of: OrderedDict[int, int] = OrderedDict()
        self.free = list(range(self.capacity - 1, -1, -1))  # popped from the end: slot 0 first

    def admit(self, union: list[int]) -> tuple[list[int], list[int], list[Step]]:
        """Touch ``union`` (increasing expert ids) in the documented order; return hits, misses and the plan."""
        slot_of = self.slot_of
        hits = [e for e in union if e in slot_of]
        misses = [e for e in union if e not in slot_of]
        for e in hits:
            slot_of.move_to_end(e)
        hit_group = [(e, slot_of[e]) for e in hits]
        uncomputed_hits = set(hits)
        steps: list[Step] = []
        loads: list[tuple[int, int]] = []
        pending: list[tuple[int, int]] = []  # loaded (or loading) in this forward, not computed yet
        pending_ids: set[int] = set()

        def flush_loads() -> None:
            if loads:
                steps.append(("load", loads.copy()))
                loads.clear()

        for e in misses:
            if self.free:
                slot, victim = self.free.pop(), None
            else:
                victim, slot = slot_of.popitem(last=False)
            if victim in uncomputed_hits:
                flush_loads()  # the copies issued so far overlap the hits' compute
                steps.append(("compute", hit_group, False))
                uncomputed_hits.clear()
            elif victim in pending_ids:
                flush_loads()
                steps.append(("compute", pending.copy(), True))
                pending.clear()
                pending_ids.clear()
            slot_of[e] = slot
            loads.append((e, slot))
            pending.append((e, slot))
            pending_ids.add(e)
        flush_loads()
        if uncomputed_hits:
            steps.append(("compute", hit_group, False))
        if pending:
            steps.append(("compute", pending, True))
        return hits, misses, steps


    def prefetch(self, expert: int, protect) -> tuple[int, int | None] | None:
        """Make ``expert`` (not resident) resident ahead of a forward, as that forward would admit it: a free slot,
        else the slot of the least recently used expert outside ``protect`` (a set of expert ids, never evicted).
        It lands most recently used. Returns (slot, victim or None), or None when every resident expert is protected.
        """
        slot_of = self.slot_of
        if self.free:
            slot, victim = self.free.pop(), None
        else:
            victim = next((e for e in slot_of if e not in protect), None)  # least recently used first
            if victim is None:
                return None
            slot = slot_of.pop(victim)
        slot_of[expert] = slot
        return slot, victim


# A copy job: the (slot row, host row) pairs of one expert's tensors, and its bytes.
CopyJob = tuple[list[tuple[torch.Tensor, torch.Tensor]], int]


class _ThreadCopier:
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


class _SyncCopier:
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


class _StreamCopier:
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


class _SlotView:
    """The experts module as its implementation sees it: slot buffers in place of the fused weights.

    ``num_experts`` is the number of slot rows, which is also the sentinel index of the routed entries that the
    current group does not compute (transformers' expert-parallel convention: they contribute nothing).
    """

    def __init__(self, module: nn.Module, slots: dict[str, torch.Tensor], rows: int, sentinels: bool) -> None:
        self._module = module
        self.__dict__.update(slots)
        self.num_experts = rows
        self._is_expert_parallel = sentinels

    def __getattr__(self, name: str):
        return getattr(self._module, name)


@dataclass
class _PrefetchCounters:
    """What the prefetches did (`OffloadEngine.prefetch`); every prefetched expert is settled by the next forward
    of its layer as used (a hit of that forward), evicted unused (by that forward's misses) or idle (resident,
    unused), so issued = used + evicted_unused + idle + those still waiting for a forward."""

    issued: int = 0
    used: int = 0
    evicted_unused: int = 0
    idle: int = 0
    hidden_ms: float = 0.0  # emulated device: copy time of the used ones that passed before their forward began

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class _Counters:
    """Exact counters over some forwards, per MoE layer."""

    num_layers: int
    expert_bytes: int
    hits: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    demand: list[int] = field(default_factory=list)  # size of the per-layer expert union
    transfers: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("hits", "misses", "demand", "transfers"):
            setattr(self, name, [0] * self.num_layers)

    def as_dict(self) -> dict:
        transfers = sum(self.transfers)
        return {
            "h2d_transfers": transfers,
            "h2d_bytes": transfers * self.expert_bytes,
            "hits": sum(self.hits),
            "misses": sum(self.misses),
            "demand": sum(self.demand),
            "per_layer": {
                "hits": list(self.hits),
                "misses": list(self.misses),
                "demand": list(self.demand),
                "h2d_transfers": list(self.transfers),
            },
        }


class RouteRecorder:
    """Routes recorded inside ``engine.record_routes()``: each token's routed expert ids per MoE layer."""

    def __init__(self, num_layers: int, top_k: int) -> None:
        self.num_layers = num_layers
        self.top_k = top_k
        self.forwards: list[torch.Tensor] = []  # one [T, L, k] tensor per target forward

    @property
    def routes(self) -> torch.Tensor:
        """[tokens, moe_layers, top_k] int64: the tokens of all recorded forwards, concatenated."""
        if not self.forwards:
            return torch.empty(0, self.num_layers, self.top_k, dtype=torch.long)
        return torch.cat(self.forwards, dim=0)


class _OffloadedLayer:
    """One MoE layer: host rows, device slot buffers, its LRU, and the forward the experts interface calls."""

    def __init__(
        self,
        engine: OffloadEngine,
        index: int,
        module: nn.Module,
        host: dict[str, torch.Tensor],
        slots: dict[str, torch.Tensor],
        capacity: int,
        inner: Callable,
    ) -> None:
        self.engine = engine
        self.index = index
        self.host = host  # name -> [E, ...] host rows
        self.slots = slots  # name -> [R, ...] device slot rows, R >= 2
        self.rows = next(iter(slots.values())).shape[0]
        self.num_experts = next(iter(host.values())).shape[0]
        self.cache = ExpertCache(capacity)
        self.slot_table: torch.Tensor | None = None  # [E] slot row of each resident expert; None after a change
        self.inner = inner
        self.prefetched: dict[int, tuple[float, float]] = {}  # expert -> copy (start, landing) since last forward
        self.prefetch_handles: list = []  # the copier's handles of those copies
        self.views = (_SlotView(module, slots, self.rows, False), _SlotView(module, slots, self.rows, True))

    def copy_jobs(self, loads: list[tuple[int, int]]) -> list[CopyJob]:
        nbytes = self.engine.expert_bytes
        return [([(self.slots[n][slot], self.host[n][e]) for n in self.slots], nbytes) for e, slot in loads]

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        # hidden_states [T, H], top_k_index [T, k] expert ids, top_k_weights [T, k] gate weights
        engine = self.engine
        with torch.no_grad():
            counts = torch.bincount(top_k_index.reshape(-1), minlength=self.num_experts)  # [E]
            union = counts.nonzero().flatten().tolist()  # increasing expert ids; a host sync
        if self.prefetch_handles:  # the prefetched slots are written before anything reads or overwrites them
            engine.copier.wait(self.prefetch_handles)
            self.prefetch_handles = []
        hits, misses, steps = self.cache.admit(union)
        if misses:
            self.slot_table = None
        engine._on_layer(self.index, len(union), len(hits), len(misses), top_k_index)
        landing = engine._settle_prefetch(self, union) if self.prefetched else None
        if engine.timeline is not None:
            engine.timeline.layer(self.index, hidden_states.shape[0], steps, landing)

        if not misses and steps:  # all hits: one call of the target's own implementation over the slot rows
            return self._compute(steps[0][1], True, hidden_states, top_k_index, top_k_weights)
        # Several groups: one row per routed entry, top-1 each, with a unit gate weight, so that every group
        # returns its entries' expert outputs [T*k, H] exactly (zero elsewhere). The gate weights are applied and
        # the top-k summed once, afterwards, as the target's own implementation does it (see _combine). How hits
        # and misses split the forward changes only the rounding (which rows a matmul computes together), not the
        # experts, the dtypes or the order of the sum: see the module docstring.
        T, k = top_k_index.shape
        entry_states = hidden_states.repeat_interleave(k, dim=0)  # [T*k, H]
        entry_index = top_k_index.reshape(T * k, 1)  # [T*k, 1]
        entry_weights = torch.ones(T * k, 1, dtype=hidden_states.dtype, device=hidden_states.device)  # [T*k, 1]
        out = None
        in_flight: list = []
        for step in steps:
            if step[0] == "load":
                in_flight += engine.copier.submit(self.copy_jobs(step[1]))
                engine._on_transfers(self.index, len(step[1]))
                continue
            _, group, wait = step
            if wait:
                started = time.perf_counter()
                engine.copier.wait(in_flight)
                engine._copy_wait_s += time.perf_counter() - started
                in_flight = []
            part = self._compute(group, len(group) == len(union), entry_states, entry_index, entry_weights)
            out = part if out is None else out.add_(part)
        if out is None:
            return torch.zeros_like(hidden_states)
        return self._combine(out, top_k_index, top_k_weights)  # [T, H]

    def _combine(self, outputs: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """The weighted sum over the top-k of the entries' expert outputs [T*k, H], in the target's arithmetic.

        grouped_mm and batched_mm multiply in the promoted dtype (float32 when the router returns float32 gate
        weights, as Mixtral's does, over bfloat16 states), sum over k in the entries' order there and cast to the
        states' dtype once. The eager forward casts each weighted entry to the states' dtype and adds the entries
        of a token in increasing expert id, rounding after each addition (``index_add_`` expert by expert).
        """
        T, k = top_k_index.shape
        dtype = outputs.dtype
        weighted = (outputs * top_k_weights.reshape(T * k, 1)).view(T, k, -1)  # [T, k, H], the promoted dtype
        if self.engine.split_arithmetic == "promote":
            return weighted.sum(dim=1).to(dtype)
        weighted = weighted.to(dtype)
        order = top_k_index.argsort(dim=1)  # [T, k]: each token's entries by increasing expert id
        tokens = torch.arange(T, device=order.device)
        total = torch.zeros_like(weighted[:, 0])  # [T, H]
        for j in range(k):
            total = total + weighted[tokens, order[:, j]]
        return total

    def _compute(
        self,
        group: list[tuple[int, int]],
        whole: bool,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
    ) -> torch.Tensor:
        """The target's experts implementation over the slot rows, for the routed entries of ``group`` only.

        A group that is the whole union was never evicted from during this forward, so the table of all resident
        experts serves it; it is rebuilt only after a change, which keeps the all-hit path short.
        """
        if whole:
            if self.slot_table is None:
                self.slot_table = self._table(self.cache.slot_of.items(), top_k_index.device)
            table = self.slot_table
        else:
            table = self._table(group, top_k_index.device)
        slot_index = table[top_k_index]  # [T, k] slot rows, the sentinel for entries outside the group
        return self.inner(self.views[0 if whole else 1], hidden_states, slot_index, top_k_weights)

    def _table(self, pairs, device: torch.device) -> torch.Tensor:
        slot_of = [self.rows] * self.num_experts  # [E], the sentinel row index for experts not listed
        for e, slot in pairs:
            slot_of[e] = slot
        return torch.tensor(slot_of, device=device)


def _offloaded_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The ``specfit_offload`` experts implementation: hands the layer to its offload engine."""
    layer = getattr(self, "_specfit_layer", None)
    if layer is None:
        raise RuntimeError(f"{type(self).__name__} uses {EXPERTS_IMPLEMENTATION!r} but was not offloaded")
    return layer.forward(hidden_states, top_k_index, top_k_weights)


ExpertsInterface.register(EXPERTS_IMPLEMENTATION, _offloaded_experts_forward)


class OffloadEngine:
    """The offloaded experts of one model; made by :func:`offload_experts`."""

    def __init__(self, model: nn.Module, config: OffloadConfig, device: torch.device | str | None = None) -> None:
        self.config = config
        self.family: MoEFamily = family_of(model)
        modules = moe_experts(model, self.family)
        if not modules:
            raise ValueError(f"no {self.family.experts_class} modules in the model")
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        inner_name = text_config._experts_implementation
        if inner_name == EXPERTS_IMPLEMENTATION:
            raise ValueError("model is already offloaded")
        if (inner_name or "eager") not in SPLIT_ARITHMETIC:
            raise ValueError(
                f"experts implementation {inner_name!r} is not supported by the offload engine: a forward split "
                f"into cache groups must weight and sum the experts as the implementation does, which is known "
                f"for {sorted(SPLIT_ARITHMETIC)} (model.set_experts_implementation(...) picks one)"
            )
        self.split_arithmetic = SPLIT_ARITHMETIC[inner_name or "eager"]
        self.num_layers = len(modules)
        self.num_experts = modules[0].num_experts
        self.top_k = getattr(text_config, self.family.top_k_attr)
        self.device = torch.device(device) if device is not None else _compute_device(model, modules, self.family)
        cuda = self.device.type == "cuda"
        if cuda and (config.link is not None or config.device is not None):
            raise ValueError("link and device emulation are for machines without a GPU; CUDA runs are measured")

        hosts = [_to_host(m, self.family, pin=cuda) for m in modules]
        if device is not None:
            _move_all_but_experts(model, modules, self.family, self.device)
        self.expert_bytes = sum(t[0].numel() * t.element_size() for t in hosts[0].values())
        self.link = Link(config.link) if config.link is not None else None
        self.timeline = Timeline(config.device) if config.device is not None else None
        if cuda:
            self.copier = _StreamCopier(config.max_inflight, self.device)
        elif self.link is not None:
            self.copier = _ThreadCopier(config.max_inflight, self.link)
        else:
            self.copier = _SyncCopier()

        if config.slots == 0:
            capacity = self.num_experts
            scratch = _slot_buffers(hosts[0], capacity, self.device)  # shared: each layer runs once per forward
        else:
            capacity = min(config.slots, self.num_experts)  # slots >= num_experts: never evicts
        self.layers: list[_OffloadedLayer] = []
        for index, (module, host) in enumerate(zip(modules, hosts)):
            same_shape = config.slots == 0 and all(host[n].shape[1:] == scratch[n].shape[1:] for n in host)
            slots = scratch if same_shape else _slot_buffers(host, capacity, self.device)
            inner = ALL_EXPERTS_FUNCTIONS.get_interface(inner_name, type(module).forward.__wrapped__)
            layer = _OffloadedLayer(self, index, module, host, slots, capacity, inner)
            module._specfit_layer = layer
            self.layers.append(layer)
        model.set_experts_implementation(EXPERTS_IMPLEMENTATION)

        # Hook the decoder stack, not the LM head model, so that calling the base model directly counts too.
        root = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else model
        if not any(m is modules[0] for m in root.modules()):
            root = model
        self._hooks = [
            root.register_forward_pre_hook(lambda *_: self._begin_forward()),
            root.register_forward_hook(lambda *_: self._end_forward(), always_call=True),
        ]
        self._recorder: RouteRecorder | None = None
        self._forward_routes: list[torch.Tensor | None] = [None] * self.num_layers
        self.reset_stats()

    # ----- labels ---------------------------------------------------------------------------------------------

    @property
    def link_emulated(self) -> bool:
        """Whether timings are emulated (a link, or a whole device): every timing of such a run must say so."""
        return self.link is not None or self.timeline is not None

    @property
    def timing_label(self) -> str:
        """A label for timings taken on this engine, e.g. ``"emulated link (...)"`` or ``"cuda H2D"``."""
        if self.timeline is not None:
            return self.timeline.model.label
        if self.link is not None:
            return self.link.model.label
        if self.device.type == "cuda":
            return "cuda H2D (pinned host, copy streams)"
        return f"{self.device.type} memory copies (no link)"

    # ----- counters -------------------------------------------------------------------------------------------

    def reset_stats(self) -> None:
        self._total = _Counters(self.num_layers, self.expert_bytes)
        self._current = _Counters(self.num_layers, self.expert_bytes)
        self.last_forward: dict = self._current.as_dict()
        self._forwards = 0
        self._prefetch = _PrefetchCounters()
        self._clear_s = 0.0
        self._copy_wait_s = 0.0
        if self.link is not None:
            self.link.reset()
        if self.timeline is not None:
            self.timeline.reset()

    @property
    def h2d_transfers(self) -> int:
        """Cumulative host-to-device expert transfers: the one counter the decode loop reads every cycle."""
        return sum(self._total.transfers)

    def stats(self) -> dict:
        """Cumulative counters since the last ``reset_stats()``; per-layer lists under ``"per_layer"``."""
        out = self._total.as_dict()
        out.update(
            forwards=self._forwards,
            clear_s=self._clear_s,
            copy_wait_s=self._copy_wait_s,  # time compute waited for copies (CPU; CUDA waits on device)
            link_s=self.link.busy_s if self.link is not None else 0.0,  # modelled link time, summed over copies
            link_emulated=self.link_emulated,
            timing_label=self.timing_label,
            prefetch=self._prefetch.as_dict(),
        )
        if self.timeline is not None:
            out["device"] = self.timeline.as_dict()  # the virtual clock: modelled time, host work, copy stall
        return out

    def _on_layer(self, index: int, demand: int, hits: int, misses: int, top_k_index: torch.Tensor) -> None:
        for counters in (self._total, self._current):
            counters.demand[index] += demand
            counters.hits[index] += hits
            counters.misses[index] += misses
        if self._recorder is not None:
            self._forward_routes[index] = top_k_index.detach().to("cpu", torch.long, copy=True)  # [T, k]

    def _settle_prefetch(self, layer: _OffloadedLayer, union: list[int]) -> dict[int, float]:
        """Settle the experts prefetched into ``layer`` since its last forward, now that this forward admitted
        ``union``; return those of them still in flight as it begins (expert -> landing, virtual seconds)."""
        counters, timeline, needed = self._prefetch, self.timeline, set(union)
        landing = {}
        for e, (start, lands) in layer.prefetched.items():
            if e in needed:
                counters.used += 1
                if timeline is not None:
                    counters.hidden_ms += min(max(0.0, (timeline.started - start) * 1e3), timeline.model.copy_ms)
                    if lands > timeline.started:
                        landing[e] = lands
            elif e in layer.cache.slot_of:
                counters.idle += 1
            else:
                counters.evicted_unused += 1
        layer.prefetched = {}
        return landing

    def _on_transfers(self, index: int, transfers: int) -> None:
        self._total.transfers[index] += transfers
        self._current.transfers[index] += transfers

    def _begin_forward(self) -> None:
        if self.timeline is not None:
            self.timeline.begin()
        self._current = _Counters(self.num_layers, self.expert_bytes)
        self._forward_routes = [None] * self.num_layers
        if self.config.slots == 0:
            self.clear_cache()

    def _end_forward(self) -> None:
        if self.timeline is not None:
            self.timeline.end()
        self._forwards += 1
        self.last_forward = self._current.as_dict()
        if self._recorder is not None and all(r is not None for r in self._forward_routes):
            self._recorder.forwards.append(torch.stack(self._forward_routes, dim=1))  # [T, L, k]

    # ----- cache control --------------------------------------------------------------------------------------

    def resident(self) -> np.ndarray:
        """[L, N] bool: the experts each layer's cache holds now, which the next forward finds as hits. Without an
        expert cache (slots 0, cleared before every forward) nothing is resident."""
        resident = np.zeros((self.num_layers, self.num_experts), dtype=bool)  # [L, N]
        if self.config.slots > 0:
            for index, layer in enumerate(self.layers):
                resident[index, list(layer.cache.slot_of)] = True
        return resident

    def clear_cache(self) -> None:
        """Empty every layer's slots (timed into ``stats()["clear_s"]``); a prefetch not yet settled counts as
        evicted unused."""
        started = time.perf_counter()
        for layer in self.layers:
            if layer.prefetch_handles:
                self.copier.wait(layer.prefetch_handles)
                layer.prefetch_handles = []
            self._prefetch.evicted_unused += len(layer.prefetched)
            layer.prefetched = {}
            layer.cache.clear()
            layer.slot_table = None
        self._clear_s += time.perf_counter() - started

    # ----- prefetch -------------------------------------------------------------------------------------------

    def prefetch(self, wanted, protect) -> int:
        """Copy experts into their layers' caches ahead of the next forward; returns how many copies were issued.

        ``wanted``: (layer, expert) pairs, most valuable first; ``protect[l]``: the experts layer l must keep (those
        the subtree about to be verified is predicted to need). Each expert not resident takes its slot as that
        forward would admit it (`ExpertCache.prefetch`): a free slot, else the least recently used expert that is
        neither protected nor prefetched since the layer's last forward; an expert with no such victim is skipped.
        The copies go through the forward's own copier (the same ``max_inflight`` streams or lanes) and, on an
        emulated device, onto the one modelled link from now on, so a forward that begins before they land waits
        only for what is left of them and queues its own misses behind them. They are left to complete: the next
        forward of the layer waits for them before it reads or overwrites a slot. Outputs and logits are those of
        any other cache state. Without an expert cache (slots 0, cleared before every forward) nothing is copied.
        """
        if self.config.slots == 0:
            return 0
        loads: dict[int, list[tuple[int, int]]] = {}  # layer -> (expert, slot), in the order given
        keep: dict[int, set[int]] = {}  # layer -> what it must not evict: protected, or prefetched since its forward
        for index, e in wanted:
            layer = self.layers[index]
            if e in layer.cache.slot_of:
                continue
            if index not in keep:
                keep[index] = set(protect[index]) | layer.prefetched.keys()
            placed = layer.cache.prefetch(e, keep[index])
            if placed is None:
                continue
            layer.slot_table = None
            layer.prefetched[e] = self.timeline.copy_ahead() if self.timeline is not None else (0.0, 0.0)
            keep[index].add(e)
            loads.setdefault(index, []).append((e, placed[0]))
        for index, pairs in loads.items():
            layer = self.layers[index]
            layer.prefetch_handles += self.copier.submit(layer.copy_jobs(pairs), ahead=True)
            self._total.transfers[index] += len(pairs)
        issued = sum(map(len, loads.values()))
        self._prefetch.issued += issued
        return issued

    @property
    def copy_ms(self) -> float | None:
        """What one expert copy takes on the link (ms): the emulated device's or link's; None where it is measured."""
        if self.timeline is not None:
            return self.timeline.model.copy_ms
        if self.link is not None:
            return self.link.model.copy_s(self.expert_bytes) * 1e3
        return None

    def link_backlog_ms(self) -> float:
        """How long the link still needs for the copies issued so far (ms from now; 0 where it is not modelled)."""
        if self.timeline is not None:
            return self.timeline.backlog_ms()
        if self.link is not None:
            return self.link.backlog_ms()
        return 0.0

    def in_flight_ms(self) -> np.ndarray:
        """[L, N] float: what is left of each prefetched expert's copy now (ms; 0 once landed, and where the link
        is not modelled)."""
        left = np.zeros((self.num_layers, self.num_experts))  # [L, N]
        if self.timeline is not None:
            for index, layer in enumerate(self.layers):
                for e, (_, lands) in layer.prefetched.items():
                    left[index, e] = self.timeline.in_flight_ms(lands)
        return left

    @contextmanager
    def record_routes(self) -> Iterator[RouteRecorder]:
        """Record the routes of every target forward inside the block (``rec.routes``: [tokens, layers, k])."""
        recorder = RouteRecorder(self.num_layers, self.top_k)
        self._recorder = recorder
        try:
            yield recorder
        finally:
            self._recorder = None

    def emulate_drafter(self, drafter: nn.Module) -> None:
        """On an emulated device, make every forward of ``drafter`` advance the virtual clock by the device's
        ``draft_ms`` (`Timeline.drafted`; its CPU time is recorded for information only)."""
        timeline = self.timeline
        if timeline is None:
            return
        started, rows = [0.0], [0]

        def begin(_, args) -> None:
            started[0] = time.perf_counter()
            rows[0] = args[0].shape[-1] if args and isinstance(args[0], torch.Tensor) else 1  # input_ids [B, T]

        def end(*_) -> None:
            timeline.drafted(rows[0], time.perf_counter() - started[0])

        self._hooks += [drafter.register_forward_pre_hook(begin), drafter.register_forward_hook(end)]

    def close(self) -> None:
        """Stop the copy workers and remove the forward hooks (the model stays offloaded)."""
        for hook in self._hooks:
            hook.remove()
        self.copier.close()


def offload_experts(model: nn.Module, config: OffloadConfig, device: torch.device | str | None = None) -> OffloadEngine:
    """Offload the routed experts of ``model`` (in place) and return the engine that serves them.

    ``device`` is where everything but the experts runs; by default, where the model's other weights are. When
    given, the rest of the model is moved there and the experts to host memory (pinned for CUDA).
    """
    return OffloadEngine(model, config, device)


def make_engine(model: nn.Module, slots: int, max_inflight: int = 2, link: dict | None = None,
                torch_device: str = "cpu", emulate: dict | None = None) -> OffloadEngine:
    """`offload_experts` from a stage's spec: ``link`` is null or {bandwidth_gbps: GB/s, latency_us: us}; ``emulate``
    is null or a device entry's emulated GPU ({name, fixed_ms, token_ms, expert_ms, copy_ms, draft_ms})."""
    if link is not None:
        link = LinkModel(link["bandwidth_gbps"] * 1e9, link.get("latency_us", 0.0) * 1e-6)
    device = DeviceModel.from_spec(emulate) if emulate is not None else None
    config = OffloadConfig(slots, max_inflight=max_inflight, link=link, device=device)
    return offload_experts(model, config, device=torch_device)


def _compute_device(model: nn.Module, modules: list[nn.Module], family: MoEFamily) -> torch.device:
    expert_params = {id(getattr(m, n)) for m in modules for n in family.weights}
    for param in model.parameters():
        if id(param) not in expert_params:
            return param.device
    return torch.device("cpu")


def _to_host(module: nn.Module, family: MoEFamily, pin: bool) -> dict[str, torch.Tensor]:
    """Move one experts module's fused weights to host memory (they stay its parameters); the host rows."""
    host = {}
    for name in family.weights:
        param = getattr(module, name)
        data = param.data if param.device.type == "cpu" else param.data.to("cpu")
        if pin and not data.is_pinned():
            data = data.pin_memory()
        param.data = data
        host[name] = param.detach()  # [E, ...]
    return host


def _move_all_but_experts(model: nn.Module, modules: list[nn.Module], family: MoEFamily, device: torch.device) -> None:
    """``model.to(device)`` leaving the experts' host storage where it is."""
    held = [(getattr(m, n), getattr(m, n).data) for m in modules for n in family.weights]
    for param, _ in held:
        param.data = torch.empty(0, dtype=param.dtype)
    model.to(device)
    for param, data in held:
        param.data = data


def _slot_buffers(host: dict[str, torch.Tensor], capacity: int, device: torch.device) -> dict[str, torch.Tensor]:
    # At least two rows: transformers' grouped_mm counts tokens per row with histc, which takes min == max == 0
    # (a single row) to mean "use the data's range" and would then count the sentinel entries.
    # Zeros, not empty: batched_mm multiplies the rows it reads for sentinel entries by a zero weight, and an
    # uninitialized row may hold NaN.
    rows = max(capacity, 2)
    return {n: torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=device) for n, t in host.items()}
