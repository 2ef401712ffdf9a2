"""The host work per cycle (section 4.6: selection; here also route prediction and a prefetch's decisions), included
in every measured throughput, of every method; the paper's selection cost beside SpecFit's main run on the A100."""

from specfit.report.page import CACHE, METHOD, MISSING, Section, fmt, table, tagged
from specfit.report.quantities import metric
from specfit.report.scope import Scope


def section(scope: Scope) -> Section:
    sec = Section("Host work per cycle (section 4.6)")
    paper = scope.paper.selection_cost()
    runs, emulated = [], False
    for w in scope.workloads:
        present, any_emulated = scope.present(sec, scope.runs_of(w))
        emulated |= any_emulated
        runs += present

    def beside(key, spec):  # the paper's figure beside SpecFit's run at the main slots
        return lambda r: (fmt(paper[key].get(scope.paper_key(r.workload)), spec)
                          if paper is not None and r.method == scope.roles.specfit and r.slots == scope.main
                          else MISSING)

    if runs:
        sec.tables.append(table(scope.id("selection-cost"), tagged(
            "Host work per cycle (selection, route prediction, prefetch decisions), included in every measured "
            "throughput", emulated), [
            ("Workload", lambda r: r.workload), METHOD, CACHE, metric(scope.inputs.metrics, "select_ms_median",
                                                                      emulated),
            metric(scope.inputs.metrics, "select_share_pct", emulated),
            ("Paper median ms (A100)", beside("median_ms_per_cycle", ".2f")),
            ("Paper share (%)", beside("share_of_decode_time_pct", ".1f"))], runs))
    return sec
