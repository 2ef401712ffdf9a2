"""Sensitivity to route-prediction errors (section 4.6): SpecFit with exact and with noisy routes side by side, the
paper's speedups beside on its 40 GSM8K questions."""

from specfit.planning.matrix import DecodeRun, method_config, workload_ids
from specfit.report.page import MISSING, Section, cache_cell, interval_note, table, tagged
from specfit.report.quantities import column, tps_cell, x_cell
from specfit.report.scope import Scope, paper_workload
from specfit.speculative.kinds import AR


def section(scope: Scope) -> Section:
    sec = Section("Sensitivity to route-prediction errors (section 4.6)")
    cited = scope.inputs.paper["route_prediction"]
    for w in scope.workloads:
        workload(scope, sec, w, cited)
    if not scope.roles.noisy:
        sec.notes.append("No method with noisy routes is configured.")
    if sec.tables:
        sec.notes.append(f"The paper's figures: {cited['source']}.")
        sec.notes.append(interval_note(scope.inputs.seed))
    return sec


def workload(scope: Scope, sec: Section, w: str, cited: dict) -> None:
    noisy = [r for r in scope.runs_of(w) if r.method in scope.roles.noisy]
    if not noisy:
        return
    ar = scope.ar(w)
    if ar not in scope.inputs.metrics:
        sec.missing += scope.inputs.missing([DecodeRun(scope.model, scope.device, w, scope.roles.ar or AR.name, 0)])
    paper = scope.paper.routes(paper_workload(scope.spec, w))
    rows = []  # run, its routes, the paper's speedup: exact routes beside each noisy run where the matrix has them
    for r in noisy:
        rows += [p for p in ((scope.run(w, scope.roles.specfit, r.slots), "exact (atlas)",
                              cited["exact_routes_speedup"]),
                             (r, f"noisy, accuracy {method_config(scope.spec, r.method).accuracy}",
                              cited["simulated_60pct_speedup"])) if p[0] in scope.runs]
    runs = [run for run, _, _ in rows]
    sec.missing += scope.inputs.missing(runs)
    if not any(r in scope.inputs.metrics for r in runs):
        return
    sec.missing += scope.inputs.missing_requests([*runs, ar])
    emulated = scope.emulated(runs)
    sec.tables.append(table(scope.id("noisy-routes", w), tagged(f"Exact vs noisy routes, {scope.title(w)}", emulated), [
        ("Method", lambda x: x[0].method), ("Routes", lambda x: x[1]), ("Cache", lambda x: cache_cell(x[0].slots)),
        (column("tps_dec", emulated), lambda x: tps_cell(scope.inputs.tps(x[0]))),
        (tagged("Speedup over AR without cache", emulated), lambda x: x_cell(scope.inputs.speedup(x[0], ar))),
        ((f"Paper speedup ({cited['device'].upper()}, {cited['questions_label']}; noisy: "
          f"{cited['accuracy_pct']:g}% accuracy)"),
         lambda x: x_cell(x[2]) if paper is not None and x[0].slots == scope.main else MISSING)],
        rows, key=lambda x: x[0]))
    q = cited["questions"]
    if paper is not None and (workload_ids(scope.spec, w) != list(range(q["start"], q["stop"] + 1, q["step"]))
                              or scope.spec["workloads"][w].get("max_requests")):
        sec.notes.append(f"{w} does not run the paper's {cited['questions_label']}: its speedups sit "
                         "beside the paper's for orientation only.")
