"""The paper's claims confronted with this run: each claim's ratio in the paper, this run's with its paired interval,
and one verdict (`verdict.confronted`): confirmed, refuted or a tie. Whatever the direction, it is the run's finding;
on an emulated device it is the toy's finding under the paper's cost regime (docs/device.md). A figure draws the
claims that are ratios against the line at 1, the paper's beside each."""

from dataclasses import dataclass

from specfit.report.figures import Mark, claims_chart, slug
from specfit.report.page import Estimate, Section, fmt, interval_note, note, table, tagged
from specfit.report.quantities import x_cell
from specfit.report.scope import Scope, slot_order
from specfit.report.verdict import Verdict, confronted

# key, claim, numerator cell, denominator cell: (method kind, cache mode), as the paper's cells and this run's are keyed
RATIOS = (
    ("vanilla-eagle3", "Vanilla EAGLE-3 against AR, both without the cache", ("eagle3", "nocache"), ("ar", "nocache")),
    ("specfit-eagle3-cache", "SpecFit against EAGLE-3, both with the cache", ("specfit", "cache"), ("eagle3", "cache")),
    ("specfit-eagle3-nocache", "SpecFit against EAGLE-3, both without the cache", ("specfit", "nocache"),
     ("eagle3", "nocache")),
    ("specfit-ar-nocache", "SpecFit with the cache against AR without it", ("specfit", "cache"), ("ar", "nocache")),
    ("specfit-ar-cache", "SpecFit against AR, both with the cache", ("specfit", "cache"), ("ar", "cache")),
)


@dataclass(frozen=True)
class Claim:
    """A row of the claims table: what the paper claims and what this run finds, as printed, with the ratio behind
    them where the claim is one (the figure's row)."""

    key: str
    workload: str
    claim: str
    paper: str
    run: str
    verdict: Verdict
    ratio: Estimate | None = None  # this run's (None: not measured, or the claim is not a ratio)
    paper_ratio: float | None = None  # None: the claim is not a ratio (Table 5's)
    label: str = ""  # the figure's, where the claim's text explains the table's cells

    def mark(self) -> Mark:
        return Mark(self.label or self.claim, self.ratio, self.verdict, self.paper_ratio)


def section(scope: Scope) -> Section | None:
    if not scope.at_paper_scale:
        return None  # the CPU's own regime (a link-only device, the wall clock): shown, never a verdict
    if scope.roles.specfit is None or not scope.stand_ins:
        return None
    sec = Section("The paper's claims, confronted")
    sec.notes.append(note("claims_rule"))
    rows = []
    for pw, w in scope.stand_ins.items():
        rows += (ratio_claims(scope, sec, pw, w) + tuned_claims(scope, sec, w) + thesis_claims(scope, sec, w)
                 + noisy_claim(scope, sec, pw, w)
                 + sweep_claim(scope, sec, pw, w) + theory_claim(scope, pw, w))
    if rows:
        sec.tables.append(table(scope.id("claims"), tagged(f"The paper's claims on {scope.model} / {scope.device}",
                                                       scope.link_emulated), [
            ("Workload", lambda c: c.workload), ("Claim", lambda c: c.claim), ("Paper", lambda c: c.paper),
            (tagged("This run", scope.link_emulated), lambda c: c.run), ("Verdict", lambda c: str(c.verdict))],
            rows, key=lambda c: c.key))
        sec.notes.append(interval_note(scope.inputs.seed))
        figure(scope, sec, rows)
    return sec if sec.tables or sec.missing else None


def figure(scope: Scope, sec: Section, rows: list[Claim]) -> None:
    """The claims that are ratios, in the table's order under their workload, against the line at 1."""
    shown = [c for c in rows if c.paper_ratio is not None]
    if not shown:
        return
    groups = {}
    for c in shown:
        groups.setdefault(c.workload, []).append(c.mark())
    where = f"{scope.model} / {scope.device}"
    fig = claims_chart(groups, tagged(f"The paper's claims on {where}", scope.link_emulated),
                       f"the paper's ratio ({scope.gpu})")
    left = "" if len(shown) == len(rows) else ("; the claims without a ratio of the paper's (Table 5's gap against its "
                                               "bound, the premise against the tuned tree, the thesis against a dense "
                                               "cost) are in the table")
    sec.figures.append(scope.figures.save(fig, slug(scope.model, scope.device, "claims"), tagged(
        f"The paper's claims on {where}: each ratio of this run with its 95% interval, the paper's ratio marked, "
        f"the line at 1, the verdict by colour{left}", scope.link_emulated)))


