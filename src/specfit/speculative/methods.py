"""Decoding methods: a drafting policy plus a selection rule, one class per method kind.

The request loop drafts the candidate pool one level at a time, up to ``max_depth`` (fewer near the length
limit), and after each level asks the method's ``select`` whether to verify now and which nodes. A method is a
subclass of `Method`; its kind (`specfit.speculative.kinds`) names the class and declares what the workflow and
the report ask of it. The prefetching methods are in `specfit.speculative.prefetching`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from specfit.errors import SpecFitError
from specfit.io import read_json
from specfit.selection.calibration import OnlineCalibration
from specfit.selection.coefficients import DraftCost, cache_aware_cost
from specfit.selection.lookahead import chain_pays
from specfit.selection.pool import CandidatePool, GrowingPool, Pool
from specfit.selection.selectors import Selection, holds_level, select_specfit, select_specfit_ca, select_top_prob
from specfit.speculative.config import MethodConfig
from specfit.speculative.cycle import Cycle
from specfit.speculative.kinds import Kind, kind, register_kind
from specfit.speculative.routes import LiveRoutes, find_source, route_source_for
from specfit.speculative.skipping import Skipping

EXPERT_TERM_TOL = 1e-12  # a cost coefficient per expert below this share of b_0 is no expert term (`asks_routes`)


@dataclass(frozen=True)
class Decision:
    """The subtree to verify and the deepest pool level the method asked for."""

    nodes: tuple[int, ...]  # sorted draft node ids, root excluded
    drafted_levels: int


class Method:
    live: LiveRoutes | None = None  # the route source that builds an atlas as it goes (SpecFit's atlas build)

    def __init__(self, config: MethodConfig):
        self.config = config

    @classmethod
    def from_inputs(cls, config: MethodConfig, inputs: dict, seed: int, num_experts: int) -> Method:
        """Build the method from the decode rule's inputs (coefficients, atlas, ...)."""
        return cls(config)

    @property
    def name(self) -> str:
        """Its kind's name."""
        return self.config.name

    @cached_property
    def kind(self) -> Kind:
        """Its kind's declaration, looked up once (`drafts` and `max_depth` read it every cycle)."""
        return kind(self.config.name)

    @property
    def drafts(self) -> bool:
        """False: no drafter, every cycle verifies the root alone (the kind's declaration)."""
        return self.kind.drafts

    @property
    def max_depth(self) -> int:
        return self.config.max_depth if self.drafts else 0

    def select(self, cycle: Cycle, pool: CandidatePool, final: bool) -> Decision | None:
        """After a level is drafted: the nodes to verify, or None to draft the next level. ``final``: no next."""
        raise NotImplementedError

    def wants_draft(self, cycle: Cycle) -> bool:
        """Before level 1: whether this cycle drafts at all (False: verify the root alone, drafter untouched)."""
        return True

    def verified(self, pool: CandidatePool, decision: Decision, accepted: list[int]) -> None:
        """After verification, before the next cycle: the pool, what was verified and the accepted node ids (a path
        from the root)."""

    def committed(self, cycle: Cycle, decision: Decision, accepted: int) -> None:
        """After the cycle committed: how many of the verified draft nodes the target accepted."""

    def reset(self) -> None:
        """Forget what earlier requests taught (the stream calls it after its warm-up request)."""

    def begin(self, question_id: int) -> None:
        """Before each request, off its timers: the question it decodes (a cross-fitted tuned tree is its fold's)."""

    def residency(self, cycle: Cycle) -> np.ndarray | None:
        """[L, N] bool: the experts each layer's cache held as ``cycle`` selected, as the method read them for its
        cost; None for a method that reads no cache, or a cycle in which it read none. Reading it queries nothing."""
        return None

    def in_flight(self, cycle: Cycle) -> np.ndarray | None:
        """[L, N] float: of `residency`, the fraction of each expert's copy still to come as ``cycle`` selected (a
        prefetch in flight); None where the method reads none."""
        return None


