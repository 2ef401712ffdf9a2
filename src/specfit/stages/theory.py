"""Stage theory: selection theory evaluated on recorded cycles (Appendix A.4, Table 5).

Expectations are means over the recorded cycles with the trajectory held fixed: each cycle's legal
family is that of the pool it drafted, and the same pools are reselected at β and at 2β.

The stage reads the cycles of one run with the cache (pools, selections, drafted levels), the
routes of every pool node from that run's atlas, the output tokens (for each cycle's accepted path in
the whole drafted pool, not only in the verified subtree) and the with-cache coefficients.

Two cost models (spec ``cost``): the paper's, T̂(S) = b_|S| + β F(S) (`PaperCost`), on SpecFit's cycles; and,
beyond the paper, specfit-ca's cache-aware cost T̂(S) = b_|S| + D(d) + β_miss M(S) + β_hit H(S) (`CacheAwareCost`)
on specfit-ca's cycles, each with the residency the cycle recorded (the ``resident`` column) and the cost D(d) of
its own d drafted levels. The quantities are the same under both; "2β" multiplies every expert coefficient (β, or
β_miss and β_hit), not the intercepts.

Every recorded cycle counts, the root-only ones at the length limit included (the paper's Table 5 has as many
cycles as its Table 2). Near the length limit a cycle may draft at most ``room - 1`` levels
(`specfit.speculative.request.Session.draft`): its depth cap comes from the workload's limits, the cycle's
``prefix_len`` (the prompt plus the output before its root) and the output committed before it, and a cycle that
drafted up to a cap below ``max_depth`` did not stop early, the limit stopped it.

spec: {"beta_multiplier": 2.0, "k_max": 7, "max_depth": 5, "limit_tokens": 512, "max_new_tokens": 128,
       "cost": "paper"}
      (the limits as the decode run had them: input + output tokens, output tokens; cost: "paper" or
      "cache_aware")
inputs: cycles, requests (Parquet of the decode run), atlas (Parquet), coefficients (JSON)
outputs: theory (JSON: the quantities of Table 5, and the coefficients they used)
"""

from dataclasses import asdict, dataclass

import numpy as np

from specfit.errors import SpecFitError
from specfit.io import read_json, write_json
from specfit.planning.stage import stage_main
from specfit.results.records import CYCLE_SCHEMA, REQUEST_SCHEMA, in_flight_matrix, read_table, resident_mask
from specfit.selection.coefficients import DraftCost, cache_aware_cost
from specfit.selection.pool import CandidatePool, Pool
from specfit.selection.selectors import (
    Selection,
    select_parametric,
    select_parametric_ca,
    select_specfit,
    select_specfit_ca,
)
from specfit.speculative.cycle import Cycle
from specfit.speculative.routes import AtlasRoutes


@dataclass(frozen=True)
class RecordedCycle:
    """One verification cycle of a SpecFit run."""

    pool: Pool  # the drafted pool: V_<=d when drafting stopped after level d; its residency as the cycle selected
    selected: tuple[int, ...]  # Ŝ the run verified
    accepted: int  # draft nodes of Ŝ the target accepted
    accepted_path: tuple[int, ...]  # longest root path of the pool matching the target's greedy tokens, root excluded
    drafted_levels: int  # d, levels drafted before selection
    depth_cap: int | None = None  # the most levels the cycle could draft (the length limit's); None: max_depth


def committed(nodes, accepted_path) -> int:
    """Tokens a cycle commits when it verifies `nodes`: the root plus the accepted path within the subtree.

    Greedy verification accepts the longest root path of S whose tokens match the target; in an
    ancestor-closed S that is the longest prefix of the pool's accepted path lying in S.
    """
    nodes = set(nodes)
    count = 0
    while count < len(accepted_path) and accepted_path[count] in nodes:
        count += 1
    return 1 + count


