"""Beyond the paper: prefetch while drafting (kinds ``specfit-prefetch`` and ``eagle3-prefetch``). Per cell
(workload × slots) where a prefetching method ran: each method's decode TPS, the ratios that split a gain into
prefetch and selection, its goal, and per run where a cycle's time went and what its prefetches did
(`specfit.engine.offload.OffloadEngine.prefetch`: issued, used by the next forward, evicted unused, copy time
hidden before the forward)."""

from specfit.report.inputs import first_method, methods_with
from specfit.report.page import MISSING, Section, cache_cell, fmt, interval_note, note, table, tagged
from specfit.report.quantities import column, metric, tps_cell, x_cell
from specfit.report.scope import Cell, Scope
from specfit.report.verdict import Outcome, Verdict, judged, overall
from specfit.speculative.kinds import AR, EAGLE3, EAGLE3_PREFETCH, RIVAL, SPECFIT_CA, SPECFIT_PREFETCH, with_role

TITLE = "Beyond the paper: prefetch while drafting"
RIVALS = with_role(RIVAL)  # AR, EAGLE-3, EAGLE-3 with prefetch: the best is the bar a prefetching SpecFit must beat
# a cell's roles: the prefetching SpecFit (learned routes: deployable), its self without prefetch, its upper bound
# with exact routes, the cache-aware SpecFit on exact routes, the rivals (last first)
ROLES = ("prefetch", "self", "oracle", SPECFIT_CA.name, *RIVALS[::-1])
# ratio key -> (numerator role, denominator role, what it isolates)
RATIOS = {
    "prefetch": ("prefetch", "self", "prefetch alone"),
    "selection": ("self", EAGLE3.name, "selection alone"),
    EAGLE3.name: ("prefetch", EAGLE3.name, "both"),
    SPECFIT_CA.name: ("prefetch", SPECFIT_CA.name, "against exact-route specfit-ca"),
    "oracle": ("oracle", "prefetch", "exact routes over learned"),
    EAGLE3_PREFETCH.name: (EAGLE3_PREFETCH.name, EAGLE3.name, "prefetch of EAGLE-3's tree"),
}


def roles(scope: Scope) -> dict[str, str | None]:
    """Role -> the config's method in it (None: none configured)."""
    spec = scope.spec
    return {"prefetch": first_method(spec, SPECFIT_PREFETCH.name, "learned"),
            "self": first_method(spec, SPECFIT_CA.name, "learned"),
            "oracle": first_method(spec, SPECFIT_PREFETCH.name, "atlas"), SPECFIT_CA.name: scope.roles.specfit_ca,
            EAGLE3_PREFETCH.name: first_method(spec, EAGLE3_PREFETCH.name),
            EAGLE3.name: scope.roles.eagle3, AR.name: scope.roles.ar}


def judge(scope: Scope, c: Cell) -> None:
    """The ratios of `RATIOS`, and the goal: with the cache, the prefetching SpecFit faster (by more than the
    interval) than the best of AR, EAGLE-3 and EAGLE-3 with prefetch, than specfit-ca and than its own self without
    prefetch; without the cache not required (a prefetch has no slot to land in)."""
    inputs = scope.inputs
    c.ratios = {k: inputs.speedup(c.runs[a], c.runs[b]) for k, (a, b, _) in RATIOS.items()}
    rivals = [c.runs[r] for r in RIVALS if c.runs[r] in inputs.metrics]
    if rivals:
        best = max(rivals, key=lambda r: inputs.metrics[r]["tps_dec"] or 0.0)
        c.best = next(r for r in RIVALS if c.runs[r] == best)
        c.ratios["best"] = inputs.speedup(c.runs["prefetch"], best)
    else:
        c.ratios["best"] = None
    if not c.cached:
        c.goals["goal"] = Outcome(Verdict.NOT_REQUIRED, "no cache to prefetch into")
        return
    pre = c.runs["prefetch"]
    c.goals["best"] = judged(c.ratios["best"], (Verdict.FASTER,), [pre, *(rivals or [None])], inputs.metrics,
                             "AR, EAGLE-3 or EAGLE-3 with prefetch")
    for k, what in ((SPECFIT_CA.name, SPECFIT_CA.name), ("prefetch", "non-prefetching self")):
        c.goals[k] = judged(c.ratios[k], (Verdict.FASTER,), [pre, c.runs[RATIOS[k][1]]], inputs.metrics, what)
    c.goals["goal"] = overall([c.goals[k] for k in ("best", SPECFIT_CA.name, "prefetch")])


