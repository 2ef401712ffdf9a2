"""The selection theory on the recorded pools (Table 5): SpecFit's pools under the paper's cost, the paper's beside;
beyond the paper, specfit-ca's pools under the cache-aware cost it selects with."""

from specfit.report.page import Section, Table, fmt
from specfit.report.quantities import PAPER_PAIR, THEORY, THEORY_CACHE_AWARE
from specfit.report.scope import Scope
from specfit.workflow import DecodeRun, theory_cost, theory_file, theory_runs


def section(s: Scope) -> Section:
    sec = Section("Selection theory on the recorded pools (Table 5)")
    runs = [r for r in theory_runs(s.spec) if (r.model, r.device) == (s.model, s.device)]
    sec.missing += [theory_file(s.spec, r) for r in runs if r not in s.i.theory]
    present = [r for r in runs if r in s.i.theory]
    if not runs:
        sec.notes.append("No SpecFit run with exact routes at the main slot count: nothing to evaluate.")
    if paper := [r for r in present if theory_cost(s.spec, r) == "paper"]:
        paper_cost(s, sec, paper)
    if cache_aware := [r for r in present if theory_cost(s.spec, r) == "cache_aware"]:
        cache_aware_cost(s, sec, cache_aware)
    return sec


def ours(s: Scope, run: DecodeRun, row) -> str:
    return " / ".join(fmt(s.i.theory[run][k], row.fmt) for k in row.keys)


def paper_cost(s: Scope, sec: Section, runs: list[DecodeRun]) -> None:
    """Table 5 on SpecFit's pools under the paper's cost, the paper's beside (A100; a column after each workload's)."""
    paper = {r: p for r in runs if (p := s.paper.table5(s.paper_key(r.workload))) is not None}
    header, rows = ["Quantity"], []
    for r in runs:
        pw = s.paper_key(r.workload)
        header += [r.workload] + ([f"paper ({pw})" if pw != r.workload else "paper"] if r in paper else [])
    for row in THEORY:
        cells = [row.label]
        for r in runs:
            cells.append(ours(s, r, row))
            if r in paper:
                value = None if row.paper is None else paper[r][row.paper]
                cells.append(" / ".join(fmt(value[k], row.fmt) for k in PAPER_PAIR) if isinstance(value, dict)
                             else fmt(value, row.fmt))
        rows.append(cells)
    sec.tables.append(Table(s.id("theory"), f"Theory on the pools SpecFit recorded with the cache ({s.main} slots), "
                            f"{s.model} / {s.device}, with the with-cache coefficients", header, rows,
                            [row.keys[0] for row in THEORY]))
    sec.notes.append("Percentages of λ* refer to the predicted throughput. Every recorded cycle counts, the ones "
                     "at the length limit that drafted nothing included. A cycle stopped early when it drafted "
                     "fewer levels than it could: the pool's depth, or, near the length limit, the levels the "
                     "room left allowed; a cycle the limit capped that drafted up to its cap did not stop."
                     + (" Paper: Table 5 (A100; its row counts cycles stopped before level 5)." if paper else ""))


def cache_aware_cost(s: Scope, sec: Section, runs: list[DecodeRun]) -> None:
    """Beyond the paper: the same quantities on specfit-ca's pools under the cache-aware cost it selects with."""
    methods = sorted({r.method for r in runs})
    rows = (*THEORY, *THEORY_CACHE_AWARE)
    sec.tables.append(Table(
        s.id("theory-cache-aware"), f"Beyond the paper: theory on the pools {', '.join(methods)} recorded with the "
        f"cache ({s.main} slots) under the cache-aware cost T(S) = b_|S| + D(d) + β_miss M(S) + β_hit H(S), "
        f"{s.model} / {s.device}", ["Quantity"] + [r.workload if len(methods) == 1 else f"{r.workload}, {r.method}"
                                                   for r in runs],
        [[row.label] + [ours(s, r, row) for r in runs] for row in rows], [row.keys[0] for row in rows]))
    sec.notes.append("Beyond the paper: the quantities of Table 5 under the cost specfit-ca selects with, from the "
                     "with-cache calibration's cache-aware fit without drafting. M(S) counts the experts of the "
                     "selection's per-layer union that the layer's cache did not hold as the cycle selected (each "
                     "cycle records that residency), H(S) those it held, and D(d) what drafting the cycle's d "
                     "levels costs (the calibration's drafting fit). \"2β\" doubles β_miss and β_hit, not the "
                     "intercepts b_|S| + D(d). A cycle in which specfit-ca skipped drafting records the residency "
                     "too (read off the timers) and is priced as the root alone with its atlas routes; one the "
                     "length limit left without room records none and is priced with nothing resident. A skipped "
                     "cycle counts as stopped early. λ* and Θ are predicted under this cost on specfit-ca's own "
                     "trajectory: not comparable with those of the paper's model.")