@dataclass(frozen=True)
class PaperCost:
    """The paper's cost model, T̂(S) = b_|S| + β F(S) (Eq. 4)."""

    b: list[float]  # b_0, b_1, ...
    beta: float

    def ratio_rule(self, cycle: RecordedCycle, k_max: int, multiplier: float = 1.0) -> Selection:
        """Ŝ of Eq. 5 over the cycle's pool, with β at ``multiplier`` times its value."""
        return select_specfit(cycle.pool, self.b, multiplier * self.beta, k_max)

    def parametric(self, cycle: RecordedCycle, lam: float, k_max: int) -> Selection:
        """S_λ of Eq. 9 over the cycle's pool."""
        return select_parametric(cycle.pool, self.b, self.beta, lam, k_max)


@dataclass(frozen=True)
class CacheAwareCost:
    """specfit-ca's cost model (beyond the paper), as `specfit.speculative.methods.SpecFitCA` selects with it:

        T̂(S) = b_|S| + D(d) + β_miss M(S) + β_hit H(S),

    M(S) the experts of the per-layer union of root ∪ S that the layer's cache did not hold as the cycle selected,
    H(S) = F(S) - M(S) those it held, and D(d) what drafting the cycle's d levels cost (`DraftCost`).
    """

    b: list[float]  # b_0, b_1, ... of the fit without drafting
    beta_miss: float
    beta_hit: float
    drafting: DraftCost

    @classmethod
    def from_coefficients(cls, coefficients: dict) -> "CacheAwareCost":
        """The coefficients specfit-ca selects with (`specfit.selection.coefficients.cache_aware_cost`)."""
        return cls(*cache_aware_cost(coefficients))

    def intercepts(self, cycle: RecordedCycle) -> np.ndarray:
        """[len(b)] b_k + D(d): the cycle's drafting counts once, whichever subtree it verifies."""
        return np.asarray(self.b, dtype=np.float64) + self.drafting(cycle.drafted_levels)

    def ratio_rule(self, cycle: RecordedCycle, k_max: int, multiplier: float = 1.0) -> Selection:
        """The cache-aware Ŝ over the cycle's pool, with β_miss and β_hit at ``multiplier`` times their values."""
        return select_specfit_ca(cycle.pool, self.intercepts(cycle), multiplier * self.beta_miss,
                                 multiplier * self.beta_hit, k_max)

    def parametric(self, cycle: RecordedCycle, lam: float, k_max: int) -> Selection:
        """S_λ of Eq. 9 under the cache-aware cost, over the cycle's pool."""
        return select_parametric_ca(cycle.pool, self.intercepts(cycle), self.beta_miss, self.beta_hit, lam, k_max)

    def coefficients(self) -> dict:
        return {"b": list(self.b), "beta_miss": self.beta_miss, "beta_hit": self.beta_hit,
                "drafting": asdict(self.drafting)}


def solve_dinkelbach(select, lam: float = 0.0, max_iter: int = 100):
    """λ* = max over rules of Θ, the root of h (Eq. 9), by Dinkelbach's iteration from a λ <= λ*.

    ``select(λ)`` gives S_λ in every cycle; each step moves λ to E[R̂(S_λ)] / E[T̂(S_λ)], and λ rises until the
    selections reproduce it, which a finite family reaches in finitely many steps.
    Returns (λ*, S* per cycle, iterations).
    """
    for iteration in range(1, max_iter + 1):
        selections = select(lam)
        ratio = sum(s.reward for s in selections) / sum(s.time for s in selections)
        if ratio <= lam:
            return lam, selections, iteration
        lam = ratio
    raise RuntimeError(f"Dinkelbach's iteration did not settle in {max_iter} steps")


def _figures(selections: list[Selection]):
    reward = np.array([s.reward for s in selections])  # [cycles] R̂
    time = np.array([s.time for s in selections])  # [cycles] T̂
    union = np.array([s.union for s in selections])  # [cycles] F
    nodes = np.array([len(s.nodes) for s in selections])  # [cycles] |S|
    return reward, time, union, nodes


def selection_theory(
    cycles: list[RecordedCycle], b, beta: float, k_max: int = 7, max_depth: int = 5, beta_multiplier: float = 2.0
) -> dict:
    """Table 5 for one workload under the paper's cost (`table_5` with `PaperCost`)."""
    table, _ = table_5(cycles, PaperCost(b, beta), k_max, max_depth, beta_multiplier)
    return table


