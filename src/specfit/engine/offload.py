"""Expert offloading for Hugging Face MoE models: host storage, an LRU expert cache of device slots per layer.

Every expert of every MoE layer lives in host memory (pinned when the device is CUDA). Each layer owns ``slots``
device slots, an LRU cache that starts empty (`specfit.engine.cache`). The engine registers itself as an experts
implementation of transformers (``ALL_EXPERTS_FUNCTIONS``), so the target's own router picks the experts and the
target's own experts implementation (``grouped_mm``, ``eager``, ...) does the math, reading the slot buffers in
place of the fused weights through a thin view (`specfit.engine.layer`, which also states what the numbers
guarantee). Nothing of the modeling code is copied. The copies run on a copier (`specfit.engine.copiers`); the
counters are in `specfit.engine.counters`.

``slots = 0`` means no expert cache: the cache is cleared (and the clearing timed) before every target forward, prefill
included; within a layer forward an expert shared by several tokens is loaded once, into a scratch of ``num_experts``
slots shared by all layers.

On a resident device (`specfit.engine.resident`: every expert in memory) each layer holds all its experts from the
start, expert e in slot e: nothing is ever copied and clearing the cache keeps them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from specfit.engine.copiers import StreamCopier, SyncCopier, ThreadCopier
from specfit.engine.counters import Counters, PrefetchCounters, RouteRecorder
from specfit.engine.device import DeviceModel, Timeline
from specfit.engine.families import MoEFamily, family_of, moe_experts
from specfit.engine.layer import (
    EXPERTS_IMPLEMENTATION,
    SPLIT_ARITHMETIC,
    OffloadedLayer,
    compute_device,
    move_all_but_experts,
    slot_buffers,
    to_host,
)
from specfit.engine.link import Link, LinkModel
from specfit.engine.prefetch import prefetch
from specfit.engine.resident import ResidentFit, fit
from specfit.errors import SpecFitError

if TYPE_CHECKING:
    from specfit.engine.pricing import PricedSlots


@dataclass(frozen=True)
class OffloadConfig:
    """How the experts are offloaded: ``slots`` device slots per layer (0: no expert cache)."""

    slots: int
    max_inflight: int = 2  # host-to-device copies in flight at most
    link: LinkModel | None = None  # emulated link for CPU-only machines; None: copies run at memory speed
    device: DeviceModel | None = None  # emulated GPU for CPU-only machines (its own link): specfit.engine.device
    resident: ResidentFit | None = None  # every expert in memory, costs from measured widths: specfit.engine.resident
    # every forward computes its union from the host rows in one call, its copies counted and modelled but not made,
    # where the host rows are where the device computes and no copy is timed on the wall clock; None: exactly there (a
    # CPU engine without an emulated link); False: from the slot rows, in groups as the copies land, as a GPU does
    # (`OffloadedLayer.run`)
    host_compute: bool | None = None

    def __post_init__(self) -> None:
        if self.slots < 0 or self.max_inflight < 1:
            raise ValueError(f"need slots >= 0 and max_inflight >= 1, got {self}")
        if self.link is not None and self.device is not None:
            raise ValueError("an emulated device models its own link (copy_ms): give a link or a device, not both")
        if self.resident is not None and (self.link is not None or self.device is not None):
            raise ValueError("a resident device copies nothing: give it no link and no emulated GPU")


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
        self.experts_implementation = inner_name or "eager"
        self.split_arithmetic = SPLIT_ARITHMETIC[self.experts_implementation]
        self.num_layers = len(modules)
        self.num_experts = modules[0].num_experts
        self.top_k = getattr(text_config, self.family.top_k_attr)
        self.device = torch.device(device) if device is not None else compute_device(model, modules, self.family)
        cuda = self.device.type == "cuda"
        if cuda and (config.link is not None or config.device is not None or config.resident is not None):
            raise ValueError("link and device emulation are for machines without a GPU; CUDA runs are measured")
        self.all_resident = config.resident is not None
        if self.all_resident and config.slots < self.num_experts:
            raise SpecFitError(
                f"a resident device holds every expert of each layer: {config.slots} slots, but the model has "
                f"{self.num_experts} experts per layer; give the run's slots (config key 'runs.N.slots', and "
                f"'models.<model>.main_slots.<device>') {self.num_experts}")

        hosts = [to_host(m, self.family, pin=cuda) for m in modules]
        if device is not None:
            move_all_but_experts(model, modules, self.family, self.device)
        self.expert_bytes = sum(t[0].numel() * t.element_size() for t in hosts[0].values())
        self.link = Link(config.link) if config.link is not None else None
        self.host_compute = config.host_compute
        if self.host_compute is None:
            self.host_compute = self.device.type == "cpu" and self.link is None
        elif self.host_compute and self.device.type != "cpu":
            raise ValueError("host_compute is for a CPU engine: a GPU computes from its slot rows")
        self.timeline = Timeline(config.device) if config.device is not None else None
        if self.all_resident:
            self.timeline = Timeline(config.resident.for_toy(self.num_layers, self.top_k))
        if cuda:
            self.copier = StreamCopier(config.max_inflight, self.device)
        elif self.link is not None:
            self.copier = ThreadCopier(config.max_inflight, self.link)
        else:
            self.copier = SyncCopier()

        if config.slots == 0:
            capacity = self.num_experts
            scratch = slot_buffers(hosts[0], capacity, self.device)  # shared: each layer runs once per forward
        else:
            capacity = min(config.slots, self.num_experts)  # slots >= num_experts: never evicts
        self.layers: list[OffloadedLayer] = []
        for index, (module, host) in enumerate(zip(modules, hosts)):
            same_shape = config.slots == 0 and all(host[n].shape[1:] == scratch[n].shape[1:] for n in host)
            slots = scratch if same_shape else slot_buffers(host, capacity, self.device)
            inner = ALL_EXPERTS_FUNCTIONS.get_interface(inner_name, type(module).forward.__wrapped__)
            layer = OffloadedLayer(self, index, module, host, slots, capacity, inner)
            module._specfit_layer = layer
            self.layers.append(layer)
            if self.all_resident:  # every expert in its slot from the start, off the counters and the clock
                layer.cache.fill()
                with torch.no_grad():
                    for n, rows in host.items():
                        slots[n][: self.num_experts].copy_(rows)
        model.set_experts_implementation(EXPERTS_IMPLEMENTATION)

        # Hook the decoder stack, not the LM head model, so that calling the base model directly counts too.
        root = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else model
        if not any(m is modules[0] for m in root.modules()):
            root = model
        self._hooks = [root.register_forward_pre_hook(lambda *_: self.begin_forward()),
                       root.register_forward_hook(lambda *_: self.end_forward(), always_call=True)]
        self._recorder: RouteRecorder | None = None
        # inside `specfit.engine.replay.record_forwards`: the forwards so far, in order, each ("target", its routes
        # [T, L, k], as the route recorder keeps them) or ("drafter", rows)
        self.forward_log: list[tuple[str, object]] | None = None
        self.row_calls = None  # a layer's RowCalls while an exact verify records or replays its rows
        self._forward_routes: list[torch.Tensor | None] = [None] * self.num_layers
        self.priced: list[PricedSlots] = []  # other slot counts priced on these forwards (`specfit.engine.pricing`)
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
        self._total = Counters(self.num_layers, self.expert_bytes)
        self._current = Counters(self.num_layers, self.expert_bytes)
        self.last_forward: dict = self._current.as_dict()
        self._forwards = 0
        self._prefetch = PrefetchCounters()
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
        if self._recorder is not None or self.forward_log is not None:
            self._forward_routes[index] = top_k_index.detach().to("cpu", torch.long, copy=True)  # [T, k]

    def _settle_prefetch(self, layer: OffloadedLayer, union: list[int]) -> dict[int, float]:
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

    def begin_forward(self) -> None:  # also called by a caller that runs the layers itself (the exact verify)
        if self.timeline is not None:
            self.timeline.begin()
        self._current = Counters(self.num_layers, self.expert_bytes)
        self._forward_routes = [None] * self.num_layers
        if self.config.slots == 0:
            self.clear_cache(priced=False)
        for priced in self.priced:
            priced.begin()

    def end_forward(self) -> None:
        if self.timeline is not None:
            self.timeline.end()
        self._forwards += 1
        self.last_forward = self._current.as_dict()
        if (self._recorder is not None or self.forward_log is not None) and all(
                r is not None for r in self._forward_routes):
            routes = torch.stack(self._forward_routes, dim=1)  # [T, L, k]
            if self._recorder is not None:
                self._recorder.forwards.append(routes)
            if self.forward_log is not None:
                self.forward_log.append(("target", routes))

    # ----- cache control --------------------------------------------------------------------------------------

    def resident(self) -> np.ndarray:
        """[L, N] bool: the experts each layer's cache holds now, which the next forward finds as hits. Without an
        expert cache (slots 0, cleared before every forward) nothing is resident."""
        resident = np.zeros((self.num_layers, self.num_experts), dtype=bool)  # [L, N]
        if self.config.slots > 0:
            for index, layer in enumerate(self.layers):
                resident[index, list(layer.cache.slot_of)] = True
        return resident

    def clear_cache(self, priced: bool = True) -> None:
        """Empty every layer's slots (timed into ``stats()["clear_s"]``), and the caches of the slot counts priced
        beside them unless ``priced`` is False; a prefetch not yet settled counts as evicted unused."""
        started = time.perf_counter()
        for layer in self.layers:
            if layer.prefetch_handles:
                self.copier.wait(layer.prefetch_handles)
                layer.prefetch_handles = []
            self._prefetch.evicted_unused += len(layer.prefetched)
            layer.prefetched = {}
            if not self.all_resident:  # a resident device's experts never leave
                layer.cache.clear()
            layer.slot_table = None
        self._clear_s += time.perf_counter() - started
        for other in self.priced if priced else ():
            other.clear()

    # ----- prefetch -------------------------------------------------------------------------------------------

    def prefetch(self, wanted, protect) -> int:
        """Copy experts into their layers' caches ahead of the next forward, as `specfit.engine.prefetch.prefetch`
        says; returns how many copies were issued."""
        return prefetch(self, wanted, protect)

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
            if self.forward_log is not None:
                self.forward_log.append(("drafter", rows[0]))

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
    is null, a device entry's emulated GPU ({name, fixed_ms, token_ms, expert_ms, copy_ms, draft_ms}), or
    {resident: the entry's resident mapping} (`specfit.engine.resident`: every expert in memory, at least as many
    slots as the model's experts per layer)."""
    if link is not None:
        link = LinkModel(link["bandwidth_gbps"] * 1e9, link.get("latency_us", 0.0) * 1e-6)
    device = resident = None
    if emulate is not None and "resident" in emulate:
        resident = fit(emulate["resident"])
    elif emulate is not None:
        device = DeviceModel.from_spec(emulate)
    config = OffloadConfig(slots, max_inflight=max_inflight, link=link, device=device, resident=resident)
    return offload_experts(model, config, device=torch_device)