def per_cycle(m: dict, value) -> float | None:
    cycles = m.get("cycles")
    return None if value is None or not cycles else value / cycles


def stall_ms(m: dict) -> float | None:
    """The copy time on the verify forwards' critical path, ms per cycle (an emulated device only)."""
    device = m.get("device")
    return None if not device else per_cycle(m, 1e3 * device["copy_stall_s"])


def prefetched(m: dict, key: str) -> float | None:
    """A prefetch counter per cycle (``hidden_ms``: copy time hidden before the forward), None if not counted."""
    counters = m.get("prefetch")
    return None if counters is None else per_cycle(m, counters[key])


def precision(m: dict) -> float | None:
    """Prefetched experts the next forward used, over those issued."""
    counters = m.get("prefetch")
    return None if not counters or not counters["issued"] else counters["used"] / counters["issued"]


def section(scope: Scope) -> Section | None:
    """None when no prefetching method ran on this device."""
    names = roles(scope)
    cells = [c for k in (SPECFIT_PREFETCH.name, EAGLE3_PREFETCH.name) for m in methods_with(scope.spec, (k,))
             for c in scope.cells(m, names)]
    cells = list({(c.workload, c.slots): c for c in cells}.values())
    if not cells:
        return None
    inputs, (sec, emulated) = scope.inputs, scope.section_on(TITLE, cells)
    for c in cells:
        judge(scope, c)
    label = {role: names[role] or role for role in ROLES}
    sec.tables.append(table(scope.id("prefetch"), tagged(f"Prefetching methods against its goal per cell, "
                                                     f"{scope.model} / {scope.device}", emulated), [
        ("Workload", lambda c: c.workload), ("Cache", lambda c: cache_cell(c.slots)),
        *((tagged(f"{label[role]} Decode TPS", emulated), lambda c, role=role: tps_cell(inputs.tps(c.runs[role])))
          for role in ROLES),
        *((tagged(f"{label[a]} / {label[b]} (×): {what}", emulated), lambda c, k=k: x_cell(c.ratios[k]))
          for k, (a, b, what) in RATIOS.items()),
        ("Best of " + ", ".join(label[r] for r in RIVALS), lambda c: MISSING if c.best is None else names[c.best]),
        (tagged(f"{label['prefetch']} / best (×)", emulated), lambda c: x_cell(c.ratios["best"])),
        ("Goal met", lambda c: c.goals["goal"].answer())], cells, key=lambda c: (c.workload, c.slots)))
    rows = [(c, role,
             c.runs[role]) for c in cells for role in ROLES if c.runs[role] in inputs.metrics and role != AR.name]

    def m(x):
        return inputs.metrics[x[2]]

    def value(header, get, spec=".2f"):
        return header, lambda x: fmt(get(m(x)), spec)

    sec.tables.append(table(scope.id("prefetch-time"), tagged(f"Where a cycle's time went and what the prefetches did, "
                                                          f"{scope.model} / {scope.device}", emulated), [
        ("Workload", lambda x: x[0].workload), ("Cache", lambda x: cache_cell(x[0].slots)),
        ("Method", lambda x: x[2].method), *(metric(inputs.metrics, k, emulated, run=lambda x: x[2], spec=".2f")
                                            for k in ("ms_per_cycle", "draft_ms_per_cycle", "select_ms_per_cycle",
                                                      "verify_ms_per_cycle")),
        value(tagged("Copy stall ms/cycle", emulated), stall_ms),
        value("Drafted levels per cycle", lambda x: x.get("drafted_levels_per_cycle")),
        value("Committed per cycle", lambda x: x.get("committed_per_cycle")),
        (column("h2d_per_token", False), lambda x: fmt(m(x).get("h2d_per_token"), ".1f")),
        value("Prefetched per cycle", lambda x: prefetched(x, "issued")),
        value("Precision (used / prefetched)", precision, ".3f"),
        value("Evicted unused per cycle", lambda x: prefetched(x, "evicted_unused")),
        value(tagged("Copy ms hidden per cycle", emulated), lambda x: prefetched(x, "hidden_ms"))],
        rows, key=lambda x: x[2]))
    sec.notes += [note("prefetch", pre=label["prefetch"], own=label["self"], oracle=label["oracle"],
                       ca=label[SPECFIT_CA.name], e3p=label[EAGLE3_PREFETCH.name], e3=label[EAGLE3.name]),
                  note("prefetch_goal", cells=[c for c in cells if c.cached], pre=label["prefetch"]),
                  note("prefetch_time"), interval_note(inputs.seed), note("prefetch_theory", oracle=label["oracle"])]
    return sec
