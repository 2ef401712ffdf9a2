"""The offload engine's exact counters: per-layer hits, misses, demand and transfers over some forwards
(`Counters`), what the prefetches did (`PrefetchCounters`), and the routes recorded inside
``OffloadEngine.record_routes()`` (`RouteRecorder`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


@dataclass
class PrefetchCounters:
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
class Counters:
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