def ratio(scope: Scope, sec: Section, num, den) -> Estimate | None:
    """TPS(num) / TPS(den) (or, given tuples of runs, the ratio of their products) from the decode runs
    (`specfit.report.inputs.Inputs.tps_ratio`); their missing files go to the section's."""
    num, den = (x if isinstance(x, tuple) else (x,) for x in (num, den))
    sec.missing += scope.inputs.missing([*num, *den]) + scope.inputs.missing_requests([*num, *den])
    return scope.inputs.tps_ratio(num, den)


def ratio_claims(scope: Scope, sec: Section, pw: str, w: str) -> list[Claim]:
    paper, runs, rows = scope.paper.cells(pw), scope.paper_runs(w), []
    if paper is None:
        return []
    for key, claim, a, b in RATIOS:
        num, den = runs[a], runs[b]
        if num not in scope.runs or den not in scope.runs:
            continue
        e = ratio(scope, sec, num, den)
        p = paper[a]["tps_dec"] / paper[b]["tps_dec"]
        direction = Verdict.of(p, p)  # the paper's ratio has no interval: its direction
        rows.append(Claim(f"{key}/{w}", w, claim, f"{p:.2f}× ({direction})", x_cell(e),
                          confronted(direction, None if e is None else e.verdict), e, p))
    return rows


def tuned_claims(scope: Scope, sec: Section, w: str) -> list[Claim]:
    """SpecFit's premise, which the paper states and does not measure (it has no tuned tree): choosing the verified
    subtree per cycle beats the fixed tree a user tunes by hand for the machine (kind eagle3-tuned), with the cache and
    without it."""
    rows, tuned = [], scope.roles.eagle3_tuned
    for mode, slots in (("cache", scope.main), ("nocache", 0)):
        num, den = scope.run(w, scope.roles.specfit, slots), scope.run(w, tuned, slots)
        if tuned is None or num not in scope.runs or den not in scope.runs:
            continue
        e = ratio(scope, sec, num, den)
        claim = (f"SpecFit against EAGLE-3 at the best fixed tree (tuned), both {'with' if slots else 'without'} "
                 "the cache")
        rows.append(Claim(f"specfit-tuned-{mode}/{w}", w, claim,
                          f"premise: {Verdict.FASTER} (no tuned tree measured)", x_cell(e),
                          confronted(Verdict.FASTER, None if e is None else e.verdict), e))
    return rows


def thesis_claims(scope: Scope, sec: Section, w: str) -> list[Claim]:
    """The paper's thesis, "not all draft tokens cost the same", which it states and does not ablate: SpecFit against
    the same selection and adaptive depth under a cost that ignores experts (kind specfit-dense: b_k refitted on the
    same probes without the union column, β = 0), with the cache and without it. The paper gives no number."""
    rows, dense = [], scope.roles.specfit_dense
    for mode, slots in (("cache", scope.main), ("nocache", 0)):
        num, den = scope.run(w, scope.roles.specfit, slots), scope.run(w, dense, slots)
        if dense is None or num not in scope.runs or den not in scope.runs:
            continue
        e = ratio(scope, sec, num, den)
        claim = (f"SpecFit against the same selection with a dense cost (no expert term), both "
                 f"{'with' if slots else 'without'} the cache")
        rows.append(Claim(f"specfit-dense-{mode}/{w}", w, claim, f"thesis: {Verdict.FASTER} (no number given)",
                          x_cell(e), confronted(Verdict.FASTER, None if e is None else e.verdict), e,
                          label=f"SpecFit / its selection with a dense cost, {'with' if slots else 'without'} the "
                                "cache"))
    return rows


