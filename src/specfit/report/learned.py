"""Beyond the paper: learned routes (``routes: learned``, issue 13). SpecFit reads its routes from a trained route
predictor (`specfit.speculative.learned`, trained by `specfit.predictor`) instead of the target (the paper's oracle,
``routes: atlas``). Per cell (workload × slots) of one (model, device) where a learned-route run exists: exact routes,
learned routes and the paper's simulated 60% predictor (``routes: noisy``, where it ran in the cell) side by side,
EAGLE-3 beside them; the issue's goals judged with the paired bootstrap intervals; and the predictor itself (its
held-out recall per layer, its size and cost, at this model's size and at Qwen3-30B-A3B's beside the paper's
estimate of Section 4.6).

The goals: route accuracy at least 60% (held-out, draft nodes, mean over layers); learned-route SpecFit at least
98% of SpecFit's decode TPS with exact routes (a tie within the interval counts); faster than EAGLE-3 in every cell
where SpecFit with exact routes is (a tie does not count); the predictor's time at most 5% of a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specfit.report.inputs import METRICS, ROUTE_PREDICTOR, learned_methods, predictor_metrics, tps_cell
from specfit.report.page import EMULATED, MISSING, Section, Table, cache_cell, fmt, interval_note, tagged, x_cell
from specfit.speculative.routes import predictor_cost
from specfit.workflow import DecodeRun, method_config, method_rule

if TYPE_CHECKING:
    from specfit.report.sections import Group

TITLE = "Beyond the paper: learned routes"
ACCURACY_GOAL = 0.60  # held-out route accuracy of the predictor
TPS_GOAL = 0.98  # learned / exact-route SpecFit decode TPS (a tie within the interval counts)
SHARE_GOAL_PCT = 5.0  # the predictor's share of the decode cycles' time
# Qwen3-30B-A3B, the paper's model: the size at which the paper estimates its predictor (Section 4.6)
PAPER_MODEL = "Qwen3-30B-A3B"
PAPER_SIZE = {"hidden_size": 2048, "num_layers": 48, "num_experts": 128}

MET, MISSED, NOT_REQUIRED, UNJUDGED = "met", "missed", "not required", "unjudged"


@dataclass
class Outcome:
    """One goal in one cell: its state (MET, MISSED, NOT_REQUIRED, UNJUDGED) and the cell's text."""

    state: str
    text: str
    reason: str = ""  # why it is not judged (UNJUDGED)
    tie: bool = False  # met by a tie within the interval


def unjudged(reason: str) -> Outcome:
    return Outcome(UNJUDGED, f"not judged ({reason})", reason)


@dataclass
class Cell:
    """One workload × slots of a learned-route method: the runs beside it (None: not in the config's matrix), the
    ratios and the goals."""

    workload: str
    slots: int
    learned: DecodeRun
    atlas: DecodeRun | None
    noisy: list[DecodeRun]
    eagle3: DecodeRun | None
    vs_atlas: dict | None = None  # learned / atlas decode TPS, paired interval
    atlas_vs_eagle3: dict | None = None
    learned_vs_eagle3: dict | None = None
    goals: dict[str, Outcome] = field(default_factory=dict)  # "tps", "eagle3", "share"

    @property
    def label(self) -> str:
        return f"{self.workload}, cache {cache_cell(self.slots)}"


def atlas_of(spec: dict, method: str) -> str | None:
    """The method with the same rule as ``method`` and exact routes (the oracle version)."""
    rule = method_rule(spec, method)
    return next((m for m in spec["methods"] if method_rule(spec, m) == rule
                 and method_config(spec, m).route_source.name == "atlas"), None)


def noisy_of(spec: dict, method: str) -> list[str]:
    """The methods with the same rule as ``method`` and the simulated predictor's noisy routes."""
    rule = method_rule(spec, method)
    return [m for m in spec["methods"] if method_rule(spec, m) == rule
            and method_config(spec, m).route_source.name == "noisy"]


def pct(value, spec: str = ".1f") -> str:
    return MISSING if value is None else f"{100.0 * value:{spec}}%"


def share_pct(m: dict | None) -> float | None:
    rp = None if m is None else m.get(ROUTE_PREDICTOR)
    return None if rp is None else rp.get("share_of_cycle_time_pct")


