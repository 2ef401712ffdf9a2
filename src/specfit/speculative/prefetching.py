"""Methods that prefetch experts while they draft (beyond the paper): the predicted experts of the subtree they
would verify now are copied over the link while the next level is drafted.
"""

from __future__ import annotations

import numpy as np

from specfit.errors import SpecFitError
from specfit.io import read_json
from specfit.selection.coefficients import DraftCost, cache_aware_cost
from specfit.selection.selectors import select_top_prob
from specfit.speculative.config import MethodConfig
from specfit.speculative.cycle import Cycle
from specfit.speculative.methods import Eagle3, SpecFitCA
from specfit.speculative.routes import LiveRoutes, find_source, route_source_for


def prefetch_order(routes: np.ndarray, path_prob, nodes) -> tuple[list[tuple[int, int]], list[set[int]]]:
    """The experts the subtree root + ``nodes`` is predicted to need, most valuable first, and per layer the set.

    ``routes`` [n+1, L, k] the nodes' predicted experts (negative: padding). Under the cache-aware cost every
    expert of the union that is not resident costs β_miss and a resident one β_hit, so each would cut T̂ of the
    subtree by β_miss − β_hit: they are ranked by the probability that the node needing them is still verified
    when the cycle verifies (the largest path probability of a node routing to it, the root's 1 first: the subtree
    can still change with the next level), then by layer (an earlier layer's copy is on the critical path first),
    then by expert id. Returns ((layer, expert) pairs, [L] sets of expert ids).
    """
    _, layers, _ = routes.shape
    best: dict[tuple[int, int], float] = {}
    for v in (0, *nodes):
        p = 1.0 if v == 0 else float(path_prob[v])
        for layer in range(layers):
            for e in routes[v, layer].tolist():
                if e >= 0 and best.get((layer, e), -1.0) < p:
                    best[layer, e] = p
    needed = [set() for _ in range(layers)]
    for layer, e in best:
        needed[layer].add(e)
    return sorted(best, key=lambda le: (-best[le], le[0], le[1])), needed


class Prefetching:
    """After each drafted level that is not the last, prefetch the experts of the subtree the method would verify
    now (`prefetch_order`), those not resident, within what the link can move before the next level is drafted:
    ``(next_level_ms − backlog) / copy_ms`` copies, ``next_level_ms`` the calibrated time of one more drafted level
    and its selection (`DraftCost.next_level_ms`), the backlog what the link still has to move, ``copy_ms`` the
    engine's time per copy (β_miss where the link is measured, not modelled). The prefetch never evicts an expert
    the subtree is predicted to need (`specfit.engine.offload.OffloadEngine.prefetch`). Prefetch changes only what
    the cache holds: the output is AR's whatever it copies.
    """

    drafting: DraftCost
    beta_miss: float

    def copy_budget(self, cycle: Cycle) -> int:
        """The copies the link can move before the next level is drafted (0 without an expert cache to land in)."""
        engine = cycle.target.engine if cycle.target is not None else None
        if engine is None or engine.config.slots == 0:
            return 0
        copy_ms = engine.copy_ms or self.beta_miss
        return int((self.drafting.next_level_ms - engine.link_backlog_ms()) // copy_ms) if copy_ms > 0 else 0

    def prefetch(self, cycle: Cycle, budget: int, routes: np.ndarray, path_prob, nodes) -> int:
        """Prefetch at most ``budget`` of the experts of root + ``nodes`` (``routes`` [n+1, L, k]) not resident."""
        engine = cycle.target.engine
        resident = engine.resident()  # [L, N]
        order, needed = prefetch_order(routes, path_prob, nodes)
        wanted = [(layer, e) for layer, e in order if not resident[layer, e]][:budget]
        return engine.prefetch(wanted, needed) if wanted else 0


class SpecFitPrefetch(Prefetching, SpecFitCA):
    """specfit-ca that prefetches, after each drafted level it drafts on from, the predicted experts of the subtree it
    would verify now (`Prefetching`; beyond the paper).

    Its cost is specfit-ca's, read again after every level, so selection, the depth rule and the skipping rule see
    what the prefetch already bought: the residency is the engine's at that level, and an expert whose prefetched
    copy is still in flight is a hit that still pays what is left of its copy, (β_miss − β_hit) times the fraction
    left (`specfit.selection.pool.Pool.in_flight`; the search stays exact).
    """

    asks_routes = True  # the prefetch copies the routes' experts, whatever the cost reads

    def view(self, cycle, pool):
        self._read_resident(cycle)  # every level: the prefetch of the level before changed it
        return super().view(cycle, pool)

    def cost_state(self, cycle):
        return {**super().cost_state(cycle), "in_flight": self._in_flight}

    def _read_resident(self, cycle):
        super()._read_resident(cycle)
        engine = cycle.target.engine if cycle.target is not None else None
        self._in_flight = None
        if self._resident[1] is not None and engine.copy_ms:  # [L, N] fraction of each copy left
            self._in_flight = np.minimum(engine.in_flight_ms() / engine.copy_ms, 1.0) * self._resident[1]

    def in_flight(self, cycle):
        return self._in_flight if self._resident[0] is cycle else None

    def choose(self, view, depth):
        self._chosen = (view, chosen := super().choose(view, depth))
        return chosen

    def select(self, cycle, pool, final):
        decision = super().select(cycle, pool, final)
        if decision is None and not self.route_source.full_pool:  # drafting on: the link is idle until verification
            if (budget := self.copy_budget(cycle)) > 0:
                view, chosen = self._chosen
                self.prefetch(cycle, budget, view.routes, view.path_prob, chosen.nodes)
        return decision


class Eagle3Prefetch(Prefetching, Eagle3):
    """EAGLE-3 that prefetches its fixed tree (the SP-MoE pattern; beyond the paper): after each drafted
    level but the last, the experts of the k_max most probable nodes so far, predicted by its route source
    (`Prefetching`); the verified tree is EAGLE-3's. Coefficients give the drafting time that budgets the copies.
    """

    def __init__(self, config: MethodConfig, drafting: DraftCost, beta_miss: float, routes, num_experts: int):
        super().__init__(config)
        self.drafting, self.beta_miss = drafting, float(beta_miss)
        self.route_source, self.num_experts = routes, num_experts
        self.live = find_source(routes, LiveRoutes)

    @classmethod
    def from_inputs(cls, config, inputs, seed, num_experts):
        if "coefficients" not in inputs:
            raise SpecFitError(f"method {config.name} needs the `coefficients` input (the calibrated drafting time)")
        coefficients = read_json(inputs["coefficients"])
        _, beta_miss, _, drafting = cache_aware_cost(coefficients)
        return cls(config, drafting, beta_miss, route_source_for(config, inputs, seed, num_experts), num_experts)

    def select(self, cycle, pool, final):
        if self.route_source.full_pool:  # an atlas build: the routes of the full pool, once, for the record
            if final and pool.n > 0:
                self.route_source.routes(cycle, pool)
        elif not final and pool.n > 0 and (budget := self.copy_budget(cycle)) > 0:
            chosen = select_top_prob(pool.view(), self.config.k_max).nodes
            self.prefetch(cycle, budget, self.route_source.routes(cycle, pool), pool.path_prob, chosen)
        return super().select(cycle, pool, final)