def register_method(name: str, *, drafts: bool = True, reads_routes: bool = False):
    """Register a method class of your own as kind ``name`` (`specfit.speculative.kinds.register_kind`), named
    ``module:name`` in the config. ``reads_routes``: its runs read coefficients and an atlas (or a learned
    predictor), as SpecFit's do; ``drafts``: False for a method without a drafter."""

    def register(cls: type[Method]) -> type[Method]:
        register_kind(Kind(name, f"{cls.__module__}:{cls.__qualname__}", drafts=drafts, reads_routes=reads_routes))
        return cls

    return register


def build_method(
    config: MethodConfig | dict, inputs: dict | None = None, seed: int = 0, num_experts: int = 0
) -> Method:
    """The method of kind ``config.name``; ``inputs`` are the decode rule's input paths.

    A name ``module:name`` imports ``module`` first, so a method can live in a module of its own, in this package
    or outside it, and register its kind with ``@register_method(name)`` when imported.
    """
    config = config if isinstance(config, MethodConfig) else MethodConfig(**config)
    k = kind(config.name)
    config = dataclasses.replace(config, name=k.name)
    return k.implementation().from_inputs(config, inputs or {}, seed, num_experts)


class AR(Method):
    """Serial greedy decoding: no drafter (its kind does not draft), one target forward per output token."""

    def select(self, cycle, pool, final):
        return Decision((), 0)


class Eagle3(Method):
    """EAGLE-3: the full pool, then the k_max nodes of highest path probability (all when the pool has fewer)."""

    def select(self, cycle, pool, final):
        if not final:
            return None
        return Decision(select_top_prob(pool.view(), self.config.k_max).nodes, pool.depth)