def cache_aware_theory(cycles: list[RecordedCycle], cost: CacheAwareCost, k_max: int = 7, max_depth: int = 5,
                       beta_multiplier: float = 2.0) -> dict:
    """Table 5 for one workload under specfit-ca's cache-aware cost (`table_5` with `CacheAwareCost`), beyond the
    paper, with two more quantities: the mean M(Ŝ)/R̂(Ŝ) at β and 2β (experts copied per unit of predicted reward),
    and the cycles priced with nothing resident, those that recorded no residency (at the length limit).
    """
    table, (at_beta, at_2beta) = table_5(cycles, cost, k_max, max_depth, beta_multiplier)
    return {
        **table,
        "misses_per_reward_beta": float(np.mean([s.misses / s.reward for s in at_beta])),
        "misses_per_reward_2beta": float(np.mean([s.misses / s.reward for s in at_2beta])),
        "cycles_without_residency": int(sum(cycle.pool.resident is None for cycle in cycles)),
    }


def table_5(cycles: list[RecordedCycle], cost, k_max: int = 7, max_depth: int = 5, beta_multiplier: float = 2.0):
    """Table 5 for one workload: the ratio rule Ŝ (Eq. 5) against the throughput-optimal S* (Eq. 7), under
    ``cost`` (`PaperCost` or `CacheAwareCost`).

    Percentages of λ* refer to predicted throughput. The gain of S* counts committed tokens from the
    recorded accepted paths per unit of predicted time. The coefficient of variation of ρ uses the
    population standard deviation. A cycle stopped early when it drafted fewer levels than it could have
    (its ``depth_cap``, at most ``max_depth``): a cycle the length limit capped below ``max_depth`` that drafted
    up to its cap is no adaptive stop. ``stopped_early_pct`` is a percentage of all cycles.

    Returns the table and the ratio rule's selections at β and at ``beta_multiplier`` times β.
    """
    if not cycles:
        raise ValueError("no recorded cycles")
    caps = []
    for i, cycle in enumerate(cycles):
        if committed(cycle.selected, cycle.accepted_path) - 1 != cycle.accepted:
            raise ValueError(f"cycle {i}: {cycle.accepted} accepted nodes, but the accepted path says otherwise")
        cap = max_depth if cycle.depth_cap is None else min(cycle.depth_cap, max_depth)
        if not 0 <= cycle.drafted_levels <= cap:
            raise ValueError(f"cycle {i}: {cycle.drafted_levels} drafted levels, but it could draft at most {cap}")
        caps.append(cap)
    paths = [cycle.accepted_path for cycle in cycles]

    ratio_rule = [cost.ratio_rule(cycle, k_max) for cycle in cycles]
    reward, time, union, nodes = _figures(ratio_rule)
    theta = reward.sum() / time.sum()
    rho = reward / time  # [cycles] largest ratio per cycle
    lam, optimal, iterations = solve_dinkelbach(lambda at: [cost.parametric(c, at, k_max) for c in cycles], theta)
    _, time_star, _, _ = _figures(optimal)
    bound = np.mean((rho - lam) * (time_star - time)) / np.mean(time)

    commits = np.array([committed(s.nodes, path) for s, path in zip(ratio_rule, paths)])  # [cycles]
    commits_star = np.array([committed(s.nodes, path) for s, path in zip(optimal, paths)])  # [cycles]
    gain = (commits_star.sum() / time_star.sum()) / (commits.sum() / time.sum()) - 1.0

    ratio_rule_2 = [cost.ratio_rule(cycle, k_max, beta_multiplier) for cycle in cycles]
    reward_2, _, union_2, nodes_2 = _figures(ratio_rule_2)
    levels = np.array([cycle.drafted_levels for cycle in cycles])  # [cycles]
    caps = np.array(caps)  # [cycles] the deepest level each cycle could reach
    return {
        "cycles": len(cycles),
        "beta_multiplier": beta_multiplier,  # the "2β" keys are at this multiple of β
        "lambda_star": float(lam),
        "theta": float(theta),
        "gap_pct": float(100.0 * (lam - theta) / lam),
        "bound_pct": float(100.0 * bound / lam),
        "s_star_differs_pct": float(100.0 * np.mean([s.nodes != h.nodes for s, h in zip(optimal, ratio_rule)])),
        "rho_cv": float(rho.std() / rho.mean()),
        "s_star_gain_pct": float(100.0 * gain),
        "union_per_reward_beta": float(np.mean(union / reward)),
        "union_per_reward_2beta": float(np.mean(union_2 / reward_2)),
        "selected_nodes_beta": float(nodes.mean()),
        "selected_nodes_2beta": float(nodes_2.mean()),
        "drafted_levels_mean": float(levels.mean()),
        "stopped_early_pct": float(100.0 * np.mean(levels < caps)),
        "length_limited_cycles": int(np.sum(caps < max_depth)),  # the length limit capped their depth
        "empty_pool_cycles": int(sum(cycle.pool.n == 0 for cycle in cycles)),  # nothing drafted: root only
        "dinkelbach_iterations": iterations,
        "recorded_selection_differs_pct": float(
            100.0 * np.mean([tuple(sorted(c.selected)) != h.nodes for c, h in zip(cycles, ratio_rule)])
        ),
    }, (ratio_rule, ratio_rule_2)


