"""The offload engine every method runs on: host-resident experts, an LRU of device slots per MoE layer."""

from specfit.device import DeviceModel
from specfit.engine.families import FAMILIES, MoEFamily, family_of
from specfit.engine.link import LinkModel, link_for_copy_share
from specfit.engine.offload import (
    EXPERTS_IMPLEMENTATION,
    ExpertCache,
    OffloadConfig,
    OffloadEngine,
    RouteRecorder,
    make_engine,
    offload_experts,
)

__all__ = [
    "EXPERTS_IMPLEMENTATION",
    "DeviceModel",
    "FAMILIES",
    "ExpertCache",
    "LinkModel",
    "MoEFamily",
    "OffloadConfig",
    "OffloadEngine",
    "RouteRecorder",
    "family_of",
    "link_for_copy_share",
    "make_engine",
    "offload_experts",
]
