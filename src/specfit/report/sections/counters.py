"""Verification and transfer counters (Tables 2 and 3), tokens per transfer, and where the time a SpecFit cycle saves
against a cached EAGLE-3 cycle comes from (section 4.2)."""

from specfit.planning.matrix import method_kind
from specfit.report.page import CACHE, METHOD, Section, fmt, note, pct_less, pct_more, share_of, table, tagged
from specfit.report.quantities import TOKENS_PER_TRANSFER, metric, tokens_per_transfer
from specfit.report.scope import Scope
from specfit.results.metrics import SPLIT_KEYS
from specfit.speculative.kinds import REFERENCE

KEYS = ("draft_nodes_per_cycle", "committed_per_cycle", *SPLIT_KEYS, "cycles", "ms_per_cycle", "h2d_per_token",
        "draft_ms_per_cycle", "verify_ms_per_cycle")
PARTS = (("Whole cycle (ms/cycle)", "ms_per_cycle", "shorter_cycle_pct", None),  # row, key, the paper's cut, share
         ("Drafting", "draft_ms_per_cycle", "drafting_time_cut_pct", None),
         ("Verification (target forward)", "verify_ms_per_cycle", None, "verification_share_of_saving_pct"),
         ("Rest (selection, commit, synchronization)", "rest", None, None))


def section(scope: Scope) -> Section:
    sec = Section("Verification counters, every expert resident (nothing is copied)" if scope.resident
                  else "Verification and transfer counters (Tables 2 and 3)")
    saving = False
    for w in scope.workloads:
        saving |= workload(scope, sec, w)
    if saving:
        sec.notes.append(note("counters_time_saved"))
    if sec.tables:
        sec.notes += [note("counters_cache", tokens_per_transfer=TOKENS_PER_TRANSFER), note("counters_fresh")]
    return sec


def workload(scope: Scope, sec: Section, w: str) -> bool:
    """The counters and tokens per transfer of a workload's runs; whether it could say where SpecFit saves time."""
    present, emulated = scope.present(sec, scope.runs_of(w))
    if not present:
        return False

    def over_eagle(r):
        base = None if r.method == eagle else scope.inputs.metrics.get(scope.run(w, eagle, r.slots))
        return fmt(pct_more(tokens_per_transfer(scope.inputs.metrics[r]), tokens_per_transfer(base)), ".1f")

    eagle = scope.roles.eagle3
    counters = [metric(scope.inputs.metrics, k, emulated, ar=lambda r: REFERENCE in method_kind(scope.spec,
                                                                                                r.method).roles)
                for k in KEYS]
    paper = [(f"Paper {scope.gpu} {name}", lambda r, k=key, f=spec: fmt(scope.paper_value(r, k), f)) for name, key,
             spec in (
        ("ms/cycle", "ms_per_cycle", ".1f"), ("committed", "committed_per_cycle",
                                              ".2f"))] if scope.at_paper_scale else []
    sec.tables.append(table(scope.id("counters", w), tagged(f"Counters per verification cycle, {scope.title(w)}",
                                                            emulated),
                            [METHOD, CACHE, *counters, *paper], present))
    sec.tables.append(table(scope.id("transfers", w), f"Tokens per transfer, {scope.title(w)}", [
        METHOD, CACHE, metric(scope.inputs.metrics, "h2d_per_token", False),
        (TOKENS_PER_TRANSFER, lambda r: fmt(tokens_per_transfer(scope.inputs.metrics[r]), ".4f")),
        (f"Tokens per transfer over {eagle} at the same cache (%)", over_eagle)], present))
    return time_saved(scope, sec, w)


def time_saved(scope: Scope, sec: Section, workload: str) -> bool:
    """Where the time a SpecFit cycle saves against a cached EAGLE-3 cycle comes from (section 4.2: verification
    accounts for 78.3% of it on summarization): each part's drop over the drop in ms/cycle."""
    runs = [scope.run(workload, m, scope.main) for m in (scope.roles.eagle3, scope.roles.specfit)]
    if any(r not in scope.inputs.metrics for r in runs):
        return False
    e, f = ({k: scope.inputs.metrics[r].get(k) for k in ("ms_per_cycle", "draft_ms_per_cycle", "verify_ms_per_cycle")}
            for r in runs)
    if None in (*e.values(), *f.values()):
        return False
    for m in (e, f):
        m["rest"] = m["ms_per_cycle"] - m["draft_ms_per_cycle"] - m["verify_ms_per_cycle"]
    saved = e["ms_per_cycle"] - f["ms_per_cycle"]
    claims, emulated, eagle, fit = scope.claims(workload), scope.emulated(runs), runs[0].method, runs[1].method
    paper = [(f"Paper {scope.gpu} cut (%)", lambda p: fmt(claims.get(p[2]), ".1f")),
             (f"Paper {scope.gpu} share of the time saved (%)", lambda p: fmt(claims.get(p[3]),
                                                                              ".1f"))] if claims else []
    sec.tables.append(table(scope.id("time-saved", workload), tagged(
        f"Time saved per cycle, {fit} vs {eagle} with the cache ({scope.main} slots), {scope.title(workload)}",
        emulated), [
        ("Part of the cycle", lambda p: p[0]), (tagged(f"{eagle} ms", emulated), lambda p: fmt(e[p[1]], ".2f")),
        (tagged(f"{fit} ms", emulated), lambda p: fmt(f[p[1]], ".2f")),
        (tagged("Saved ms", emulated), lambda p: fmt(e[p[1]] - f[p[1]], ".2f")),
        (tagged("Cut (%)", emulated), lambda p: fmt(pct_less(f[p[1]], e[p[1]]), ".1f")),
        (tagged("Share of the time saved (%)", emulated), lambda p: fmt(share_of(e[p[1]] - f[p[1]], saved), ".1f")),
        *paper], PARTS, key=lambda p: p[1]))
    return True
