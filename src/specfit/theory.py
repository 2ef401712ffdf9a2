"""Theory stage: selection theory evaluated on recorded cycles (Appendix A.4, Table 5).

Expectations are means over the recorded cycles with the trajectory held fixed: each cycle's legal
family is that of the pool it drafted, and the same pools are reselected at β and at 2β.

The stage reads the cycles of SpecFit's run with the cache (pools, selections, drafted levels), the
routes of every pool node from that run's atlas, the output tokens (for each cycle's accepted path in
the whole drafted pool, not only in the verified subtree) and the with-cache coefficients.

Every recorded cycle counts, the root-only ones at the length limit included (the paper's Table 5 has as many
cycles as its Table 2). Near the length limit a cycle may draft at most ``room - 1`` levels
(`specfit.speculative.request.Session.draft`): its depth cap comes from the workload's limits, the cycle's
``prefix_len`` (the prompt plus the output before its root) and the output committed before it, and a cycle that
drafted up to a cap below ``max_depth`` did not stop early, the limit stopped it.

spec: {"beta_multiplier": 2.0, "k_max": 7, "max_depth": 5, "limit_tokens": 512, "max_new_tokens": 128}
      (the limits as the decode run had them: input + output tokens, output tokens)
inputs: cycles, requests (Parquet of the decode run), atlas (Parquet), coefficients (JSON)
outputs: theory (JSON: the quantities of Table 5)
"""

from dataclasses import dataclass

import numpy as np

from specfit.errors import SpecFitError
from specfit.io import read_json, write_json
from specfit.records import CYCLE_SCHEMA, REQUEST_SCHEMA, read_table
from specfit.selection.pool import CandidatePool, Pool
from specfit.selection.selectors import Selection, select_parametric, select_specfit
from specfit.speculative.cycle import Cycle
from specfit.speculative.routes import AtlasRoutes
from specfit.stage import stage_main


@dataclass(frozen=True)
class RecordedCycle:
    """One verification cycle of a SpecFit run."""

    pool: Pool  # the drafted pool: V_<=d when drafting stopped after level d
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


def parametric_value(selections: list[Selection], lam: float) -> float:
    """h(λ) of Eq. 9, E[R̂(S_λ) - λ T̂(S_λ)], given each cycle's maximizer S_λ."""
    return float(np.mean([s.reward - lam * s.time for s in selections]))


def dinkelbach(pools: list[Pool], b, beta: float, k_max: int = 7, lam: float = 0.0, max_iter: int = 100):
    """λ* = max over rules of Θ, the root of h (Eq. 9), by Dinkelbach's iteration from a λ <= λ*.

    Each step selects S_λ in every cycle and moves λ to E[R̂(S_λ)] / E[T̂(S_λ)]; λ rises until the
    selections reproduce it, which a finite family reaches in finitely many steps.
    Returns (λ*, S* per cycle, iterations).
    """
    for iteration in range(1, max_iter + 1):
        selections = [select_parametric(pool, b, beta, lam, k_max) for pool in pools]
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
    """Table 5 for one workload: the ratio rule Ŝ (Eq. 5) against the throughput-optimal S* (Eq. 7).

    Percentages of λ* refer to predicted throughput. The gain of S* counts committed tokens from the
    recorded accepted paths per unit of predicted time. The coefficient of variation of ρ uses the
    population standard deviation. A cycle stopped early when it drafted fewer levels than it could have
    (its ``depth_cap``, at most ``max_depth``): a cycle the length limit capped below ``max_depth`` that drafted
    up to its cap is no adaptive stop. ``stopped_early_pct`` is a percentage of all cycles.
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
    pools = [cycle.pool for cycle in cycles]
    paths = [cycle.accepted_path for cycle in cycles]

    ratio_rule = [select_specfit(pool, b, beta, k_max) for pool in pools]
    reward, time, union, nodes = _figures(ratio_rule)
    theta = reward.sum() / time.sum()
    rho = reward / time  # [cycles] largest ratio per cycle
    lam, optimal, iterations = dinkelbach(pools, b, beta, k_max, lam=theta)
    _, time_star, _, _ = _figures(optimal)
    bound = np.mean((rho - lam) * (time_star - time)) / np.mean(time)

    commits = np.array([committed(s.nodes, path) for s, path in zip(ratio_rule, paths)])  # [cycles]
    commits_star = np.array([committed(s.nodes, path) for s, path in zip(optimal, paths)])  # [cycles]
    gain = (commits_star.sum() / time_star.sum()) / (commits.sum() / time.sum()) - 1.0

    reward_2, _, union_2, nodes_2 = _figures([select_specfit(pool, b, beta_multiplier * beta, k_max) for pool in pools])
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
    }


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

    A cycle at the length limit that drafted nothing keeps the root alone: its pool is the root, whose routes no
    run read (SpecFit reads none for an empty pool); one token's union is ``top_k`` experts in each layer
    whichever they are, so it gets experts 0..top_k-1, which gives T̂ exactly.

    ``limits`` ({"limit_tokens", "max_new_tokens"}: the decode run's) give each cycle's depth cap (`depth_cap`);
    without them no cycle is taken as capped. A prompt length that changes within a request (``prefix_len`` minus
    the output before the root) is an error: the cycles are not one request's.

    ``atlas`` is a `specfit.speculative.routes.AtlasRoutes`: each pool's routes are looked up by content, as the run
    looked them up (a node the atlas lacks gets the same fallback, counted in ``atlas.nodes_missed``).
    """
    outputs = {r["request_id"]: r["output_ids"] for r in requests}
    num_experts = 1 + max(int(row["routes"].max()) for row in atlas.rows.values())
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
        if candidates.n == 0:  # at the length limit nothing was drafted: the root alone, no route to look up
            pool = candidates.view(root_routes, num_experts)
            recorded.append(RecordedCycle(pool, tuple(c["selected"]), c["accepted"], (), c["drafted_levels"], cap))
            continue
        path = accepted_path_in_pool(c["pool_parent"], c["pool_token"], output[start + 1 :])
        if len(path) < len(c["accepted_path"]):
            path = tuple(c["accepted_path"])
        cycle = Cycle(key[0], key[1], c["prefix_len"], output[: start + 1])
        pool = candidates.view(atlas.routes(cycle, candidates), num_experts)
        recorded.append(RecordedCycle(pool, tuple(c["selected"]), c["accepted"], path, c["drafted_levels"], cap))
    return recorded


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    cycles = read_table(inputs["cycles"], CYCLE_SCHEMA, "cycles").to_pylist()
    requests = read_table(inputs["requests"], REQUEST_SCHEMA, "requests").to_pylist()
    coefficients = read_json(inputs["coefficients"])
    atlas = AtlasRoutes(inputs["atlas"])
    limits = {k: spec[k] for k in ("limit_tokens", "max_new_tokens")}
    recorded = recorded_cycles(cycles, requests, atlas, limits, spec["max_depth"])
    table = selection_theory(recorded, coefficients["b"], coefficients["beta"], spec["k_max"], spec["max_depth"],
                             spec["beta_multiplier"])
    write_json({**table, "b": coefficients["b"], "beta": coefficients["beta"],
                "atlas_nodes": atlas.nodes_looked_up, "atlas_nodes_missed": atlas.nodes_missed}, outputs["theory"])


main = stage_main(run)

if __name__ == "__main__":
    main()
