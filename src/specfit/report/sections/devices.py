"""One model's devices side by side (Table 4 style): each workload, or the workload that stands for one of the
paper's on each device, with the paper's three methods with and without the cache."""

from specfit.report.page import Section, cache_cell, interval_note, note, table, tagged
from specfit.report.paper_figures import CELLS
from specfit.report.quantities import column, metric, tps_cell, x_cell
from specfit.report.scope import ModelScope, paper_workload
from specfit.speculative.kinds import AR

KEYS = ("draft_nodes_per_cycle", "committed_per_cycle", "cycles", "ms_per_cycle", "h2d_per_token")


def section(model_scope: ModelScope) -> Section | None:
    if sum(scope.gpu is not None for scope in model_scope.on.values()) < 2:
        return None
    sec = Section("Devices side by side (Table 4 style)")
    for group in dict.fromkeys(paper_workload(model_scope.spec, w) or w for w in model_scope.spec["workloads"]):
        on = {d: w for d, scope in model_scope.on.items()  # a resident device: its own section (resident)
              if scope.gpu is not None and (w := model_scope.workload_on(d, group)) is not None}
        if len(on) < 2:
            continue
        group_table(model_scope, sec, group, on)
    if not sec.tables:
        sec.notes.append("No workload runs on more than one device.")
    else:
        sec.notes.append(note("devices_stand_ins"))
        sec.notes.append(interval_note(model_scope.inputs.seed))
    return sec


def group_table(model_scope: ModelScope, sec: Section, group: str, on: dict[str, str]) -> None:
    """One workload group's table: the workload of each device in ``on`` (device -> workload)."""
    emulated = any(model_scope.on[d].link_emulated for d in on)
    rows = []  # device, workload, kind, cache mode, its run, AR's without the cache
    for d, w in on.items():
        runs = model_scope.on[d].paper_runs(w)
        for kind, mode in CELLS:
            if runs[kind, mode] in model_scope.inputs.metrics:
                sec.missing += model_scope.inputs.missing_requests([runs[kind, mode], runs[AR.name, "nocache"]])
                rows.append((d, w, kind, mode, runs[kind, mode], runs[AR.name, "nocache"]))
    if not rows:
        return

    shown = ", ".join(f"{d}: {w}" for d, w in on.items()) if any(w != group for w in on.values()) else ""
    sec.tables.append(table(model_scope.id("devices", group), tagged(
        f"{group} on every device" + (f" ({shown})" if shown else ""), emulated), [
        ("Device", lambda x: x[0]), ("Workload", lambda x: x[1]), ("Method", lambda x: x[2]),
        ("Cache", lambda x: cache_cell(model_scope.on[x[0]].main if x[3] == "cache" else 0)),
        (column("tps_dec", emulated), lambda x: tps_cell(model_scope.inputs.tps(x[4]))),
        (tagged("Speedup over AR without cache", emulated), lambda x: x_cell(model_scope.inputs.speedup(x[4], x[5]))),
        *(metric(model_scope.inputs.metrics, k, emulated, run=lambda x: x[4],
                 ar=lambda x: x[2] == AR.name) for k in KEYS)], rows,
        key=lambda x: x[4]))