class SpecFit(Method):
    """Eq. 5 with adaptive depth (Section 3.3): after level d, select over V<=d and draft on only if the
    selection holds a level-d node; at the last level select over the whole pool.

    With a route source that needs the full pool (the atlas build), the pool is drafted to full depth, the
    routes are queried once and the rule is replayed on V<=1, V<=2, ...; ``drafted_levels`` is where it stops.

    Beyond the paper (off by default, `MethodConfig`): ``calibration: online`` selects with commit probabilities
    calibrated from earlier verifications (`specfit.selection.calibration`), and ``lookahead`` drafts on also while a
    chain through the levels not drafted yet could pay (`chain_pays`), where the paper's rule sees one level only.
    """

    DEFAULTS = {"calibration": "none", "lookahead": False, "skip": False}  # the options a config entry leaves unset

    def __init__(self, config: MethodConfig, b, beta: float, routes, num_experts: int):
        super().__init__(config)
        self.b = np.asarray(b, dtype=np.float64)
        self.beta = float(beta)
        self.route_source = routes
        self.num_experts = num_experts
        self.live = find_source(routes, LiveRoutes)  # a noisy source over live routes still builds the exact atlas
        self.calibration = OnlineCalibration(config.max_depth) if self.option("calibration") == "online" else None
        self._calibrated: tuple[CandidatePool | None, list[float]] = (None, [])  # the pool and its p̃ so far
        self._growing: tuple[CandidatePool | None, GrowingPool | None] = (None, None)  # the pool and its view so far

    def option(self, name: str):
        """An option beyond the paper (`MethodConfig`): the config entry's, else the kind's default (`DEFAULTS`)."""
        value = getattr(self.config, name)
        return self.DEFAULTS[name] if value is None else value

    def reset(self):
        if self.calibration is not None:
            self.calibration.reset()

    def verified(self, pool, decision, accepted):
        if self.calibration is None or not decision.nodes:
            return
        grown, view = self._growing
        if grown is pool:  # the grown view holds the pool as arrays (every selection extends it to the whole pool)
            self.calibration.observe_rows(view.parent, view.drafted, view.level, decision.nodes, accepted)
        else:
            self.calibration.observe(pool.parent, pool.path_prob, pool.level, decision.nodes, accepted)

    def path_probs(self, pool: CandidatePool) -> np.ndarray | None:
        """[n+1] the calibrated path probabilities the selector reads; None: the drafter's own. Within a cycle each
        node is calibrated once, when the pool first holds it (the counts change only between cycles)."""
        if self.calibration is None:
            return None
        known = self._calibrated[1] if self._calibrated[0] is pool else None
        probs = self.calibration.path_probs(pool.parent, pool.path_prob, pool.level, known)
        self._calibrated = (pool, probs)
        return np.array(probs)

    @classmethod
    def from_inputs(cls, config, inputs, seed, num_experts):
        if "coefficients" not in inputs:
            raise SpecFitError(f"method {config.name} needs the `coefficients` input (the fitted b and beta)")
        coefficients = read_json(inputs["coefficients"])
        routes = route_source_for(config, inputs, seed, num_experts)
        return cls(config, coefficients["b"], coefficients["beta"], routes, num_experts)

    @property
    def full_pool(self) -> bool:
        """Whether its route source answers only for the whole pool (the atlas build): then the rule is replayed."""
        return self.route_source is not None and self.route_source.full_pool

    def select(self, cycle, pool, final):
        if pool.n == 0:  # at the length limit (or no drafting): nothing to choose, no routes to read
            return Decision((), 0)
        if self.full_pool and not final:
            return None
        full = self.view(cycle, pool)
        first = 1 if self.full_pool else pool.depth
        for depth in range(first, pool.depth + 1):
            view = full if depth == pool.depth else full.upto_level(depth)  # V<=d; the whole pool at its depth
            chosen = self.choose(view, depth)
            if (final and depth == pool.depth) or not self.draft_on(view, chosen, depth):
                return self.decided(view, chosen, depth)
        return None

    @cached_property
    def asks_routes(self) -> bool:
        """Whether the selector asks its route source: always, but for a learned source under a cost without an
        expert term (β = 0, a resident device's per-pair gather), where routes could only break exact ties of ratio
        and reward, and predicting them would be host work for nothing. (Atlas sources are always asked: their runs
        are the paper's measurement, and the atlas build records every pool.)"""
        return not self.config.route_source.learned or self.expert_term

    @property
    def expert_term(self) -> bool:
        """Whether T̂ counts experts: β above a 10^-12 share of b_0 per expert (an NNLS fit leaves ~1e-16 where the
        device's cost has no expert term; a million experts would not add a millionth of b_0)."""
        return self.beta > EXPERT_TERM_TOL * float(self.b[0])

    rebuild_view = False  # True: the view rebuilt from the lists after every level, as before `GrowingPool` (bench)

    def view(self, cycle: Cycle, pool: CandidatePool) -> Pool:
        """The selector's view of the pool: the route source's routes and what the cost reads beside them
        (`cost_state`), or neither where the selector `asks_routes` nothing. One `GrowingPool` per cycle's pool
        extended as levels arrive (``rebuild_view``: rebuilt from the lists every level, the same view)."""
        routes = self.route_source.routes(cycle, pool) if self.asks_routes else None
        state = self.cost_state(cycle) if self.asks_routes else {}
        if self.rebuild_view:
            return pool.view(routes, self.num_experts, path_prob=self.path_probs(pool), **state)
        if self._growing[0] is not pool:
            self._growing = (pool, GrowingPool(self.num_experts))
        return self._growing[1].extend(pool, routes, calibration=self.calibration, **state)

    def cost_state(self, cycle: Cycle) -> dict:
        """What the cost reads of the cycle beside the routes (`CandidatePool.view`'s ``resident``, ``in_flight``)."""
        return {}

    def choose(self, view: Pool, depth: int) -> Selection:
        """Ŝ over ``view``, the pool drafted to ``depth`` levels."""
        return select_specfit(view, self.b, self.beta, self.config.k_max)

    def draft_on(self, view: Pool, chosen: Selection, depth: int) -> bool:
        """Adaptive depth: after level d, draft level d + 1 only if the selection holds a level-d node (or, with
        ``lookahead``, a chain through the next levels could pay)."""
        return holds_level(view, chosen, depth) or self.chain_pays(view, chosen, depth)

    def chain_pays(self, view: Pool, chosen: Selection, depth: int) -> bool:
        """Look-ahead (``lookahead``, `specfit.selection.lookahead.chain_pays`): whether Ŝ_d and a chain through the
        levels not drafted yet predict a higher ratio, each chain node at the calibration's expected rate for its
        level (`OnlineCalibration.chain_rate`; 1/2 without calibration), timed by `chain_time`."""
        if not self.option("lookahead") or depth >= self.config.max_depth:
            return False
        rate = self.calibration.chain_rate if self.calibration is not None else (lambda level: 0.5)
        return chain_pays(view, chosen, depth, self.config.max_depth, min(self.config.k_max, len(self.b) - 1), rate,
                          lambda base, per_node: self.chain_time(view, base, per_node, depth))

    def chain_time(self, view: Pool, base: list[int], per_node: float, depth: int):
        """j -> T̂ of ``base`` and a chain of j more nodes, each adding ``per_node`` experts (Eq. 4); the union of
        ``base`` is counted once."""
        union = view.expert_union(base)
        return lambda j: float(self.b[len(base) + j]) + self.beta * (union + j * per_node)

    def decided(self, view: Pool, chosen: Selection, depth: int) -> Decision:
        return Decision(chosen.nodes, depth)


