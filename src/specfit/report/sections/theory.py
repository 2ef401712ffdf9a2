"""The selection theory on the recorded pools (Table 5): SpecFit's pools under the paper's cost, the paper's beside;
beyond the paper, specfit-ca's pools under the cache-aware cost it selects with."""

from specfit.planning.matrix import DecodeRun, theory_cost, theory_file, theory_runs
from specfit.report.page import Section, Table, fmt, note
from specfit.report.quantities import PAPER_PAIR, THEORY, THEORY_CACHE_AWARE
from specfit.report.scope import Scope


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
    sec.notes.append(note("theory_paper_cost", paper=bool(paper)))


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
    sec.notes.append(note("theory_cache_aware"))