def accepted_path_in_pool(parent: list[int], token: list[int], continuation: list[int]) -> tuple[int, ...]:
    """The longest root path of a pool whose tokens are the target's greedy ``continuation`` after the root."""
    path, node = [], 0
    for want in continuation:
        child = next((v for v in range(node + 1, len(parent)) if parent[v] == node and token[v] == want), None)
        if child is None:
            break
        path.append(child)
        node = child
    return tuple(path)


def depth_cap(max_depth: int, limit_tokens: int, max_new_tokens: int, prefix_len: int, n_output: int) -> int:
    """The most levels a cycle can draft (`specfit.speculative.request.Session.draft`): ``room - 1``, where room is
    the output tokens still allowed, at most ``max_depth``.

    ``prefix_len`` is the target's cache before the cycle, the prompt and every output token but the root, so the
    prompt is ``prefix_len - (n_output - 1)`` tokens long; ``n_output`` counts the output so far, root included.
    """
    room = min(limit_tokens - prefix_len - 1, max_new_tokens - n_output)
    return max(0, min(max_depth, room - 1))


def recorded_cycles(cycles: list[dict], requests: list[dict], atlas, limits: dict | None = None,
                    max_depth: int = 5) -> list[RecordedCycle]:
    """Every cycle of a SpecFit run with its pool's atlas routes and its accepted path in the whole drafted pool.

    A cycle's root is output token ``Σ committed`` of the earlier cycles; the tokens after it are the target's
    greedy continuation, which gives the accepted path of any subtree, verified or not. At the end of a
    request the output is cut at EOS or the limit: there the recorded path is the longer one.

    A cycle that drafted nothing (at the length limit, or a specfit-ca cycle that skipped drafting) keeps the root
    alone. Without a recorded residency (SpecFit, or the length limit) its root's routes are not looked up: one
    token's union is ``top_k`` experts in each layer whichever they are, so it gets experts 0..top_k-1, which gives
    the paper's T̂ exactly, and the cache-aware cost takes nothing as resident. A specfit-ca cycle that skipped
    drafting records the residency (read off the timers), and its root's routes come from the atlas (whose build
    drafts in every cycle), so the cache-aware cost prices it exactly.

    A drafted cycle's pool carries the residency the cycle recorded (the ``resident`` column; none when null) and
    the copies then still in flight (the ``in_flight`` column: specfit-prefetch's; none when null).

    ``limits`` ({"limit_tokens", "max_new_tokens"}: the decode run's) give each cycle's depth cap (`depth_cap`);
    without them no cycle is taken as capped. A prompt length that changes within a request (``prefix_len`` minus
    the output before the root) is an error: the cycles are not one request's.

    ``atlas`` is a `specfit.speculative.routes.AtlasRoutes`: each pool's routes are looked up by content, as the run
    looked them up (a node the atlas lacks gets the same fallback, counted in ``atlas.nodes_missed``).
    """
    outputs = {r["request_id"]: r["output_ids"] for r in requests}
    num_experts = _num_experts(atlas, cycles)
    _, n_layers, top_k = next(iter(atlas.rows.values()))["routes"].shape
    root_routes = np.broadcast_to(np.arange(top_k, dtype=np.int64), (1, n_layers, top_k))  # [1, L, k]
    recorded, position, prompt_len = [], {}, {}
    for c in sorted(cycles, key=lambda c: (c["request_id"], c["cycle"])):
        key = (c["request_id"], c["cycle"])
        start = position.get(c["request_id"], 0)
        position[c["request_id"]] = start + c["committed"]
        if prompt_len.setdefault(key[0], c["prefix_len"] - start) != c["prefix_len"] - start:
            raise SpecFitError(f"request {key[0]}, cycle {key[1]}: prefix_len {c['prefix_len']} after {start} output "
                               f"tokens, a prompt of {c['prefix_len'] - start} tokens where earlier cycles had "
                               f"{prompt_len[key[0]]}")
        output = outputs[c["request_id"]]
        if output[start] != c["pool_token"][0]:
            raise SpecFitError(f"request {key[0]}, cycle {key[1]}: the root is not output token {start}")
        cap = None if limits is None else depth_cap(max_depth, limits["limit_tokens"], limits["max_new_tokens"],
                                                    c["prefix_len"], start + 1)
        candidates = CandidatePool(c["pool_token"], c["pool_parent"], c["pool_prob"], c["pool_level"])
        cycle = Cycle(key[0], key[1], c["prefix_len"], output[: start + 1])
        resident = resident_mask(c.get("resident"), num_experts)  # [L, N] or None
        in_flight = in_flight_matrix(c.get("resident"), c.get("in_flight"), num_experts)  # [L, N] or None
        if candidates.n == 0:  # nothing drafted: the root alone
            routes = root_routes if resident is None else atlas.routes(cycle, candidates)  # [1, L, k]
            pool = candidates.view(routes, num_experts, resident, in_flight)
            recorded.append(RecordedCycle(pool, tuple(c["selected"]), c["accepted"], (), c["drafted_levels"], cap))
            continue
        path = accepted_path_in_pool(c["pool_parent"], c["pool_token"], output[start + 1 :])
        if len(path) < len(c["accepted_path"]):
            path = tuple(c["accepted_path"])
        pool = candidates.view(atlas.routes(cycle, candidates), num_experts, resident, in_flight)
        recorded.append(RecordedCycle(pool, tuple(c["selected"]), c["accepted"], path, c["drafted_levels"], cap))
    return recorded