def noisy_claim(scope: Scope, sec: Section, pw: str, w: str) -> list[Claim]:
    """Section 4.6: 60%-accurate routes decode as fast as exact ones (2.26× vs 2.27× over AR without the cache)."""
    routes = scope.paper.routes(pw)
    noisy = [m for m in scope.roles.noisy if scope.run(w, m, scope.main) in scope.runs]
    if routes is None or not noisy:
        return []
    e = ratio(scope, sec, scope.run(w, noisy[0], scope.main), scope.run(w, scope.roles.specfit, scope.main))
    p = routes["simulated_60pct_speedup"] / routes["exact_routes_speedup"]
    return [Claim(f"noisy-routes/{w}", w, f"SpecFit with 60%-accurate routes ({noisy[0]}) against exact routes",
                  f"{p:.3f}× ({Verdict.TIE})", x_cell(e), confronted(Verdict.TIE, None if e is None else e.verdict), e,
                  p)]


def sweep_claim(scope: Scope, sec: Section, pw: str, w: str) -> list[Claim]:
    """Figure 4: SpecFit's gain over EAGLE-3 grows as the cache shrinks (21.6% at 48 slots to 31.6% without a cache).
    Judged on the sweep's ends: the gain without a cache over the gain at the main slots, (SpecFit / EAGLE-3 at 0) /
    (SpecFit / EAGLE-3 at main), with its own paired interval, confronted with the paper's (above 1: the gain grows);
    the gains at every slot count are shown beside it."""
    fit, eagle = scope.roles.specfit, scope.roles.eagle3
    slots = slot_order({r.slots for r in scope.runs_of(w) if r.method == fit}
                       & {r.slots for r in scope.runs_of(w) if r.method == eagle})
    sweep = scope.paper.sweep(pw, 4)
    if sweep is None or len(slots) < 2 or slots[-1] != 0 or slots[0] != scope.main:
        return []
    measured = [ratio(scope, sec, scope.run(w, fit, x), scope.run(w, eagle, x)) for x in slots]
    # (SpecFit / EAGLE-3 at 0) / (SpecFit / EAGLE-3 at main) = (SpecFit at 0 * EAGLE-3 at main) / (the other two)
    growth = ratio(scope, sec, (scope.run(w, fit, 0), scope.run(w, eagle, scope.main)), (scope.run(w, eagle, 0),
                                                                                         scope.run(w, fit, scope.main)))
    verdict = confronted(Verdict.FASTER, None if growth is None else growth.verdict)
    shown = ", ".join(f"{x}: {x_cell(g)}" for x, g in zip(slots, measured, strict=True))
    shown += f"; 0 over {scope.main}: {x_cell(growth)}"
    gains = dict(zip(sweep["slots"], sweep["specfit_gain_pct"]))
    paper = ", ".join(f"{x}: {1 + g / 100:.2f}×" for x, g in gains.items())
    grows = (1 + gains[0] / 100) / (1 + gains[sweep['slots'][0]] / 100)
    paper += f"; 0 over {sweep['slots'][0]}: {grows:.2f}×"
    return [Claim(f"gain-grows/{w}", w, "SpecFit's gain over EAGLE-3 grows as the cache shrinks (slots: gain; the gain "
                  "without a cache over the gain at the main slots decides)", paper, shown, verdict, growth, grows,
                  f"SpecFit's gain over EAGLE-3 grows as the cache shrinks: the gain without a cache over the gain "
                  f"at {scope.main} slots")]


def theory_claim(scope: Scope, pw: str, w: str) -> list[Claim]:
    """Table 5: the per-cycle ratio rule is within 1% of λ* and within the bound of Eq. 7."""
    paper = scope.paper.table5(pw)
    run = scope.run(w, scope.roles.specfit, scope.main)
    t = scope.inputs.theory.get(run)
    if paper is None or t is None:
        return []
    holds = t["gap_pct"] <= t["bound_pct"] + 1e-9 and t["gap_pct"] < 1.0
    return [Claim(f"table5/{w}", w, "Ratio selection within 1% of λ* and within the bound of Eq. 7 (Table 5)",
                  f"{paper['gap_pct_of_lambda']:.2f}% ≤ {paper['bound_pct_of_lambda']:.2f}%",
                  f"{fmt(t['gap_pct'], '.2f')}% ≤ {fmt(t['bound_pct'], '.2f')}%",
                  Verdict.CONFIRMED if holds else Verdict.REFUTED)]