class SpecFitCA(Skipping, SpecFit):
    """SpecFit that knows the expert cache and what drafting costs (beyond the paper; the paper's is `specfit`).

    **Cost.** T̂(S) = b_|S| + β_miss·M(S) + β_hit·H(S) + D(d): M counts the experts of the per-layer union that the
    layer's cache does not hold when the cycle selects (each is one host-to-device copy of the verify forward), H
    those it holds, and D(d) what drafting d levels cost (`specfit.selection.coefficients.DraftCost`: the drafter's
    catch-up on the committed tokens, which also gives level 1, each further level's drafter forward, and one
    selection per level). The residency is read from the offload engine once per cycle; the search stays exact
    (`specfit.selection.select_specfit_ca`, with intercepts b_k + D(d)). Coefficients: the calibration's
    cache-aware NNLS fit to cycle times without their drafting (``cache_aware.without_drafting``), so drafting is
    counted once, by D(d), and its ``drafting`` fit.

    **Depth.** After level d with selection Ŝ_d of ratio ρ_d, level d + 1 is drafted only if Ŝ_d holds a level-d
    node (the paper's rule) and level d + 1 could pay for itself. A subtree S of V<=d+1 is S' ∪ N with S' ⊆ V<=d
    and N at most w² new nodes (top-w expansion), each with path probability at most p_max, the largest of level
    d: R̂(S) <= R̂(S') + ΔR, ΔR = min(w², K)·p_max. Drafting the level costs c = D(d+1) - D(d) (a drafter
    forward and a selection) and the new nodes change T̂ by at least -Δb, Δb = max over i < j <= K of (b_i - b_j)
    (NNLS intercepts need not grow with |S|), so T(S) >= T̂(S') + c', c' = c - Δb. Since R̂(S') <= ρ_d·T̂(S')
    for every S', (R̂(S') + ΔR) / (T̂(S') + c') <= ρ_d whenever ΔR <= ρ_d·c': then no subtree of V<=d+1 beats
    Ŝ_d, and drafting stops. (With c' <= 0 the rule is the paper's.)

    **Skipping** (``skip``, on by default here): `specfit.speculative.skipping`.
    """

    DEFAULTS = {**SpecFit.DEFAULTS, "skip": True}

    def __init__(self, config: MethodConfig, b, beta_miss: float, beta_hit: float, drafting: DraftCost, routes,
                 num_experts: int):
        super().__init__(config, b, beta_miss, routes, num_experts)
        self.beta_miss, self.beta_hit, self.drafting = float(beta_miss), float(beta_hit), drafting
        self._intercepts: dict[int, np.ndarray] = {}  # depth -> b + D(depth) (`intercepts`)
        k = min(config.k_max, len(self.b) - 1)
        self.delta_b = max((float(self.b[i] - self.b[j]) for i in range(k + 1) for j in range(i + 1, k + 1)),
                           default=0.0)
        self.reset()

    def reset(self):
        super().reset()
        self._resident: tuple[Cycle | None, np.ndarray | None] = (None, None)

    @classmethod
    def from_inputs(cls, config, inputs, seed, num_experts):
        if "coefficients" not in inputs:
            raise SpecFitError(f"method {config.name} needs the `coefficients` input (the calibration's fits)")
        routes = route_source_for(config, inputs, seed, num_experts)
        return cls.from_coefficients(config, read_json(inputs["coefficients"]), routes, num_experts)

    @classmethod
    def from_coefficients(cls, config: MethodConfig, c: dict, routes, num_experts: int) -> SpecFitCA:
        """From a calibration's coefficients (`specfit.selection.coefficients.cache_aware_cost`)."""
        return cls(config, *cache_aware_cost(c), routes, num_experts)

    def view(self, cycle, pool):
        if self._resident[0] is not cycle:  # once per cycle: the cache does not change while the pool grows
            self._read_resident(cycle)  # (read for the record also where the cost has no expert term)
        return super().view(cycle, pool)

    def cost_state(self, cycle):
        return {"resident": self._resident[1]}

    @property
    def expert_term(self):
        return max(self.beta_miss, self.beta_hit) > EXPERT_TERM_TOL * float(self.b[0])

    def _read_resident(self, cycle: Cycle) -> None:
        engine = cycle.target.engine if cycle.target is not None else None
        self._resident = (cycle, engine.resident() if engine is not None else None)

    def residency(self, cycle):
        read_in, resident = self._resident
        return resident if read_in is cycle else None

    def choose(self, view, depth):
        return select_specfit_ca(view, self.intercepts(depth), self.beta_miss, self.beta_hit, self.config.k_max)

    def intercepts(self, depth: int) -> np.ndarray:
        """b_k + D(d) for every size k, once per depth d."""
        if depth not in self._intercepts:
            self._intercepts[depth] = self.b + self.drafting(depth)
        return self._intercepts[depth]

    def draft_on(self, view, chosen, depth):
        return self.level_pays(view, chosen, depth) or self.chain_pays(view, chosen, depth)

    def level_pays(self, view, chosen, depth):
        """The next level alone (the bound above)."""
        if not holds_level(view, chosen, depth):
            return False
        level, prob = view.level, view.path_prob
        v, p_max = view.n, 0.0
        while v > 0 and level[v] == depth:  # node ids go level by level: level d's nodes are the last ones
            p_max = max(p_max, float(prob[v]))
            v -= 1
        gain = min(self.config.top_k_expand ** 2, self.config.k_max) * p_max
        return gain > chosen.reward / chosen.time * (self.drafting.next_level_ms - self.delta_b)

    def chain_time(self, view, base, per_node, depth):
        """j -> T̂_CA of ``base`` and j chain nodes, with drafting d + j levels; the chain's new experts miss the cache
        as often as ``base``'s did."""
        union, misses = view.expert_union(base), view.expert_misses(base)
        new = union - view.expert_union(())
        share = (misses - view.expert_misses(())) / new if new > 0 else 1.0  # of a chain node's experts, missed

        def time(j: int) -> float:
            u, m = union + j * per_node, misses + j * per_node * share
            return (float(self.b[len(base) + j]) + self.drafting(depth + j) + self.beta_miss * m
                    + self.beta_hit * (u - m))
        return time

    def decided(self, view, chosen, depth):
        root_only = view.cache_aware_time((), self.b[0], self.beta_miss, self.beta_hit)  # T̂_CA of the root alone
        self.record(root_only, chosen.time - self.drafting(depth), depth)  # T̂ of verification alone
        return Decision(chosen.nodes, depth)

