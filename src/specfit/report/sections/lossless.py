"""The lossless check: each run's outputs against the AR reference, and every divergence with the target's top-2 logit
margin there."""

from specfit.report.page import MISSING, Section, Table, cache_cell, fmt, note
from specfit.report.quantities import LOSSLESS, RESUMED, TIMING_LABEL
from specfit.report.scope import Scope


def section(s: Scope) -> Section:
    sec = Section("Lossless check: each run's outputs against the AR reference")
    rows, keys, divergences = [], [], []
    for w in s.workloads:
        present, _ = s.present(sec, s.runs_of(w))
        for r in present:
            m = s.i.metrics[r]
            check = m[LOSSLESS]
            run = [w, r.method, cache_cell(r.slots)]
            common = [*run, fmt(m["n_requests"], "d"), fmt(m["n_output_tokens"], "d"), str(m[TIMING_LABEL]),
                      "yes" if m.get(RESUMED) else "no"]
            keys.append(r)
            if check is None:
                rows.append(common + ["(this run is the reference)", MISSING, MISSING, "reference"])
                continue
            divs = check.get("divergences") or []
            rows.append(common + [str(check["reference"]), identical_cell(check), diverged_cell(divs),
                                  verdict(check)])
            divergences += [[*run, str(d["request_id"]), str(d["position"]), fmt(d.get("ours"), "d"),
                             fmt(d.get("reference"), "d"), fmt(d["margin"], ".4g")] for d in divs]
    if rows:
        sec.tables.append(Table(s.id("lossless"), "Lossless check per run", [
            "Workload", "Method", "Cache", "Requests", "Output tokens", "Timing", "Resumed", "Reference",
            "Identical to the reference", "Not identical (first divergence, top-2 margin)", "Verdict"], rows, keys))
    if divergences:
        sec.tables.append(Table(s.id("divergences"), "Every divergence: first differing output position, the tokens "
                                "there, and the target's top-2 logit margin on the reference's prefix (a small margin "
                                "points to a numerical near-tie, not a bug)",
                                ["Workload", "Method", "Cache", "Request", "Position", "This run's token",
                                 "Reference token", "Top-2 margin"], divergences))
        sec.notes.append(note("lossless_divergences"))
    elif rows:
        sec.notes.append(note("lossless_none"))
    return sec


def identical_cell(check: dict) -> str:
    """"identical: x of n requests", and the requests the check could not compare."""
    text = f"identical: {check['n_identical']} of {check['n_requests']} requests"
    if check.get("missing"):
        text += f" ({check['missing']} more without a reference output, not compared)"
    return text


def diverged_cell(divergences: list[dict]) -> str:
    if not divergences:
        return "none"
    return "; ".join(f"request {d['request_id']} (position {d['position']}, margin {fmt(d['margin'], '.4g')})"
                     for d in divergences)


def verdict(check: dict) -> str:
    """Lossless only when every request was compared and is identical; a divergence is never "lossless"."""
    divs = check.get("divergences") or []
    n, same = check["n_requests"], check["n_identical"]
    if divs or same < n:
        return f"diverges: {n - same} of {n} requests differ from the reference"
    if check.get("missing"):
        return f"identical on the {n} requests compared; {check['missing']} not compared"
    return f"lossless: all {n} requests identical"
