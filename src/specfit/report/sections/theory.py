"""The selection theory on the recorded pools (Table 5): SpecFit's pools under the paper's cost, the paper's beside;
beyond the paper, specfit-ca's pools under the cache-aware cost it selects with."""

from specfit.planning.matrix import DecodeRun, theory_cost, theory_file, theory_runs
from specfit.report.page import Section, Table, fmt, note
from specfit.report.quantities import PAPER_PAIR, THEORY, THEORY_CACHE_AWARE
from specfit.report.scope import Scope


def section(scope: Scope) -> Section:
    sec = Section("Selection theory on the recorded pools (Table 5)")
    runs = [r for r in theory_runs(scope.spec) if (r.model, r.device) == (scope.model, scope.device)]
    sec.missing += [theory_file(scope.spec, r) for r in runs if r not in scope.inputs.theory]
    present = [r for r in runs if r in scope.inputs.theory]
    if not runs:
        sec.notes.append("No SpecFit run with exact routes at the main slot count: nothing to evaluate.")
    if paper := [r for r in present if theory_cost(scope.spec, r) == "paper"]:
        paper_cost(scope, sec, paper)
    if cache_aware := [r for r in present if theory_cost(scope.spec, r) == "cache_aware"]:
        cache_aware_cost(scope, sec, cache_aware)
    return sec


def ours(scope: Scope, run: DecodeRun, row) -> str:
    return " / ".join(fmt(scope.inputs.theory[run][k], row.fmt) for k in row.keys)


def paper_cost(scope: Scope, sec: Section, runs: list[DecodeRun]) -> None:
    """Table 5 on SpecFit's pools under the paper's cost, the paper's beside (A100; a column after each workload's)."""
    paper = {r: p for r in runs if (p := scope.paper.table5(scope.paper_key(r.workload))) is not None}
    header, rows = ["Quantity"], []
    for r in runs:
        pw = scope.paper_key(r.workload)
        header += [r.workload] + ([f"paper ({pw})" if pw != r.workload else "paper"] if r in paper else [])
    for row in THEORY:
        cells = [row.label]
        for r in runs:
            cells.append(ours(scope, r, row))
            if r in paper:
                value = None if row.paper is None else paper[r][row.paper]
                cells.append(" / ".join(fmt(value[k], row.fmt) for k in PAPER_PAIR) if isinstance(value, dict)
                             else fmt(value, row.fmt))
        rows.append(cells)
    sec.tables.append(Table(scope.id("theory"),
                            f"Theory on the pools SpecFit recorded with the cache ({scope.main} slots), "
                            f"{scope.model} / {scope.device}, with the with-cache coefficients", header, rows,
                            [row.keys[0] for row in THEORY]))
    sec.notes.append(note("theory_paper_cost", paper=bool(paper)))


def cache_aware_cost(scope: Scope, sec: Section, runs: list[DecodeRun]) -> None:
    """Beyond the paper: the same quantities on specfit-ca's pools under the cache-aware cost it selects with."""
    methods = sorted({r.method for r in runs})
    rows = (*THEORY, *THEORY_CACHE_AWARE)
    sec.tables.append(Table(
        scope.id("theory-cache-aware"), f"Beyond the paper: theory on the pools {', '.join(methods)} recorded with the "
        f"cache ({scope.main} slots) under the cache-aware cost T(S) = b_|S| + D(d) + β_miss M(S) + β_hit H(S), "
        f"{scope.model} / {scope.device}",
        ["Quantity"] + [r.workload if len(methods) == 1 else f"{r.workload}, {r.method}" for r in runs],
        [[row.label] + [ours(scope, r, row) for r in runs] for row in rows], [row.keys[0] for row in rows]))
    sec.notes.append(note("theory_cache_aware"))
