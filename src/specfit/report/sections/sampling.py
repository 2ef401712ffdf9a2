"""Beyond the paper: sampling at T > 0 (config.sampling.yaml: T = 1, the EAGLE papers' second setting) beside greedy
decoding of the same questions.

A sampled workload's greedy twin is the workload with the same questions and limits at T = 0; its rejection twin the
one with the same questions, limits and temperature under the other mode. Per cell (workload × slots): each method's
committed tokens per cycle at T = 0 and at T > 0, its decode TPS and its ratios to EAGLE-3 and to the tuned tree
(tuned on the sampled workload's own folds), with paired intervals; the coefficient of variation of ρ (Table 5's,
on SpecFit's pools) at both; each drafting method's commit probabilities, as the decode predicted them, against the
share of those nodes committed, level by level (`specfit.results.acceptance.level_calibration`), sampled and greedy;
and coupled against rejection sampling, method by method. The verdicts are new claims, with no paper number, as they
come.
"""

from specfit.planning.matrix import method_kind
from specfit.report.page import MISSING, Section, cache_cell, fmt, interval_note, note, table, tagged
from specfit.report.quantities import tps_cell, x_cell
from specfit.report.scope import Scope
from specfit.speculative.kinds import SPECFIT
from specfit.speculative.sampling import Sampling, twin

TITLE = "Beyond the paper: sampling at T > 0"


def sampling_of(spec: dict, workload: str) -> Sampling:
    return Sampling.of(spec["workloads"][workload])


def guarantee(s: Sampling) -> str:
    """What a run at ``s`` promises against AR (`Sampling.guarantee`, worded for the lossless section's column)."""
    if s.guarantee == "distribution":
        return f"AR's distribution, not its tokens (rejection, T = {s.temperature:g})"
    return f"AR's tokens at seed {s.seed} (coupled, T = {s.temperature:g})" if s.coupled else "AR's tokens (greedy)"


def mode_label(s: Sampling) -> str:
    return "greedy" if s.greedy else f"{s.sampling}, T = {s.temperature:g}"


def level_cell(level: tuple[int, float, float] | None) -> str:
    """A level's trials: mean predicted commit probability / share committed (trials)."""
    return MISSING if level is None else f"{level[1]:.2f} / {level[2]:.2f} (n {level[0]})"


def theory_of(scope: Scope, workload: str) -> dict | None:
    """Table 5's quantities on the workload's SpecFit pools (the paper's cost), if built."""
    return next((t for r, t in scope.inputs.theory.items() if (r.model, r.device, r.workload) == (scope.model,
                 scope.device, workload) and method_kind(scope.spec, r.method).name == SPECFIT.name), None)


