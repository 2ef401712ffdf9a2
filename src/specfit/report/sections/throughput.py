"""Decode throughput with and without the expert cache (Figures 2 and 3), and SpecFit's gains over EAGLE-3 at the
same cache in decode and in request TPS (prefill included), the paper's beside."""

from specfit.report.figures import slug, throughput_bars
from specfit.report.page import CACHE, METHOD, Section, cache_cell, fmt, interval_note, note, table, tagged
from specfit.report.quantities import column, gain_cell, metric, tps_cell, x_cell
from specfit.report.scope import Scope


def section(s: Scope) -> Section:
    sec = Section("Decode throughput with and without the expert cache (Figures 2 and 3)")
    for w in s.workloads:
        workload(s, sec, w)
    if sec.tables:
        sec.notes += [interval_note(s.i.seed), note("throughput_request_tps")]
    return sec


def workload(s: Scope, sec: Section, w: str) -> None:
    present, emulated = s.present(sec, [r for r in s.runs_of(w) if r.slots in (0, s.main)])
    if not present:
        return
    bars = {m: [s.i.tps(s.run(w, m, slots)) for slots in (s.main, 0)]
            for m in s.spec["methods"] if any(r.method == m for r in present)}
    fig = throughput_bars(bars, [f"With expert cache ({s.main} slots)", "Without expert cache"],
                          tagged(f"{s.model} / {s.device} / {w}: decode throughput", emulated))
    sec.figures.append(s.figures.save(fig, slug(s.model, s.device, w, "tps"),
                                      tagged(f"Decode TPS with 95% bootstrap intervals, {s.title(w)}", emulated)))
    ar = s.ar(w)
    sec.missing += s.i.missing_requests([*present, ar])
    sec.tables.append(table(s.id("throughput", w), tagged(f"Throughput, {s.title(w)}", emulated), [
        METHOD, CACHE, (column("tps_dec", emulated), lambda r: tps_cell(s.i.tps(r))),
        metric(s.i.metrics, "tps_req", emulated),
        (tagged("Speedup over AR without cache", emulated), lambda r: x_cell(s.i.speedup(r, ar))),
        *([(f"Paper {s.gpu} decode TPS", lambda r: fmt(s.paper_value(r, "tps_dec"), ".2f"))] if s.at_paper_scale
          else [])],
        present))
    gains(s, sec, w, emulated)


def gains(s: Scope, sec: Section, workload: str, emulated: bool) -> None:
    """SpecFit over EAGLE-3 at the same cache, in decode TPS and in request TPS (prefill included)."""
    eagle, fit = s.roles.eagle3, s.roles.specfit
    claims = s.claims(workload)
    cells = []  # slots, SpecFit's run, EAGLE-3's, the paper's claims in decode and request TPS
    for slots, dec, req in ((s.main, "vs_cached_eagle3_pct", "incl_prefill_pct"),
                            (0, "vs_vanilla_eagle3_no_cache_pct", None)):
        num, den = s.run(workload, fit, slots), s.run(workload, eagle, slots)
        if num in s.i.metrics and den in s.i.metrics:
            sec.missing += s.i.missing_requests([num, den])
            cells.append((slots, num, den, dec, req))
    paper = [(f"Paper {s.gpu}, Decode TPS (%)", lambda c: fmt(claims.get(c[3]), ".1f")),
             (f"Paper {s.gpu}, prefill included (%)", lambda c: fmt(claims.get(c[4]), ".1f"))] if claims else []
    if cells:
        sec.tables.append(table(s.id("gains", workload), tagged(f"Gains at the same cache, {s.title(workload)}",
                                                                 emulated), [
            ("Cache", lambda c: cache_cell(c[0])),
            (tagged(f"{fit} over {eagle}, Decode TPS (%)", emulated),
             lambda c: gain_cell(s.i.speedup(c[1], c[2]))),
            (tagged(f"{fit} over {eagle}, Request TPS, prefill included (%)", emulated),
             lambda c: gain_cell(s.i.request_speedup(c[1], c[2]))), *paper], cells, key=lambda c: c[0]))
