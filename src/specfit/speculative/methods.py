"""Decoding methods: a drafting policy plus a selection rule, registered by name.

The request loop drafts the candidate pool one level at a time, up to ``max_depth`` (fewer near the length
limit), and after each level asks the method's ``select`` whether to verify now and which nodes. A method is a
subclass of `Method` in one module, registered with ``@register_method("name")``, plus one config entry.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from specfit.errors import SpecFitError
from specfit.io import read_json
from specfit.selection.pool import CandidatePool
from specfit.selection.selectors import holds_level, select_specfit, select_top_prob
from specfit.speculative.config import MethodConfig
from specfit.speculative.cycle import Cycle
from specfit.speculative.routes import LiveRoutes, find_source, route_source_for


@dataclass(frozen=True)
class Decision:
    """The subtree to verify and the deepest pool level the method asked for."""

    nodes: tuple[int, ...]  # sorted draft node ids, root excluded
    drafted_levels: int


class Method:
    name: ClassVar[str]
    drafts: ClassVar[bool] = True  # False: no drafter, every cycle verifies the root alone
    live: LiveRoutes | None = None  # the route source that builds an atlas as it goes (SpecFit's atlas build)

    def __init__(self, config: MethodConfig):
        self.config = config

    @classmethod
    def from_inputs(cls, config: MethodConfig, inputs: dict, seed: int, num_experts: int) -> "Method":
        """Build the method from the decode rule's inputs (coefficients, atlas, ...)."""
        return cls(config)

    @property
    def max_depth(self) -> int:
        return self.config.max_depth if self.drafts else 0

    def select(self, cycle: Cycle, pool: CandidatePool, final: bool) -> Decision | None:
        """After a level is drafted: the nodes to verify, or None to draft the next level. ``final``: no next."""
        raise NotImplementedError


METHODS: dict[str, type[Method]] = {}


def register_method(name: str):
    def register(cls: type[Method]) -> type[Method]:
        cls.name = name
        METHODS[name] = cls
        return cls

    return register


def build_method(
    config: MethodConfig | dict, inputs: dict | None = None, seed: int = 0, num_experts: int = 0
) -> Method:
    """The registered method ``config.name``; ``inputs`` are the decode rule's input paths.

    A name ``module:name`` imports ``module`` first, so a method can live in a module of its own, in this package
    or outside it, and register itself with ``@register_method(name)`` when imported.
    """
    config = config if isinstance(config, MethodConfig) else MethodConfig(**config)
    module, sep, name = config.name.rpartition(":")
    if sep:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise SpecFitError(f"method {config.name!r}: cannot import {module!r} ({err})") from err
        config = dataclasses.replace(config, name=name)
    if config.name not in METHODS:
        raise SpecFitError(f"unknown method {config.name!r}; registered: {sorted(METHODS)}")
    return METHODS[config.name].from_inputs(config, inputs or {}, seed, num_experts)


@register_method("ar")
class AR(Method):
    """Serial greedy decoding: no drafter, one target forward per output token."""

    drafts = False

    def select(self, cycle, pool, final):
        return Decision((), 0)


@register_method("eagle3")
class Eagle3(Method):
    """EAGLE-3: the full pool, then the k_max nodes of highest path probability (all when the pool has fewer)."""

    def select(self, cycle, pool, final):
        if not final:
            return None
        return Decision(select_top_prob(pool.view(), self.config.k_max).nodes, pool.depth)


@register_method("specfit")
class SpecFit(Method):
    """Eq. 5 with adaptive depth (Section 3.3): after level d, select over V<=d and draft on only if the
    selection holds a level-d node; at the last level select over the whole pool.

    With a route source that needs the full pool (the atlas build), the pool is drafted to full depth, the
    routes are queried once and the rule is replayed on V<=1, V<=2, ...; ``drafted_levels`` is where it stops.
    """

    def __init__(self, config: MethodConfig, b, beta: float, routes, num_experts: int):
        super().__init__(config)
        self.b = np.asarray(b, dtype=np.float64)
        self.beta = float(beta)
        self.route_source = routes
        self.num_experts = num_experts
        self.live = find_source(routes, LiveRoutes)  # a noisy source over live routes still builds the exact atlas

    @classmethod
    def from_inputs(cls, config, inputs, seed, num_experts):
        if "coefficients" not in inputs:
            raise SpecFitError("method specfit needs the `coefficients` input (the fitted b and beta)")
        coefficients = read_json(inputs["coefficients"])
        routes = route_source_for(config, inputs, seed, num_experts)
        return cls(config, coefficients["b"], coefficients["beta"], routes, num_experts)

    def select(self, cycle, pool, final):
        if pool.n == 0:  # at the length limit: nothing to choose, no routes to read
            return Decision((), 0)
        if self.route_source.full_pool and not final:
            return None
        full = pool.view(self.route_source.routes(cycle, pool), self.num_experts)
        first = 1 if self.route_source.full_pool else pool.depth
        for depth in range(first, pool.depth + 1):
            view = full if depth == pool.depth else full.upto_level(depth)  # V<=d; the whole pool at its depth
            chosen = select_specfit(view, self.b, self.beta, self.config.k_max)
            if (final and depth == pool.depth) or not holds_level(view, chosen, depth):
                return Decision(chosen.nodes, depth)
        return None