def predictor_ms_per_cycle(m: dict | None) -> float | None:
    """The predictor's time per decode cycle (ms): its seconds over the run's cycles."""
    rp = None if m is None else m.get(ROUTE_PREDICTOR)
    if rp is None or rp.get("seconds") is None or not m.get("cycles"):
        return None
    return 1e3 * rp["seconds"] / m["cycles"]


def count(n: int) -> str:
    return f"{n:,}"


def millions(n: float) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e5 else f"{n / 1e6:.2g}M"


# ------------------------------------------------------------------------------------ the goals per cell
def why_unjudged(runs: list[DecodeRun | None], metrics: dict, what: str) -> str:
    if any(r is None for r in runs):
        return f"no {what} run in this cell"
    if lacking := [r.method for r in runs if r not in metrics]:
        return f"no metrics.json of {', '.join(lacking)}"
    return "no interval: a requests.parquet is missing"


def judge_tps(c: Cell, metrics: dict) -> Outcome:
    """Learned at least TPS_GOAL of exact routes' decode TPS; a tie within the interval counts as met."""
    e = c.vs_atlas
    if e is None or e.get("verdict") is None:
        return unjudged(why_unjudged([c.learned, c.atlas], metrics, "exact-route"))
    if e["verdict"] == "tie":
        return Outcome(MET, "yes (tie within the interval)", tie=True)
    return Outcome(MET, "yes") if e["value"] >= TPS_GOAL else Outcome(MISSED, "no")


def judge_eagle3(c: Cell, metrics: dict) -> Outcome:
    """Faster than EAGLE-3 where exact routes are (a tie does not count); elsewhere not required."""
    atlas, learned = c.atlas_vs_eagle3, c.learned_vs_eagle3
    if atlas is None or atlas.get("verdict") is None:
        return unjudged(why_unjudged([c.atlas, c.eagle3], metrics, "exact-route or EAGLE-3"))
    if atlas["verdict"] != "faster":
        return Outcome(NOT_REQUIRED, f"not required (exact routes {atlas['verdict']} than EAGLE-3)"
                       if atlas["verdict"] == "slower" else "not required (exact routes tie with EAGLE-3)")
    if learned is None or learned.get("verdict") is None:
        return unjudged(why_unjudged([c.learned, c.eagle3], metrics, "EAGLE-3"))
    return Outcome(MET, "yes") if learned["verdict"] == "faster" else Outcome(MISSED, f"no ({learned['verdict']})")


def judge_share(c: Cell, metrics: dict) -> Outcome:
    m = metrics.get(c.learned)
    if m is None:
        return unjudged("no metrics.json")
    share = share_pct(m)
    if share is None:
        return unjudged(f"its metrics.json has no {ROUTE_PREDICTOR}")
    return Outcome(MET, "yes") if share <= SHARE_GOAL_PCT else Outcome(MISSED, "no")


def goal_line(n: int, what: str, cells: list[Cell], key: str, extra: str = "") -> tuple[str, str]:
    """The verdict of one goal over the cells, (state, sentence): met when every cell that requires it meets it;
    ``extra`` follows the count of cells."""
    outcomes = [(c, c.goals[key]) for c in cells]
    met = [c for c, o in outcomes if o.state == MET]
    missed = [c for c, o in outcomes if o.state == MISSED]
    not_judged = [(c, o) for c, o in outcomes if o.state == UNJUDGED]
    required = [c for c, o in outcomes if o.state != NOT_REQUIRED]
    state = MISSED if missed else UNJUDGED if not_judged else MET
    tally = f"Met in {len(met)} of {len(required)} cells" if required else "No cell requires it"
    tally += extra
    if missed:
        tally += "; missed in: " + "; ".join(c.label for c in missed)
    if not_judged:
        tally += "; not judged in: " + "; ".join(f"{c.label} ({o.reason})" for c, o in not_judged)
    word = {MET: "met", MISSED: "not met", UNJUDGED: "not judged"}[state]
    return state, f"Goal {n}, {what}: {word}. {tally}."


