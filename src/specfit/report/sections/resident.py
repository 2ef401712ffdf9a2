"""Beyond the paper: every expert resident (docs/devices.md). On a device defined by measured verify widths, with
nothing copied, AR, EAGLE-3 at the paper's tree and at the tree the tune rule found best, SpecFit and specfit-ca per
gather mode, workload and assumed drafter cost: ms per cycle, decode TPS, the verify widths each chose, and three
claims with verdicts (SpecFit never slower than AR, faster than the best fixed EAGLE-3, what a batched gather adds),
drawn with each cell's ratio against the line at 1.
"""

from dataclasses import dataclass, field

from specfit.planning.matrix import DecodeRun, method_config
from specfit.report.figures import Mark, claims_chart, slug
from specfit.report.page import MISSING, Estimate, Section, fmt, interval_note, note, table, tagged
from specfit.report.quantities import column, metric, tps_cell, x_cell
from specfit.report.scope import ModelScope
from specfit.report.verdict import Verdict
from specfit.speculative.kinds import AR, EAGLE3, EAGLE3_TUNED, SPECFIT, SPECFIT_CA
from specfit.speculative.tuning import tree_label

TITLE = "Beyond the paper: every expert resident"
ROLES = (AR.name, EAGLE3.name, EAGLE3_TUNED.name, SPECFIT.name, SPECFIT_CA.name)  # the rows of a place, in order
# the thread's projection for a batched gather on the M5 Max (Nemotron 3.5 Lightning 30B-A3B): 180-230 tok/s from
# 115-134 tok/s plain decoding
PROJECTED = {"plain": (115.0, 134.0), "speculative": (180.0, 230.0)}
KEYS = ("ms_per_cycle", "committed_per_cycle")
EDGE = {"max_depth": "depth", "top_k_expand": "width"}  # a tuned tree at the grid's edge says so


@dataclass
class Place:
    """One resident device (a gather mode at one assumed drafter cost) and workload: the run of each role."""

    device: str
    gather: str
    draft_share: float
    workload: str
    runs: dict[str, DecodeRun | None] = field(default_factory=dict)  # by role (kind name)

    @property
    def label(self) -> str:
        return f"{self.gather} gather, drafter {self.draft_share:g}, {self.workload}"


@dataclass(frozen=True)
class ResidentClaim:
    """A row of the resident claims' table: the claim, its cells' tally, this run's ratios as printed and the verdict,
    with each cell's ratio (the figure's rows) and the range the claim projects, if one."""

    key: str
    claim: str
    tally: str
    run: str
    verdict: Verdict
    cells: list[tuple[Place, Estimate | None]]
    projected: tuple[float, float] | None = None


def places(model_scope: ModelScope) -> list[Place]:
    """Every resident device of the model × each workload it ran, its roles' runs (None: not in the matrix)."""
    out, spec = [], model_scope.spec
    for d, scope in model_scope.on.items():
        resident = spec["devices"][d].get("resident")
        if resident is None:
            continue
        names = {AR.name: scope.roles.ar, EAGLE3.name: scope.roles.eagle3, EAGLE3_TUNED.name: scope.roles.eagle3_tuned,
                 SPECFIT.name: scope.roles.specfit, SPECFIT_CA.name: scope.roles.specfit_ca}
        for w in scope.workloads:
            runs = {role: r if (r := scope.run(w, names[role], scope.main)) in scope.runs else None for role in ROLES}
            out.append(Place(d, resident["gather"], resident["draft_share"], w, runs))
    return out


def measurement(spec: dict, device: str) -> tuple:
    """What two resident devices share when they differ in their gather alone."""
    r = spec["devices"][device]["resident"]
    return r["name"], tuple(r["widths"]), tuple(r["ms"]), r["draft_share"]


