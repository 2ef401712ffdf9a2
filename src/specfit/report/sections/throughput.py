"""Decode throughput with and without the expert cache (Figures 2 and 3), and SpecFit's gains over EAGLE-3 at the
same cache in decode and in request TPS (prefill included), the paper's beside."""

from specfit.planning.matrix import method_kind
from specfit.report.figures import slug, throughput_bars
from specfit.report.page import CACHE, METHOD, Section, cache_cell, fmt, interval_note, note, table, tagged
from specfit.report.quantities import column, gain_cell, metric, tps_cell, x_cell
from specfit.report.scope import Scope

BASELINES, PAPER, BEYOND = "Baselines", "SpecFit as in the paper", "Beyond the paper"  # the figure's groups


def section(scope: Scope) -> Section:
    sec = Section("Decode throughput, every expert resident" if scope.resident
                  else "Decode throughput with and without the expert cache (Figures 2 and 3)")
    for w in scope.workloads:
        workload(scope, sec, w)
    if sec.tables:
        sec.notes += [interval_note(scope.inputs.seed), note("throughput_request_tps")]
    return sec


def workload(scope: Scope, sec: Section, w: str) -> None:
    present, emulated = scope.present(sec, [r for r in scope.runs_of(w) if r.slots in (0, scope.main)])
    if not present:
        return
    groups = {scope.main: f"Every expert resident ({scope.main} slots)"} if scope.resident else {
        scope.main: f"With expert cache ({scope.main} slots)", 0: "Without expert cache"}
    methods = [m for m in scope.spec["methods"] if any(r.method == m for r in present)]
    panels = {label: {m: scope.inputs.tps(scope.run(w, m, slots)) for m in methods} for slots, label in groups.items()}
    paper = {label: {m: v for m in methods if (v := scope.paper_value(scope.run(w, m, slots), "tps_dec")) is not None}
             for slots, label in groups.items()} if scope.at_paper_scale else {}
    fig = throughput_bars(panels, method_groups(scope, methods),
                          tagged(f"{scope.model} / {scope.device} / {w}: decode throughput", emulated),
                          paper if any(paper.values()) else None, f"the paper's {scope.gpu} decode TPS")
    sec.figures.append(scope.figures.save(fig, slug(scope.model, scope.device, w, "tps"), tagged(
        f"Decode TPS of each method with 95% bootstrap intervals, {' and '.join(groups.values()).lower()}, "
        f"{scope.title(w)}", emulated)))
    ar = scope.ar(w)
    sec.missing += scope.inputs.missing_requests([*present, ar])
    sec.tables.append(table(scope.id("throughput", w), tagged(f"Throughput, {scope.title(w)}", emulated), [
        METHOD, CACHE, (column("tps_dec", emulated), lambda r: tps_cell(scope.inputs.tps(r))),
        metric(scope.inputs.metrics, "tps_req", emulated),
        (tagged("Speedup over AR without cache", emulated), lambda r: x_cell(scope.inputs.speedup(r, ar))),
        *([(f"Paper {scope.gpu} decode TPS", lambda r: fmt(scope.paper_value(r, "tps_dec"),
                                                           ".2f"))] if scope.at_paper_scale
          else [])],
        present))
    gains(scope, sec, w, emulated)


def method_groups(scope: Scope, methods: list[str]) -> dict[str, list[str]]:
    """The figure's groups of methods, in the config's order: the baselines (kinds that select without routes: AR,
    EAGLE-3 at any tree), SpecFit as the paper runs it (exact routes, and the simulated noisy ones) and the rest,
    beyond the paper; empty groups left out."""
    paper = {scope.roles.specfit, *scope.roles.noisy}

    def group(m: str) -> str:
        return BASELINES if not method_kind(scope.spec, m).reads_routes else PAPER if m in paper else BEYOND

    return {g: ms for g in (BASELINES, PAPER, BEYOND) if (ms := [m for m in methods if group(m) == g])}


def gains(scope: Scope, sec: Section, workload: str, emulated: bool) -> None:
    """SpecFit over EAGLE-3 at the same cache, in decode TPS and in request TPS (prefill included)."""
    eagle, fit = scope.roles.eagle3, scope.roles.specfit
    claims = scope.claims(workload)
    cells = []  # slots, SpecFit's run, EAGLE-3's, the paper's claims in decode and request TPS
    for slots, dec, req in ((scope.main, "vs_cached_eagle3_pct", "incl_prefill_pct"),
                            (0, "vs_vanilla_eagle3_no_cache_pct", None)):
        num, den = scope.run(workload, fit, slots), scope.run(workload, eagle, slots)
        if num in scope.inputs.metrics and den in scope.inputs.metrics:
            sec.missing += scope.inputs.missing_requests([num, den])
            cells.append((slots, num, den, dec, req))
    paper = [(f"Paper {scope.gpu}, Decode TPS (%)", lambda c: fmt(claims.get(c[3]), ".1f")),
             (f"Paper {scope.gpu}, prefill included (%)", lambda c: fmt(claims.get(c[4]), ".1f"))] if claims else []
    if cells:
        sec.tables.append(table(scope.id("gains", workload), tagged(f"Gains at the same cache, {scope.title(workload)}",
                                                                 emulated), [
            ("Cache", lambda c: cache_cell(c[0])),
            (tagged(f"{fit} over {eagle}, Decode TPS (%)", emulated),
             lambda c: gain_cell(scope.inputs.speedup(c[1], c[2]))),
            (tagged(f"{fit} over {eagle}, Request TPS, prefill included (%)", emulated),
             lambda c: gain_cell(scope.inputs.request_speedup(c[1], c[2]))), *paper], cells, key=lambda c: c[0]))