def section(scope: Scope) -> Section | None:
    """None when no workload of this device samples."""
    spec, m = scope.spec, scope.inputs.metrics
    sampled = [w for w in scope.workloads if sampling_of(spec, w).coupled]
    if not sampled:
        return None
    sec = Section(TITLE)
    runs = [r for w in scope.workloads if not sampling_of(spec, w).greedy for r in scope.runs_of(w)]
    sec.missing += scope.inputs.missing(runs) + scope.inputs.missing_requests(runs)
    emulated = scope.emulated(runs)
    rows, rho, modes = [], [], []
    for w in sampled:
        s = sampling_of(spec, w)
        greedy = twin(spec["workloads"], w, 0.0, "coupled")
        rejection = twin(spec["workloads"], w, s.temperature, "rejection")
        t0, t1 = theory_of(scope, greedy) if greedy else None, theory_of(scope, w)
        rho.append({"workload": w, "greedy": greedy, "t0": t0, "t1": t1})
        for r in scope.runs_of(w):
            if r not in m:
                continue
            g = scope.run(greedy, r.method, r.slots) if greedy else None
            eagle3 = scope.run(w, scope.roles.eagle3, r.slots)
            tuned = scope.run(w, scope.roles.eagle3_tuned, r.slots)
            rows.append({"run": r, "greedy": g if g in m else None,
                         "eagle3": None if r == eagle3 or eagle3 not in m else scope.inputs.speedup(r, eagle3),
                         "tuned": None if r == tuned or tuned not in m else scope.inputs.speedup(r, tuned)})
            rj = scope.run(rejection, r.method, r.slots) if rejection else None
            if rj in m:
                modes.append({"coupled": r, "rejection": rj, "ratio": scope.inputs.speedup(rj, r)})
    if not rows:
        return sec if sec.missing else None

    def per_cycle(run, key="committed_per_cycle"):
        return fmt(m[run].get(key), ".2f") if run is not None else MISSING

    sec.tables.append(table(scope.id("sampling"), tagged(f"Sampled against greedy, {scope.model} / {scope.device}",
                                                         emulated), [
        ("Workload", lambda x: x["run"].workload), ("Cache", lambda x: cache_cell(x["run"].slots)),
        ("Method", lambda x: x["run"].method),
        ("Committed per cycle, T = 0", lambda x: per_cycle(x["greedy"])),
        ("Committed per cycle, sampled", lambda x: per_cycle(x["run"])),
        (tagged("Decode TPS, sampled", emulated), lambda x: tps_cell(scope.inputs.tps(x["run"]))),
        (tagged("/ EAGLE-3 (×)", emulated), lambda x: "–" if x["eagle3"] is None else x_cell(x["eagle3"])),
        (tagged("/ tuned tree (×)", emulated), lambda x: "–" if x["tuned"] is None else x_cell(x["tuned"]))],
        rows, key=lambda x: (x["run"].workload, x["run"].slots, x["run"].method)))
    sec.tables.append(table(scope.id("sampling-rho"), f"Per-cycle ρ (Table 5, SpecFit's pools) sampled and greedy, "
                                                      f"{scope.model} / {scope.device}", [
        ("Workload", lambda x: x["workload"]), ("Greedy twin", lambda x: x["greedy"] or MISSING),
        ("CV of ρ, T = 0", lambda x: fmt(x["t0"]["rho_cv"], ".2f") if x["t0"] else MISSING),
        ("CV of ρ, sampled", lambda x: fmt(x["t1"]["rho_cv"], ".2f") if x["t1"] else MISSING)],
        rho, key=lambda x: x["workload"]))
    levels = [{"run": r, "levels": lv} for r, lv in scope.inputs.levels.items()
              if (r.model, r.device) == (scope.model, scope.device)]
    if levels:
        depth = max(d for x in levels for d in x["levels"])
        sec.tables.append(table(scope.id("sampling-levels"), f"Commit probability predicted against the share "
                                                             f"committed, per level, {scope.model} / {scope.device}", [
            ("Workload", lambda x: x["run"].workload),
            ("Sampling", lambda x: mode_label(sampling_of(spec, x["run"].workload))),
            ("Cache", lambda x: cache_cell(x["run"].slots)), ("Method", lambda x: x["run"].method),
            *((f"L{d}: predicted / committed (n)", lambda x, d=d: level_cell(x["levels"].get(d)))
              for d in range(1, depth + 1))],
            levels, key=lambda x: (x["run"].workload, x["run"].slots, x["run"].method)))
    if modes:
        sec.tables.append(table(scope.id("sampling-modes"), tagged(f"Coupled against rejection sampling, "
                                                                   f"{scope.model} / {scope.device}", emulated), [
            ("Workload (coupled)", lambda x: x["coupled"].workload),
            ("Cache", lambda x: cache_cell(x["coupled"].slots)),
            ("Method", lambda x: x["coupled"].method),
            ("Accepted per cycle, coupled", lambda x: per_cycle(x["coupled"], "accepted_per_cycle")),
            ("Accepted per cycle, rejection", lambda x: per_cycle(x["rejection"], "accepted_per_cycle")),
            (tagged("Decode TPS, coupled", emulated), lambda x: tps_cell(scope.inputs.tps(x["coupled"]))),
            (tagged("Decode TPS, rejection", emulated), lambda x: tps_cell(scope.inputs.tps(x["rejection"]))),
            (tagged("rejection / coupled (×)", emulated), lambda x: x_cell(x["ratio"]))],
            modes, key=lambda x: (x["coupled"].workload, x["coupled"].slots, x["coupled"].method)))
    sec.notes += [note("sampling"), interval_note(scope.inputs.seed)]
    return sec