def section(model_scope: ModelScope) -> Section | None:
    """None when the model ran on no resident device."""
    if not (ps := places(model_scope)):
        return None
    inputs, sec = model_scope.inputs, Section(TITLE)
    runs = [r for p in ps for r in p.runs.values() if r is not None]
    sec.missing += inputs.missing(runs) + inputs.missing_requests(runs)
    emulated = any(inputs.metrics[r]["link_emulated"] for r in runs if r in inputs.metrics)
    labels = sorted({inputs.metrics[r]["timing_label"] for r in runs if r in inputs.metrics})
    sec.notes.append(note("resident", labels=labels))
    ps = sorted(ps, key=lambda p: (p.gather, p.draft_share, p.workload))
    rows = [(p, role, r) for p in ps for role, r in p.runs.items() if r in inputs.metrics]
    caption = tagged(f"Every expert resident, {model_scope.model}", emulated)
    sec.tables.append(table(model_scope.id("resident"), caption, [
        ("Gather", lambda x: x[0].gather), ("Drafter share", lambda x: f"{x[0].draft_share:g}"),
        ("Workload", lambda x: x[0].workload), ("Method", lambda x: x[2].method),
        ("Tree", lambda x: tree(inputs, x[1], x[2])),
        *(metric(inputs.metrics, k, emulated, run=lambda x: x[2]) for k in KEYS),
        (column("tps_dec", emulated), lambda x: tps_cell(inputs.tps(x[2]))),
        (tagged("× AR", emulated), lambda x: x_cell(inputs.speedup(x[2], x[0].runs[AR.name]))),
        ("Verify width, mean", lambda x: fmt(mean_width(inputs.metrics[x[2]]), ".2f")),
        ("Cycles by verify width (%)", lambda x: widths_cell(inputs.metrics[x[2]]))], rows, key=lambda x: x[2]))
    claims = claim_rows(model_scope, ps)
    if claims:
        sec.tables.append(table(model_scope.id("resident-claims"), tagged(
            f"Claims with experts resident, {model_scope.model}", emulated), [
            ("Claim", lambda c: c.claim), ("Cells", lambda c: c.tally), (tagged("This run", emulated), lambda c: c.run),
            ("Verdict", lambda c: str(c.verdict))], claims, key=lambda c: c.key))
        fig = claims_chart({c.claim: [Mark(p.label, e, c.verdict, c.projected) for p, e in c.cells] for c in claims},
                           tagged(f"Claims with experts resident, {model_scope.model}, across devices", emulated),
                           "the thread's projection")
        sec.figures.append(model_scope.figures.save(fig, slug(model_scope.model, "resident-claims"), tagged(
            f"Claims with experts resident, {model_scope.model}, across devices: each cell's ratio with its 95% "
            "interval under its claim, the line at 1, the claim's verdict by colour", emulated)))
    gathers = gather_rows(model_scope, ps)
    if gathers:
        sec.tables.append(table(model_scope.id("resident-gather"), tagged(
            f"What a batched gather adds: decode TPS per distinct expert over per (token, expert) pair, "
            f"{model_scope.model}", emulated), [
            ("Drafter share", lambda g: f"{g[0]:g}"), ("Workload", lambda g: g[1]), ("Method", lambda g: g[2].method),
            (tagged("Pair gather decode TPS", emulated), lambda g: tps_cell(inputs.tps(g[2]))),
            (tagged("Distinct gather decode TPS", emulated), lambda g: tps_cell(inputs.tps(g[3]))),
            (tagged("Distinct / pair", emulated), lambda g: x_cell(inputs.speedup(g[3], g[2])))],
            gathers, key=lambda g: (g[2], g[3])))
    sec.notes += [note("resident_claims", plain=PROJECTED["plain"], speculative=PROJECTED["speculative"]),
                  interval_note(inputs.seed)]
    return sec


def tree(inputs, role: str, run: DecodeRun) -> str:
    """The tree a run verified from: a fixed one (EAGLE-3's, or the tuned one its tune job chose), SpecFit's bounds."""
    if role == AR.name:
        return MISSING
    if role == EAGLE3_TUNED.name:
        folds = inputs.tune.get(run)
        return MISSING if folds is None else tuned_trees(folds)
    c = method_config(inputs.spec, run.method)
    bounds = {"max_depth": c.max_depth, "top_k_expand": c.top_k_expand, "k_max": c.k_max}
    return tree_label(bounds) if role == EAGLE3.name else f"chosen per cycle, at most {tree_label(bounds)}"


def tuned_trees(folds: list[dict]) -> str:
    """The tree(s) a tuned run decoded with, from its tune jobs' JSON: one, or one per cross-fitted fold, each with
    the questions it was tuned on and whether it sits at the grid's edge."""
    labels = []
    for t in folds:
        edge = [k for k in ("max_depth", "top_k_expand") if t["chosen"][k] == max(x[k] for x in t["trees"])]
        labels.append(f"{tree_label(t['chosen'])} (tuned on {len(t['question_ids'])} questions"
                      + (f"; the grid's largest {' and '.join(EDGE[k] for k in edge)}" if edge else "") + ")")
    if len(labels) == 1:
        return labels[0]
    return "; ".join(f"fold {f} ({len(t.get('decodes', []))} questions): {label}"
                     for f, (t, label) in enumerate(zip(folds, labels)))


def mean_width(m: dict) -> float | None:
    """The mean verify width: the root and the draft nodes verified with it."""
    n = m.get("draft_nodes_per_cycle")
    return None if n is None else 1.0 + n


def widths_cell(m: dict) -> str:
    """Cycles per verify width, in percent: "1: 12, 2: 30, ..." (metrics.json ``verify_widths``)."""
    counts = m.get("verify_widths")
    if not counts:
        return MISSING
    total = sum(counts.values())
    return ", ".join(f"{w}: {100.0 * k / total:.0f}" for w, k in sorted(counts.items(), key=lambda wk: int(wk[0])))