# ------------------------------------------------------------------------------------ the section
def learned_routes(g: Group) -> Section | None:
    """The section of one (model, device); None when no method has ``routes: learned`` or none runs here."""
    spec, i = g.spec, g.i
    matrix = set(g.runs)
    cells = []
    for method in learned_methods(spec):
        atlas, noisy = atlas_of(spec, method), noisy_of(spec, method)
        for w in g.workloads:
            slots = sorted({r.slots for r in g.runs if r.workload == w and r.method == method},
                           key=lambda s: (s == 0, -s))
            for s in slots:
                runs = {name: DecodeRun(g.model, g.device, w, name, s) for name in (method, atlas, *noisy,
                                                                                     g.roles.eagle3)}
                runs = {name: r for name, r in runs.items() if name is not None and r in matrix}
                cells.append(Cell(w, s, runs[method], runs.get(atlas), [runs[n] for n in noisy if n in runs],
                                  runs.get(g.roles.eagle3)))
    if not cells:
        return None
    sec = Section(TITLE)
    keys = [r for c in cells for r in (c.atlas, c.learned, *c.noisy, c.eagle3) if r is not None]
    sec.missing += i.missing(keys)
    sec.missing += i.missing_requests(keys)
    sec.missing += i.missing_predictor(g.model)
    predictor = i.predictor.get(g.model)
    emulated = g.emulated(keys)

    rows = []
    for c in cells:
        c.vs_atlas = i.speedup(c.learned, c.atlas)
        c.atlas_vs_eagle3 = i.speedup(c.atlas, c.eagle3)
        c.learned_vs_eagle3 = i.speedup(c.learned, c.eagle3)
        c.goals = {"tps": judge_tps(c, i.metrics), "eagle3": judge_eagle3(c, i.metrics),
                   "share": judge_share(c, i.metrics)}
        side = [(c.atlas, "exact (atlas)", "100% (exact)"),
                (c.learned, "learned", MISSING if predictor is None else f"{pct(predictor['route_accuracy'])} "
                                                                         "(held-out)"),
                *[(r, "noisy (simulated)", f"{pct(method_config(spec, r.method).accuracy, '.0f')} (configured)")
                  for r in c.noisy],
                (c.eagle3, "none (full draft tree)", MISSING)]
        for r, routes, accuracy in side:
            if r is None:
                continue
            m = i.metrics.get(r)
            rows.append([c.workload, cache_cell(c.slots), r.method, routes, accuracy,
                         MISSING if m is None else fmt(m["draft_nodes_per_cycle"], ".2f"),
                         MISSING if m is None else fmt(m["committed_per_cycle"], ".2f"),
                         tps_cell(i.tps(r)),
                         MISSING if r in (c.atlas, c.eagle3) else x_cell(i.speedup(r, c.atlas)),
                         fmt(share_pct(m), ".2f") if r == c.learned else MISSING])
    atlas_name = next((c.atlas.method for c in cells if c.atlas is not None), None) or "exact routes"
    eagle_name = g.roles.eagle3 or "EAGLE-3"
    sec.tables.append(Table(
        tagged(f"Exact vs learned vs simulated noisy routes, {g.model} / {g.device}", emulated),
        ["Workload", "Cache", "Method", "Routes", "Route accuracy", METRICS["draft_nodes_per_cycle"].label
         + " per cycle", METRICS["committed_per_cycle"].label + " per cycle", tagged("Decode TPS", emulated),
         tagged(f"/ {atlas_name} (×)", emulated), tagged("Predictor share of cycle time (%)", emulated)],
        rows))

    learned_name = cells[0].learned.method
    goal_rows = [[c.workload, cache_cell(c.slots), x_cell(c.vs_atlas), c.goals["tps"].text,
                  x_cell(c.atlas_vs_eagle3), x_cell(c.learned_vs_eagle3), c.goals["eagle3"].text,
                  fmt(share_pct(i.metrics.get(c.learned)), ".2f"), c.goals["share"].text] for c in cells]
    sec.tables.append(Table(
        tagged(f"{learned_name} against the issue's goals per cell, {g.model} / {g.device}", emulated),
        ["Workload", "Cache", tagged(f"{learned_name} / {atlas_name} (×)", emulated),
         f"≥ {100 * TPS_GOAL:.0f}% of {atlas_name}", tagged(f"{atlas_name} / {eagle_name} (×)", emulated),
         tagged(f"{learned_name} / {eagle_name} (×)", emulated),
         f"Faster than {eagle_name} where {atlas_name} is",
         tagged("Predictor share of cycle time (%)", emulated), f"≤ {SHARE_GOAL_PCT:g}% of a cycle"],
        goal_rows))

    sec.notes.append(
        f"{learned_name} is SpecFit without the paper's oracle: instead of the target's own routes of every draft "
        "node (exact routes, read from the atlas), a linear route predictor trained on the target's routes of "
        "drafted pools from questions no workload evaluates guesses each node's top-k experts per MoE layer from "
        "what the drafter holds for the node (its hidden state and its token's embedding), inside the timed "
        "decode loop. Route accuracy: the fraction of the true top-k experts predicted (exact routes: 100%; "
        "learned: the predictor's held-out accuracy over draft nodes, mean over layers; noisy: the paper's "
        "simulated predictor, each expert kept with the configured probability).")
    sec.notes += goal_notes(g, cells, predictor, emulated, atlas_name, eagle_name)
    sec.notes.append(interval_note(i.seed))
    if predictor is not None:
        predictor_table(g, sec, predictor, cells, emulated)
    return sec


