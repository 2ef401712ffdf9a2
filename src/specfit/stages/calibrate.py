"""Stage calibrate: probe cycles on EAGLE-3 states and the NNLS fit of T̂(S) = b_|S| + β·F(S) (Appendix B), and of
the cache-aware model T̂(S) = b_|S| + β_miss·M(S) + β_hit·H(S) (specfit-ca's cost) on the same probes.

States: EAGLE-3's trajectory on the calibration questions (GSM8K 401-403) after 0, 4 and 8 cycles, with the full
pool drafted (SpecFit's own trajectory would need the coefficients being fitted). In each state, for each size
k = 0..7, two probe trees: the probability-prefix tree (the k nodes of highest p_v) and the minimum-expert-union
tree (the exact argmin of F over legal subtrees of size k). A probe is one cycle timed with synchronization:
drafting min(depth(S) + 1, 5) levels, verifying S ∪ {s}, committing; the state is then restored so that the next
probe starts from the same state. Each probe runs ``repeats`` times without clearing the cache and the times
are averaged, giving 9 × 8 × 2 = 144 points (k, F, y) with y in ms.

The routes that give F come from a first, untimed pass over the same trajectory (one tree query per state), so
that the route queries leave no trace in the expert cache the timed pass measures.

Cache-aware model. Each repeat of a probe also records, from the offload engine's counters around the cycle, the
union's experts the verify forward copied (misses M) and found resident (hits H), summed over layers (drafting
runs no target forward, so the cycle's counters are the verify forward's: M + H = F), and the cycle's "draft"
section (drafter catch-up and the drafted levels). The repeats of a probe meet different caches (the second finds
what the first loaded), so M and H differ between them while k, F and the tree do not: that variation is what
tells β_miss from β_hit, and averaging the repeats would blur it. So the cache-aware model is fitted on one row
per repeat (``repeats`` × the probes), while the paper's model keeps its fit on the probe means. Both are scored
on the probe means as well (``pred_ms``, ``pred_ca_ms`` against ``y_ms``), the points where they compare.
``drafting`` is specfit-ca's model of the probes' drafting time (`specfit.selection.coefficients.DraftCost`): a drafted
cycle's "draft" section is start + (levels - 1)·level (NNLS over the probes that caught the drafter up: level 1
reads the catch-up forward's logits, so the first level costs what the catch-up costs), and ``select_ms`` one
cache-aware selection: each probe runs specfit-ca's selection after every level it drafts, as a decode would
(`Probe`), timed apart from the cycle (``select_measured_ms``). An emulated device that gives its host's
``emulate.select_ms`` is priced at that instead (``select_source``: "device" or "measured"): a measured time differs
between machines and runs, and specfit-ca's decisions, read off D(d), would with it.

spec: {"model" (its name in config.yaml), "dtype", "logits_dtype", "torch_device", "max_inflight", "link", "emulate",
       "slots" (0: the no-cache fit),
       "coefficients": "fit" | "paper-a100" | "paper-rtx4090", "seed",
       "protocol": {"cycle_boundaries", "sizes", "repeats", "limit_tokens"}}
inputs: prompts (Parquet of the calibration questions), target, drafter
outputs: coefficients (JSON: b, beta in ms, fit diagnostics; "cache_aware": {b, beta_miss, beta_hit, r2,
         rmse_ms, n_points (per repeat), beta_hit_identified, r2_means, rmse_means_ms, ...} and "drafting":
         {start_ms, level_ms, select_ms, select_measured_ms, select_source, r2, n_points}, both null for the
         paper's presets), points
         (Parquet: one row per probe tree)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from specfit.engine.offload import make_engine
from specfit.errors import SpecFitError
from specfit.io import write_json, write_parquet
from specfit.models import check_checkpoints, eos_ids, load_drafter, load_target
from specfit.planning.stage import stage_main
from specfit.results.records import POINTS_SCHEMA, read_prompts
from specfit.selection.coefficients import (
    fit_dense,
    fit_drafting,
    fit_nnls,
    fit_nnls_ca,
    predict_ca_ms,
    predict_ms,
    preset,
    score,
)
from specfit.selection.pool import CandidatePool
from specfit.selection.search import compile_kernels
from specfit.selection.selectors import select_min_union, select_top_prob
from specfit.speculative.config import MethodConfig
from specfit.speculative.kinds import EAGLE3, SPECFIT_CA
from specfit.speculative.methods import Decision, Method, SpecFitCA, build_method
from specfit.speculative.request import Limits, Session
from specfit.speculative.tree import crop

log = logging.getLogger("specfit.stages.calibrate")

TRAJECTORY = MethodConfig(name=EAGLE3.name)  # the paper's generator: top-2 expansion, depth 5, K = 7
PROBE_TREES = ("prob", "union")  # probability-prefix and minimum-expert-union probe trees


class _StateRoutes:
    """The probe state's routes as a route source (the atlas's role in a measured run), for `time_selection`."""

    full_pool = False

    def __init__(self, routes: np.ndarray):
        self.routes_of_pool = routes  # [n+1, L, k]

    def routes(self, cycle, pool: CandidatePool) -> np.ndarray:
        return self.routes_of_pool[: pool.n + 1]


class Probe(Method):
    """A probe cycle as a method: draft ``levels`` levels, then verify ``nodes`` (EAGLE-3's drafting).

    After every level the ``shadow`` method (specfit-ca over the state's routes) selects too, as it would in a
    decode, and its decision is dropped: the cycle's "select" section times a real selection between real drafter
    and target forwards (a selection timed in a loop of its own runs on warm CPU caches and takes a fraction of it).
    """

    name = "probe"

    def __init__(self, nodes: tuple[int, ...], levels: int, shadow: Method | None = None):
        super().__init__(TRAJECTORY)
        self.nodes, self.levels, self.shadow = nodes, levels, shadow

    def select(self, cycle, pool, final):
        last = final or pool.depth >= self.levels
        if self.shadow is not None:
            self.shadow.select(cycle, pool, last)
        return Decision(self.nodes, pool.depth) if last else None


def shadow_selection(state: ProbeState, num_experts: int, cache: bool) -> Method:
    """specfit-ca over ``state``'s routes, with the paper's A100 coefficients (what it selects does not matter,
    only what selecting costs)."""
    coefficients = {**preset("paper-a100", cache), "cache_aware": None, "drafting": None}
    return SpecFitCA.from_coefficients(MethodConfig(name=SPECFIT_CA.name), coefficients, _StateRoutes(state.routes),
                                       num_experts)


@dataclass
class Snapshot:
    """What a probe cycle changes and `restore` puts back: both KV caches, the drafter's bookkeeping, the output."""

    prefix_len: int
    committed: int
    logits: torch.Tensor | None
    feature: dict
    row: dict
    pending: tuple | None
    n_output: int
    cycles: int

    @classmethod
    def take(cls, session: Session) -> Snapshot:
        state = session.state
        return cls(session.target.prefix_len, state.committed, state.logits, dict(state.feature), dict(state.row),
                   state.pending, len(session.output), session.cycles)

    def restore(self, session: Session) -> None:
        state = session.state
        crop(session.target.cache, self.prefix_len)
        crop(state.cache, self.committed)
        state.committed, state.logits, state.pending = self.committed, self.logits, self.pending
        state.feature, state.row = dict(self.feature), dict(self.row)
        del session.output[self.n_output :]
        session.cycles = self.cycles


@dataclass
class ProbeState:
    """A calibration state: where the trajectory stands, its full pool and the target's routes for it."""

    question_id: int
    cycle: int
    pool: CandidatePool
    routes: np.ndarray  # [n+1, L, k]


class Trajectory:
    """EAGLE-3's greedy trajectory of one calibration question, cycle by cycle."""

    def __init__(self, model, drafter, engine, prompt_ids: list[int], question_id: int, limits: Limits):
        self.question_id = question_id
        self.method = build_method(TRAJECTORY)
        self.session = Session(model, drafter, prompt_ids, limits, request_id=question_id, engine=engine)
        self.session.prefill()

    @property
    def cycle(self) -> int:
        return self.session.cycles

    @property
    def done(self) -> bool:
        """At EOS, or without room for one drafted level."""
        return self.session.done or self.session.room <= 1

    def draft(self) -> tuple[CandidatePool, Decision]:
        """The full pool EAGLE-3 drafts, and its selection."""
        _, pool, decision = self.session.draft(self.method, {})
        return pool, decision

    def finish(self, pool: CandidatePool, decision: Decision) -> None:
        """Verify and commit a drafted cycle."""
        self.session.commit(pool, self.session.verify(pool, decision.nodes, {}), {})

    def step(self) -> None:
        self.finish(*self.draft())


def collect_states(model, drafter, engine, prompts: list[dict], boundaries: list[int], limits: Limits):
    """First pass: the pool and the target's routes at every state (untimed, routes through the engine)."""
    states = []
    for prompt in prompts:
        traj = Trajectory(model, drafter, engine, prompt["prompt_ids"], prompt["question_id"], limits)
        while traj.cycle <= max(boundaries) and not traj.done:
            pool, decision = traj.draft()
            if traj.cycle in boundaries:
                routes = traj.session.target.routes(pool).numpy().astype(np.int64)  # [n+1, L, k]
                states.append(ProbeState(prompt["question_id"], traj.cycle, pool, routes))
            traj.finish(pool, decision)
        missed = sorted(set(boundaries) - {s.cycle for s in states if s.question_id == prompt["question_id"]})
        if missed:
            log.warning("question %d ended before cycles %s: fewer states", prompt["question_id"], missed)
    return states


def probe_trees(state: ProbeState, num_experts: int, sizes: int):
    """(k, tree, nodes, F) of both probe trees of every size k < sizes that the pool can hold."""
    pool = state.pool.view(state.routes, num_experts)
    for k in range(min(sizes, pool.n + 1)):
        for tree in PROBE_TREES:
            sel = select_top_prob(pool, k) if tree == "prob" else select_min_union(pool, k)
            yield k, tree, sel.nodes, pool.expert_union(sel.nodes)


@dataclass(frozen=True)
class ProbeRun:
    """One timed probe cycle: its time, its drafting, and the verify forward's expert misses and hits."""

    cycle_s: float  # the whole cycle but the shadow selection
    draft_s: float  # the Session's "draft" section: drafter catch-up and the drafted levels
    select_s: float  # the shadow selection's "select" sections (specfit-ca's selection after every level)
    levels: int  # pool levels drafted
    caught_up: int  # committed tokens the drafter caught up on first (0 right after prefill)
    misses: int  # experts of the union copied by the cycle, summed over layers (M)
    hits: int  # experts of the union resident when the cycle's forward met them (H)


def probe_cycle(traj: Trajectory, expected: CandidatePool, nodes: tuple[int, ...], shadow: Method | None = None
                ) -> ProbeRun:
    """One cycle that drafts min(depth(S) + 1, 5) levels, verifies S ∪ {s} and commits; then undo it."""
    levels = min(max((expected.level[v] for v in nodes), default=0) + 1, expected.depth)
    session = traj.session
    engine = session.target.engine
    snap = Snapshot.take(session)
    caught_up = len(session.state.pending[0]) if session.state.pending is not None else 0
    times: dict[str, float] = {"draft": 0.0, "select": 0.0}
    before = engine.stats() if engine is not None else None
    with session.clock.section(times, "cycle"):
        _, pool, decision = session.draft(Probe(nodes, levels, shadow), times)
        session.commit(pool, session.verify(pool, decision.nodes, {}), {})
    after = engine.stats() if engine is not None else None
    if pool.token != expected.token[: len(pool.token)]:
        raise SpecFitError(f"question {traj.question_id}, cycle {traj.cycle}: the probe drafted another pool")
    snap.restore(session)
    misses, hits = ((after[c] - before[c] for c in ("misses", "hits")) if engine is not None else (0, 0))
    return ProbeRun(times["cycle"] - times["select"], times["draft"], times["select"], decision.drafted_levels,
                    caught_up, misses, hits)


def measure(model, drafter, engine, prompts, states: list[ProbeState], protocol: dict, limits: Limits) -> dict:
    """Second pass: every probe tree of every state, timed ``repeats`` times on the live expert cache."""
    rows = {name: [] for name in POINTS_SCHEMA.names}
    by_question: dict[int, list[ProbeState]] = {}
    for s in states:
        by_question.setdefault(s.question_id, []).append(s)
    index = 0
    for prompt in prompts:
        todo = {s.cycle: s for s in by_question.get(prompt["question_id"], [])}
        traj = Trajectory(model, drafter, engine, prompt["prompt_ids"], prompt["question_id"], limits)
        while todo and not traj.done:
            state = todo.pop(traj.cycle, None)
            if state is not None:
                for k, tree, nodes, union in probe_trees(state, engine.num_experts, protocol["sizes"]):
                    shadow = shadow_selection(state, engine.num_experts, engine.config.slots > 0)
                    probes = [probe_cycle(traj, state.pool, nodes, shadow) for _ in range(protocol["repeats"])]
                    times = [1e3 * p.cycle_s for p in probes]
                    draft = [1e3 * p.draft_s for p in probes]
                    for name, value in (("question_id", state.question_id), ("state", index), ("cycle", state.cycle),
                                        ("k", k), ("tree", tree), ("nodes", list(nodes)), ("levels", probes[0].levels),
                                        ("F", union), ("y_ms", float(np.mean(times))), ("y_repeats_ms", times),
                                        ("misses", probes[0].misses), ("hits", probes[0].hits),
                                        ("misses_repeats", [p.misses for p in probes]),
                                        ("hits_repeats", [p.hits for p in probes]),
                                        ("draft_ms", float(np.mean(draft))), ("draft_repeats_ms", draft),
                                        ("caught_up", probes[0].caught_up),
                                        ("select_ms", float(np.mean([1e3 * p.select_s for p in probes])))):
                        rows[name].append(value)
                index += 1
            traj.step()
    return rows


def fit_draft_cost(rows: dict) -> dict:
    """`specfit.selection.coefficients.DraftCost`'s drafting terms from the probes' "draft" sections (one row per
    repeat): start and level by NNLS over the probes that caught the drafter up (those right after prefill do not; all
    probes when none did); ``select_ms`` the probes' shadow selections per drafted level (`Probe`)."""
    repeats = [len(t) for t in rows["draft_repeats_ms"]]
    levels = np.repeat(rows["levels"], repeats)  # [n * repeats]
    draft = np.concatenate(rows["draft_repeats_ms"])
    caught = np.repeat(rows["caught_up"], repeats) > 0
    use = caught if caught.any() else np.ones_like(caught)
    start, level, r2 = fit_drafting(levels[use], draft[use])
    select_ms = float(np.sum(rows["select_ms"]) / np.sum(rows["levels"]))  # per selection: one after every level
    return {"start_ms": start, "level_ms": level, "select_ms": select_ms, "r2": r2, "n_points": int(use.sum())}


def priced_selection(drafting: dict, emulate: dict | None) -> dict:
    """``drafting`` with the selection specfit-ca prices: the emulated host's ``select_ms`` where the device entry
    gives one (the same on every machine and run, as the decisions read off it then are), else the probes' measured
    time; the measured one is kept beside it."""
    device = (emulate or {}).get("select_ms")
    measured = drafting["select_ms"]
    return {**drafting, "select_ms": measured if device is None else float(device), "select_measured_ms": measured,
            "select_source": "measured" if device is None else "device"}


def fit_cache_aware(rows: dict, sizes: int) -> tuple[dict, list[float]]:
    """The cache-aware fit on one row per repeat: its JSON entry and the prediction of every probe's mean time."""
    repeats = [len(t) for t in rows["y_repeats_ms"]]
    k = np.repeat(rows["k"], repeats)  # [n * repeats]
    misses = np.concatenate(rows["misses_repeats"])
    hits = np.concatenate(rows["hits_repeats"])
    fit = fit_nnls_ca(k, misses, hits, np.concatenate(rows["y_repeats_ms"]), sizes)
    per_repeat = predict_ca_ms(fit.b, fit.beta_miss, fit.beta_hit, k, misses, hits)
    pred = [float(np.mean(p)) for p in np.split(per_repeat, np.cumsum(repeats)[:-1])]
    r2_means, rmse_means = score(rows["y_ms"], pred)
    union = np.repeat(rows["F"], repeats)
    # The same model without the probes' drafting (y - draft time): the part of a cycle the verified subtree
    # decides. specfit-ca adds its drafting cost D(d) itself (`fit_draft_cost`), so drafting is counted once.
    verify = fit_nnls_ca(k, misses, hits, np.concatenate(rows["y_repeats_ms"]) - np.concatenate(
        rows["draft_repeats_ms"]), sizes)
    entry = {**fit.as_dict(), "fit_on": "repeats", "r2_means": r2_means, "rmse_means_ms": rmse_means,
             "n_probes": len(rows["k"]), "union_mismatches": int(np.sum(misses + hits != union)),
             "without_drafting": {"b": verify.b, "beta_miss": verify.beta_miss, "beta_hit": verify.beta_hit,
                                  "r2": verify.r2, "rmse_ms": verify.rmse_ms}}
    return entry, pred


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    cache = spec["slots"] > 0
    if spec["coefficients"] != "fit":
        coefficients = preset(spec["coefficients"], cache)
        write_parquet(POINTS_SCHEMA.empty_table(), outputs["points"])
        write_json({**coefficients, "source": spec["coefficients"], "cache": cache, "slots": spec["slots"],
                    "cache_aware": None, "drafting": None, "dense": None,
                    "r2": None, "rmse_ms": None, "max_abs_residual_ms": None, "n_points": 0,
                    "link_emulated": False, "timing_label": "the paper's Appendix B"}, outputs["coefficients"])
        return
    protocol = spec["protocol"]
    torch.manual_seed(spec["seed"])
    check_checkpoints(inputs["target"], inputs["drafter"], spec["model"])  # configs and headers, before any weight
    model, _ = load_target(inputs["target"], spec["dtype"], "cpu", key=f"models.{spec['model']}.target",
                           logits_dtype=spec["logits_dtype"], verify=spec["verify"])
    engine = make_engine(model, spec["slots"], spec["max_inflight"], spec["link"], spec["torch_device"],
                         spec["emulate"])
    drafter = load_drafter(inputs["drafter"], model, device=spec["torch_device"], key=f"models.{spec['model']}.drafter")
    engine.emulate_drafter(drafter)
    prompts = read_prompts(inputs["prompts"])
    limits = Limits(protocol["limit_tokens"], protocol["limit_tokens"], eos_ids(model))
    compile_kernels()  # the probes time selections: no compilation inside them
    with torch.inference_mode():
        states = collect_states(model, drafter, engine, prompts, protocol["cycle_boundaries"], limits)
        if not states:
            raise SpecFitError("no calibration state: every calibration question ended before its first cycle")
        warm = Trajectory(model, drafter, engine, prompts[0]["prompt_ids"], prompts[0]["question_id"], limits)
        warm.step()  # warm-up, untimed; then an empty expert cache, as every measured stream starts
        engine.clear_cache()
        engine.reset_stats()
        rows = measure(model, drafter, engine, prompts, states, protocol, limits)
    fit = fit_nnls(rows["k"], rows["F"], rows["y_ms"], protocol["sizes"])
    rows["pred_ms"] = predict_ms(fit.b, fit.beta, rows["k"], rows["F"]).tolist()
    cache_aware, rows["pred_ca_ms"] = fit_cache_aware(rows, protocol["sizes"])
    drafting = priced_selection(fit_draft_cost(rows), spec["emulate"])
    write_parquet(pa.Table.from_pydict(rows, schema=POINTS_SCHEMA), outputs["points"])
    dense = fit_dense(rows["k"], rows["y_ms"], protocol["sizes"])
    write_json({**fit.as_dict(), "source": "fit", "cache": cache, "slots": spec["slots"], "states": len(states),
                "cache_aware": cache_aware, "drafting": drafting, "dense": dense.as_dict(),
                "link_emulated": engine.link_emulated, "timing_label": engine.timing_label,
                "h2d_transfers": engine.h2d_transfers, "device": engine.stats().get("device")},
               outputs["coefficients"])
    log.info("fit over %d points: b = %s ms, beta = %.4f ms, R^2 = %.3f (%s)", fit.n_points,
             [round(v, 3) for v in fit.b], fit.beta, fit.r2, engine.timing_label)
    log.info("cache-aware fit over %d repeats: b = %s ms, beta_miss = %.4f ms, beta_hit = %.4f ms%s, R^2 = %.3f "
             "(%.3f on the probe means)", cache_aware["n_points"],
             [round(v, 3) for v in cache_aware["b"]], cache_aware["beta_miss"], cache_aware["beta_hit"],
             "" if cache_aware["beta_hit_identified"] else " (unidentified: no hits)", cache_aware["r2"],
             cache_aware["r2_means"])
    log.info("drafting: start %.3f ms, each further level %.3f ms (R^2 %.3f), one selection %.4f ms (%s; measured "
             "%.4f ms)", drafting["start_ms"], drafting["level_ms"], drafting["r2"], drafting["select_ms"],
             drafting["select_source"], drafting["select_measured_ms"])
    if cache_aware["union_mismatches"]:
        log.warning("%d probe cycles had misses + hits != F: the verify forward routed differently from the route "
                    "query (rounding at a router margin)", cache_aware["union_mismatches"])


main = stage_main(run)

if __name__ == "__main__":
    main()
