"""Sensitivity to route-prediction errors (section 4.6): SpecFit with exact and with noisy routes side by side, the
paper's speedups beside on its 40 GSM8K questions."""

from specfit.planning.matrix import DecodeRun, method_config, workload_ids
from specfit.report.page import MISSING, Section, cache_cell, interval_note, table, tagged
from specfit.report.quantities import column, tps_cell, x_cell
from specfit.report.scope import Scope, paper_workload
from specfit.speculative.kinds import AR


def section(s: Scope) -> Section:
    sec = Section("Sensitivity to route-prediction errors (section 4.6)")
    cited = s.i.paper["route_prediction"]
    for w in s.workloads:
        workload(s, sec, w, cited)
    if not s.roles.noisy:
        sec.notes.append("No method with noisy routes is configured.")
    if sec.tables:
        sec.notes.append(f"The paper's figures: {cited['source']}.")
        sec.notes.append(interval_note(s.i.seed))
    return sec


def workload(s: Scope, sec: Section, w: str, cited: dict) -> None:
    noisy = [r for r in s.runs_of(w) if r.method in s.roles.noisy]
    if not noisy:
        return
    ar = s.ar(w)
    if ar not in s.i.metrics:
        sec.missing += s.i.missing([DecodeRun(s.model, s.device, w, s.roles.ar or AR.name, 0)])
    paper = s.paper.routes(paper_workload(s.spec, w))
    rows = []  # run, its routes, the paper's speedup: exact routes beside each noisy run where the matrix has them
    for r in noisy:
        rows += [p for p in ((s.run(w, s.roles.specfit, r.slots), "exact (atlas)", cited["exact_routes_speedup"]),
                             (r, f"noisy, accuracy {method_config(s.spec, r.method).accuracy}",
                              cited["simulated_60pct_speedup"])) if p[0] in s.runs]
    runs = [run for run, _, _ in rows]
    sec.missing += s.i.missing(runs)
    if not any(r in s.i.metrics for r in runs):
        return
    sec.missing += s.i.missing_requests([*runs, ar])
    emulated = s.emulated(runs)
    sec.tables.append(table(s.id("noisy-routes", w), tagged(f"Exact vs noisy routes, {s.title(w)}", emulated), [
        ("Method", lambda x: x[0].method), ("Routes", lambda x: x[1]), ("Cache", lambda x: cache_cell(x[0].slots)),
        (column("tps_dec", emulated), lambda x: tps_cell(s.i.tps(x[0]))),
        (tagged("Speedup over AR without cache", emulated), lambda x: x_cell(s.i.speedup(x[0], ar))),
        ((f"Paper speedup ({cited['device'].upper()}, {cited['questions_label']}; noisy: "
          f"{cited['accuracy_pct']:g}% accuracy)"),
         lambda x: x_cell(x[2]) if paper is not None and x[0].slots == s.main else MISSING)],
        rows, key=lambda x: x[0]))
    q = cited["questions"]
    if paper is not None and (workload_ids(s.spec, w) != list(range(q["start"], q["stop"] + 1, q["step"]))
                              or s.spec["workloads"][w].get("max_requests")):
        sec.notes.append(f"{w} does not run the paper's {cited['questions_label']}: its speedups sit "
                         "beside the paper's for orientation only.")