def goal_notes(g: Group, cells: list[Cell], predictor: dict | None, emulated: bool, atlas: str, eagle: str
               ) -> list[str]:
    """The verdict on each of the issue's four goals, then all together."""
    states, notes = [], []
    if predictor is None:
        states.append(UNJUDGED)
        notes.append(f"Goal 1, route accuracy ≥ {100 * ACCURACY_GOAL:.0f}%: not judged. "
                     f"{predictor_metrics(g.model)} is missing.")
    else:
        acc = predictor["route_accuracy"]
        layers = predictor["recall_per_layer"]
        low = [j for j, r in enumerate(layers) if r < ACCURACY_GOAL]
        states.append(MET if acc >= ACCURACY_GOAL else MISSED)
        per_layer = ", ".join(f"layer {j} {pct(r)}" for j, r in enumerate(layers))
        notes.append(
            f"Goal 1, route accuracy ≥ {100 * ACCURACY_GOAL:.0f}%: {'met' if states[-1] == MET else 'not met'}. "
            f"Held-out route accuracy {pct(acc)} over {count(predictor['validation_nodes'])} draft nodes of "
            f"{predictor['validation_requests']} held-out requests (chance {pct(predictor['chance_accuracy'])}); "
            f"per layer: {per_layer}; "
            + (f"below {100 * ACCURACY_GOAL:.0f}% in layer{'s' if len(low) > 1 else ''} "
               f"{', '.join(map(str, low))}." if low else f"every layer ≥ {100 * ACCURACY_GOAL:.0f}%."))
    ties = sum(c.goals["tps"].tie for c in cells)
    state, text = goal_line(2, f"decode TPS ≥ {100 * TPS_GOAL:.0f}% of SpecFit with exact routes ({atlas})", cells,
                            "tps", f", {ties} of them by a tie within the interval (a tie counts as met)" if ties
                            else "")
    states.append(state)
    notes.append(text)
    required = sum(c.goals["eagle3"].state != NOT_REQUIRED for c in cells)
    state, text = goal_line(3, f"faster than {eagle} wherever {atlas} is (a tie does not count)", cells, "eagle3",
                            f" that require it (the other {len(cells) - required} do not: there {atlas} is not "
                            f"faster than {eagle})" if 0 < required < len(cells) else
                            f": in none of the {len(cells)} cells is {atlas} faster than {eagle}" if not required
                            else "")
    states.append(state)
    notes.append(text)
    shares = [s for s in (share_pct(g.i.metrics.get(c.learned)) for c in cells) if s is not None]
    state, text = goal_line(4, f"predictor time ≤ {SHARE_GOAL_PCT:g}% of a cycle", cells, "share",
                            tagged(f"; largest share {max(shares):.2f}%", emulated) if shares else "")
    states.append(state)
    notes.append(text)
    met = states.count(MET)
    verdict = f"Issue 13's goals, {g.model} / {g.device}: {met} of {len(states)} met"
    for word, which in (("not met", MISSED), ("not judged", UNJUDGED)):
        goals = [str(j + 1) for j, s in enumerate(states) if s == which]
        if goals:
            verdict += f"; {word}: goal{'s' if len(goals) > 1 else ''} {' and '.join(goals)}"
    return [verdict + "."] + notes


