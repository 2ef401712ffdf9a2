"""The lossless check: each run's outputs against the AR reference, the guarantee that held (with the exact verify,
every committed row bit-identical to AR's step) with the run's dtype, and every divergence with the target's top-2
logit margin there."""

from specfit.report.page import MISSING, Section, Table, cache_cell, fmt, note
from specfit.report.quantities import DTYPE, LOSSLESS, RESUMED, TIMING_LABEL, VERIFY
from specfit.report.scope import Scope
from specfit.report.sections.sampling import guarantee, sampling_of


def section(scope: Scope) -> Section:
    sec = Section("Lossless check: each run's outputs against the AR reference")
    rows, keys, divergences = [], [], []
    for w in scope.workloads:
        sampling = sampling_of(scope.spec, w)
        present, _ = scope.present(sec, scope.runs_of(w))
        for r in present:
            m = scope.inputs.metrics[r]
            check = m[LOSSLESS]
            run = [w, r.method, cache_cell(r.slots)]
            verify = m.get(VERIFY, MISSING)
            common = [*run, guarantee(sampling), str(m.get(DTYPE, MISSING)), verify, fmt(m["n_requests"], "d"),
                      fmt(m["n_output_tokens"], "d"), str(m[TIMING_LABEL]), "yes" if m.get(RESUMED) else "no"]
            keys.append(r)
            if check is None:
                rows.append(common + ["(this run is the reference)", MISSING, MISSING, "reference"])
                continue
            divs = check.get("divergences") or []
            rows.append(common + [str(check["reference"]), *(note(f"lossless_{cell}", check=check, divs=divs,
                                                                  verify=verify, rejection=sampling.rejection)
                                                             for cell in ("identical", "diverged", "verdict"))])
            if sampling.rejection:
                continue  # its tokens are not AR's to begin with: no divergence to explain
            divergences += [[*run, str(d["request_id"]), str(d["position"]), fmt(d.get("ours"), "d"),
                             fmt(d.get("reference"), "d"), fmt(d["margin"], ".4g")] for d in divs]
    if rows:
        sec.tables.append(Table(scope.id("lossless"), "Lossless check per run", [
            "Workload", "Method", "Cache", "Guarantee", "Dtype", "Verify", "Requests", "Output tokens", "Timing",
            "Resumed",
            "Reference", "Identical to the reference", "Not identical (first divergence, top-2 margin)",
            "Guarantee held"], rows, keys))
        sec.notes.append(note("lossless_verify"))
    if divergences:
        sec.tables.append(Table(scope.id("divergences"),
                                "Every divergence: first differing output position, the tokens "
                                "there, and the target's top-2 logit margin on the reference's prefix (a small margin "
                                "points to a numerical near-tie, not a bug)",
                                ["Workload", "Method", "Cache", "Request", "Position", "This run's token",
                                 "Reference token", "Top-2 margin"], divergences))
        sec.notes.append(note("lossless_divergences"))
    elif rows:
        sec.notes.append(note("lossless_none"))
    return sec
