"""Speculative decoding on the offloaded target: the candidate pool, tree verification, methods, requests."""

from specfit.spec.methods import METHODS, Decision, Method, MethodConfig, build_method, register_method
from specfit.spec.pool import CandidatePool
from specfit.spec.request import CYCLE_SCHEMA, REQUEST_SCHEMA, Limits, RequestResult, decode_request
from specfit.spec.routes import ATLAS_SCHEMA, AtlasRoutes, LiveRoutes, NoisyRoutes, atlas_row, atlas_table

__all__ = [
    "ATLAS_SCHEMA", "AtlasRoutes", "CYCLE_SCHEMA", "CandidatePool", "Decision", "LiveRoutes", "Limits", "METHODS",
    "Method", "MethodConfig", "NoisyRoutes", "REQUEST_SCHEMA", "RequestResult", "atlas_row", "atlas_table",
    "build_method", "decode_request", "register_method",
]