def predictor_table(g: Group, sec: Section, p: dict, cells: list[Cell], emulated: bool) -> None:
    """The predictor: held-out recall per layer, accuracy, size, cost and time, beside its cost at the paper's
    model's size and the paper's estimate."""

    big = predictor_cost(**PAPER_SIZE)
    paper = g.i.paper.get("route_prediction", {})
    head = paper.get("linear_head_predictor", {})
    paper_params, paper_mflop, paper_ms = (head.get("params_millions"), head.get("mflop_per_node"),
                                           head.get("added_ms_per_cycle"))
    device = p["torch_device"]
    per_cycle = [x for x in (predictor_ms_per_cycle(g.i.metrics.get(c.learned)) for c in cells) if x is not None]
    t = p["training"]
    rows = [
        ["Held-out route accuracy (draft nodes, mean over layers)", pct(p["route_accuracy"]), MISSING,
         MISSING if paper.get("accuracy_pct") is None else f"{paper['accuracy_pct']:g}% (simulated predictor)"],
        ["Held-out recall per MoE layer", ", ".join(f"{j}: {pct(r)}" for j, r in enumerate(p["recall_per_layer"])),
         MISSING, MISSING],
        ["Held-out accuracy of the root's routes", pct(p["root_accuracy"]), MISSING, MISSING],
        ["Training accuracy", pct(p["train_accuracy"]), MISSING, MISSING],
        ["Chance accuracy (top-k of the experts)", pct(p["chance_accuracy"]), MISSING, MISSING],
        ["Parameters", f"{count(p['params'])} ({millions(p['params'])})",
         f"{count(big['params'])} ({millions(big['params'])})",
         MISSING if paper_params is None else f"{paper_params:g}M"],
        ["FLOP per node", f"{count(p['flop_per_node'])} ({p['flop_per_node'] / 1e6:.3g} MFLOP)",
         f"{count(big['flop_per_node'])} ({big['flop_per_node'] / 1e6:.3g} MFLOP)",
         MISSING if paper_mflop is None else f"{paper_mflop:g} MFLOP"],
        [f"µs per pool of {p['pool_nodes_timed']} nodes (on {device}: compute only, no link)",
         fmt(p["us_per_pool"], ".1f"), MISSING, MISSING],
        [tagged(f"Predictor ms per decode cycle in the {g.device} runs", emulated),
         MISSING if not per_cycle else (f"{min(per_cycle):.3f}" if len(per_cycle) == 1
                                        else f"{min(per_cycle):.3f} – {max(per_cycle):.3f}"),
         MISSING, MISSING if not paper_ms else "–".join(f"{x:g}" for x in paper_ms) + " (added ms per cycle)"],
        ["Training", f"{t['steps']} steps, {t['seconds']:.1f} s on {device} ({t.get('threads', '?')} threads), final "
                     f"loss {t['loss']:.3f}; {p['train_requests']} requests ({count(p['train_nodes'])} pool nodes), "
                     f"{p['validation_requests']} held out ({count(p['validation_nodes'])} draft nodes)",
         MISSING, MISSING],
    ]
    size = (f"hidden {p['hidden_size']}, {p['num_layers']} MoE layers, {p['num_experts']} experts, "
            f"top-{p['top_k']}")
    big_size = (f"hidden {PAPER_SIZE['hidden_size']}, {PAPER_SIZE['num_layers']} MoE layers, "
                f"{PAPER_SIZE['num_experts']} experts")
    sec.tables.append(Table(
        f"The route predictor of {g.model} ({predictor_metrics(g.model)}), and its cost at {PAPER_MODEL}'s size",
        ["Quantity", f"{g.model} ({size})", f"At {PAPER_MODEL}'s size ({big_size})",
         "Paper's estimate (section 4.6)"], rows))
    note = (f"The predictor is one linear router per MoE layer over a node's hidden state and its token's embedding "
            f"(2 × hidden inputs). At {PAPER_MODEL}'s size that is {millions(big['params'])} parameters and "
            f"{big['flop_per_node'] / 1e6:.3g} MFLOP per node")
    if paper_params and paper_mflop:
        note += (f", {big['params'] / (paper_params * 1e6):.1f}× the paper's estimate of a linear head from the "
                 f"hidden state alone ({paper_params:g}M parameters, {paper_mflop:g} MFLOP per node, section 4.6): "
                 "the token's embedding doubles its inputs")
    note += (f". Its µs per pool is plain {device} compute, timed apart from any link (the {g.device} runs' link "
             f"is {'emulated' if emulated else 'real'}); its ms per decode cycle is measured inside those runs"
             + (f" and labelled “{EMULATED}”." if emulated else "."))
    sec.notes.append(note)