def verdicts(es: list[Estimate | None]) -> tuple[int, int, int, int]:
    """Faster, tie, slower and not judged among ratios."""
    vs = [None if e is None else e.verdict for e in es]
    return (vs.count(Verdict.FASTER), vs.count(Verdict.TIE), vs.count(Verdict.SLOWER),
            sum(v is None for v in vs))


def tally(es: list[Estimate | None]) -> str:
    faster, tie, slower, unjudged = verdicts(es)
    return f"faster in {faster}, tie in {tie}, slower in {slower}" + (f", not judged in {unjudged}" if unjudged else "")


def never_slower(es: list[Estimate | None]) -> Verdict:
    """A claim that no cell is slower: refuted by one slower, not judged without any interval, else confirmed."""
    _, _, slower, unjudged = verdicts(es)
    return Verdict.REFUTED if slower else Verdict.NOT_JUDGED if unjudged == len(es) else Verdict.CONFIRMED


def always_faster(es: list[Estimate | None]) -> Verdict:
    """A claim that every cell is faster: refuted by one slower, confirmed when all are faster, else a tie."""
    faster, _, slower, unjudged = verdicts(es)
    return (Verdict.REFUTED if slower else Verdict.CONFIRMED if faster == len(es)
            else Verdict.NOT_JUDGED if unjudged == len(es) else Verdict.TIE)


def claim_rows(model_scope: ModelScope, ps: list[Place]) -> list[ResidentClaim]:
    """The claims, each with its cells' ratios: SpecFit never slower than AR (its worst cell), faster than the best
    fixed EAGLE-3 (every cell), and with a batched gather faster than AR (the thread's projection)."""
    inputs, rows = model_scope.inputs, []

    def ratios(num: str, den: str, keep=lambda p: True) -> list[tuple[Place, Estimate | None]]:
        return [(p, inputs.speedup(p.runs[num], p.runs[den])) for p in ps if keep(p)
                and p.runs[num] in inputs.metrics and p.runs[den] in inputs.metrics]

    def listed(cells) -> str:
        return "; ".join(f"{p.label}: {x_cell(e)}" for p, e in cells)

    if cells := ratios(SPECFIT.name, AR.name):
        worst_place, worst = min(cells, key=lambda c: c[1].value if c[1] is not None else float("inf"))
        es = [e for _, e in cells]
        rows.append(ResidentClaim("specfit-never-slower-than-ar", "SpecFit is never slower than AR (its worst cell)",
                                  f"{len(cells)}: {tally(es)}", f"worst {worst_place.label}: {x_cell(worst)}",
                                  never_slower(es), cells))
    for rival, claim in ((EAGLE3_TUNED.name, "SpecFit is faster than EAGLE-3 at the best fixed tree (tuned)"),
                         (EAGLE3.name, "SpecFit is faster than EAGLE-3 at the paper's tree")):
        if cells := ratios(SPECFIT.name, rival):
            es = [e for _, e in cells]
            rows.append(ResidentClaim(f"specfit-faster-than-{rival}", claim, f"{len(cells)}: {tally(es)}",
                                      listed(cells), always_faster(es), cells))
    if cells := ratios(SPECFIT.name, AR.name, keep=lambda p: p.gather == "distinct"):
        es = [e for _, e in cells]
        lo = PROJECTED["speculative"][0] / PROJECTED["plain"][1]
        hi = PROJECTED["speculative"][1] / PROJECTED["plain"][0]
        rows.append(ResidentClaim("batched-gather-specfit-over-ar",
                                  f"With a batched gather, SpecFit is faster than AR (the thread projects "
                                  f"{lo:.2f}–{hi:.2f}×)", f"{len(cells)}: {tally(es)}", listed(cells),
                                  always_faster(es), cells, (lo, hi)))
    return rows


def gather_rows(model_scope: ModelScope, ps: list[Place]) -> list[tuple]:
    """Draft share, workload, the pair gather's run, the distinct gather's: each role's run on two resident devices
    with the same measurement that differ in their gather alone."""
    spec, inputs = model_scope.spec, model_scope.inputs
    by_key = {}
    for p in ps:
        by_key.setdefault((measurement(spec, p.device), p.workload), {})[p.gather] = p
    rows = []
    for (key, w), gathers in by_key.items():
        if {"pair", "distinct"} <= set(gathers):
            for role in ROLES:
                a, b = gathers["pair"].runs[role], gathers["distinct"].runs[role]
                if a in inputs.metrics and b in inputs.metrics:
                    rows.append((key[3], w, a, b))
    return rows