def _num_experts(atlas, cycles: list[dict]) -> int:
    """N: one more than the largest expert id the atlas routes to or a recorded cache held (ids above it change no
    union)."""
    routed = max(int(row["routes"].max()) for row in atlas.rows.values())
    held = max((e for c in cycles for layer in c.get("resident") or () for e in layer), default=-1)
    return 1 + max(routed, held)


COSTS = ("paper", "cache_aware")


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    if spec["cost"] not in COSTS:
        raise SpecFitError(f"theory spec: cost {spec['cost']!r} is not one of {COSTS}")
    cycles = read_table(inputs["cycles"], CYCLE_SCHEMA, "cycles").to_pylist()
    requests = read_table(inputs["requests"], REQUEST_SCHEMA, "requests").to_pylist()
    coefficients = read_json(inputs["coefficients"])
    atlas = AtlasRoutes(inputs["atlas"])
    limits = {k: spec[k] for k in ("limit_tokens", "max_new_tokens")}
    recorded = recorded_cycles(cycles, requests, atlas, limits, spec["max_depth"])
    shape = (spec["k_max"], spec["max_depth"], spec["beta_multiplier"])
    if spec["cost"] == "cache_aware":
        cost = CacheAwareCost.from_coefficients(coefficients)
        table = {**cache_aware_theory(recorded, cost, *shape), "cost": "cache_aware", **cost.coefficients()}
    else:
        table = {**selection_theory(recorded, coefficients["b"], coefficients["beta"], *shape),
                 "b": coefficients["b"], "beta": coefficients["beta"]}
    write_json({**table, "atlas_nodes": atlas.nodes_looked_up, "atlas_nodes_missed": atlas.nodes_missed},
               outputs["theory"])


main = stage_main(run)

if __name__ == "__main__":
    main()
