"""On an emulated device: the toy's cost proportions measured by the decode runs beside the GPU's (Tables 2-3), its
acceptance beside the paper's (EAGLE-3's committed tokens per cycle, Table 5's selection on SpecFit's pools), and the
with-cache fit's R² (docs/device.md)."""

from specfit.engine.paper_gpus import NAMES, PROPORTIONS, REQUESTS, paper_proportions, proportion_met, run_proportions
from specfit.planning.matrix import theory_cost, theory_runs
from specfit.report.page import MISSING, Section, fmt, note, table
from specfit.report.scope import Scope
from specfit.report.verdict import Outcome, at_least
from specfit.results.acceptance import (
    ACCEPTANCE,
    acceptance_met,
    direction,
    ordered_met,
    paper_acceptance,
    run_acceptance,
)
from specfit.results.acceptance import shown as shown_as  # beside this module's own `shown` of the cost rows

R2_GOAL = 0.9  # the with-cache NNLS fit of the paper's model


def shown(key: str, value: float) -> str:
    """A share as a percentage, a ratio as it is."""
    return fmt(100 * value, ".1f") + "%" if key.endswith("share") else fmt(value, ".2f")


def goal(o: Outcome | None) -> str:
    """A goal's verdict as the tables print it; a dash where the quantity has no goal or no value."""
    return MISSING if o is None else o.word()


def section(scope: Scope) -> Section | None:
    emulate = scope.spec["devices"][scope.device].get("emulate")
    if emulate is None:
        return None
    sec = Section(f"The emulated {emulate['name']}: proportions")
    sec.notes.append(note("proportions", device=scope.device, name=emulate["name"]))
    for pw, w in scope.stand_ins.items():
        runs = {k: r for k, r in scope.paper_runs(w).items() if k[0] != "specfit"}
        sec.missing += scope.inputs.missing(list(runs.values()))
        m = {k: scope.inputs.metrics.get(r) for k, r in runs.items()}
        if any(value is None for value in m.values()):
            continue
        toy = run_proportions(*(m[k] for k in (("ar", "cache"), ("ar", "nocache"), ("eagle3", "cache"),
                                               ("eagle3", "nocache"))), emulate)
        if (scope.gpu, pw) not in REQUESTS:  # no table of the paper for this GPU and workload
            continue
        paper = paper_proportions(scope.inputs.paper, pw, scope.gpu)
        rows = [(key, name, toy[key], paper[key], None if (met := proportion_met(key, toy[key], paper[key])) is None
                 else Outcome.of(met)) for key, name in PROPORTIONS]
        caption = f"Proportions, {scope.title(w)}, beside the {NAMES[scope.gpu]}'s {pw}"
        sec.tables.append(table(scope.id("proportions", w), caption, [
            ("Quantity", lambda r: r[1]),
            ("This run", lambda r: shown(r[0], r[2])), ("Paper", lambda r: shown(r[0], r[3])),
            ("Goal met", lambda r: goal(r[4]))], rows, key=lambda r: r[0]))
    committed = acceptance(scope, sec)
    fit = scope.inputs.calibration.get((scope.model, scope.device, "cache"))
    rows = [("r2", f"with-cache NNLS fit of the paper's model, R² (goal ≥ {R2_GOAL})",
             MISSING if fit is None else fmt(fit["r2"], ".3f"), None if fit is None else at_least(fit["r2"], R2_GOAL))]
    if len(committed) > 1:
        order = ordered_met(committed)
        rows.append(("ordered", "EAGLE-3 commits more per cycle on GSM8K than on summarization, as the paper's",
                     ", ".join(f"{w} {fmt(v, '.2f')}" for w, v in committed.items()), None if order is None else
                     Outcome.of(order)))
    sec.tables.append(table(scope.id("device-checks"), f"The emulated {emulate['name']}: fit, "
                            f"{scope.model} / {scope.device}", [
        ("Check", lambda r: r[1]), ("This run", lambda r: r[2]), ("Goal met", lambda r: goal(r[3]))], rows,
        key=lambda r: r[0]))
    return sec


def acceptance(scope: Scope, sec: Section) -> dict[str, float | None]:
    """A table per paper workload: EAGLE-3's committed tokens per cycle with the cache (goal: within 15% of the
    paper's) and SpecFit's selection on its recorded pools (Table 5), beside the paper's with the direction of each
    difference. Returns EAGLE-3's committed per cycle by paper workload."""
    theory = {r.workload: scope.inputs.theory.get(r) for r in theory_runs(scope.spec)
              if (r.model, r.device) == (scope.model, scope.device) and theory_cost(scope.spec, r) == "paper"}
    committed = {}
    for pw, w in scope.stand_ins.items():
        e3 = scope.paper_runs(w).get(("eagle3", "cache"))
        toy = run_acceptance(scope.inputs.metrics.get(e3), theory.get(w))
        paper = paper_acceptance(scope.inputs.paper, pw, scope.gpu)
        committed[pw] = toy["e3_committed"]
        rows = [(key, name, toy[key], paper[key], acceptance_met(key, toy[key], paper[key]))
                for key, name, _ in ACCEPTANCE]
        sec.tables.append(table(scope.id("acceptance", w), f"Acceptance, {scope.title(w)}, beside the paper's {pw}", [
            ("Quantity", lambda r: r[1]), ("This run", lambda r: fmt(r[2], shown_as(r[0]))),
            ("Paper", lambda r: fmt(r[3], shown_as(r[0]))),
            ("Against the paper", lambda r: direction(r[2], r[3]) or MISSING),
            ("Goal met", lambda r: goal(None if r[4] is None else Outcome.of(r[4])))], rows, key=lambda r: r[0]))
    if committed:
        sec.notes.append(note("acceptance", shipped=scope.spec["models"][scope.model].get("shipped", False)))
    return {pw: committed[pw] for pw in ("summarization", "gsm8k") if pw in committed}
