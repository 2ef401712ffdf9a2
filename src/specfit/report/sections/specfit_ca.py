"""Beyond the paper: the cache- and draft-aware SpecFit (kind ``specfit-ca``) beside AR, EAGLE-3 and the
paper's SpecFit in every cell (workload × slots) where it ran, judged against its goal (`judge`) with the
paired bootstrap intervals; for a cell that misses it, where the time went and why, in words made from those numbers.
"""

from specfit.report.page import MISSING, Section, Table, cache_cell, fmt, interval_note, note, table, tagged
from specfit.report.quantities import LATER_KEYS, METRICS, metric, tps_cell, x_cell
from specfit.report.scope import Cell, Scope
from specfit.report.verdict import Verdict, judged, overall
from specfit.speculative.kinds import AR, BASELINE, COMPARED, EAGLE3, SPECFIT, SPECFIT_CA, kind, with_role

TITLE = "Beyond the paper: specfit-ca"
BASELINES = with_role(BASELINE)  # AR, EAGLE-3: the best of these in a cell is the bar to meet (a tie counts)
ROLES = with_role(COMPARED)  # AR, EAGLE-3, SpecFit, specfit-ca: the table's methods, by kind
LABELS = {k: kind(k).shown for k in ROLES}  # when a role is absent
# the parts of a cycle as the stream times them (specfit.speculative.request.Session), metrics.json keys
PARTS = (("verify", "verify_ms_per_cycle"), ("drafting", "draft_ms_per_cycle"), ("selection", "select_ms_per_cycle"),
         ("commit", "commit_ms_per_cycle"))
PART_SHARE = 0.02  # a part enters the sentence when it differs by at least this share of the rival's cycle
TIMED = ("ms_per_cycle", "draft_ms_per_cycle", "select_ms_per_cycle", "verify_ms_per_cycle", "commit_ms_per_cycle")
NOISE = 0.05  # H2D/token enters the sentence when it differs by more than this share (5%)


def judge(scope: Scope, c: Cell) -> None:
    """Goal met: specfit-ca / best ties or wins, and with the cache specfit-ca / SpecFit wins; each part is a goal of
    its own (by the ratio's key), and one that fails decides the cell even when the other cannot be judged."""
    inputs, ca = scope.inputs, c.runs[SPECFIT_CA.name]
    base = [c.runs[b] for b in BASELINES if c.runs[b] is not None]
    if base and all(r in inputs.metrics for r in base):
        best = max(base, key=lambda r: inputs.metrics[r]["tps_dec"] or 0.0)
        c.best = next(b for b in BASELINES if c.runs[b] == best)
    c.ratios = {"best": None if c.best is None else inputs.speedup(ca, c.runs[c.best]),
                SPECFIT.name: inputs.speedup(ca, c.runs[SPECFIT.name])}
    c.goals["best"] = judged(c.ratios["best"], (Verdict.TIE, Verdict.FASTER), [ca, *(base or [None])], inputs.metrics,
                             "AR or EAGLE-3")
    if c.cached:
        c.goals[SPECFIT.name] = judged(c.ratios[SPECFIT.name], (Verdict.FASTER,), [ca, c.runs[SPECFIT.name]],
                                       inputs.metrics,
                                    "SpecFit")
    c.goals["goal"] = overall(list(c.goals.values()))


def section(scope: Scope) -> Section | None:
    """None when no method has kind specfit-ca or it has no run on this device."""
    if (ca := scope.roles.specfit_ca) is None:
        return None
    names = {AR.name: scope.roles.ar, EAGLE3.name: scope.roles.eagle3, SPECFIT.name: scope.roles.specfit,
             SPECFIT_CA.name: ca}
    if not (cells := scope.cells(ca, names)):
        return None
    inputs, (sec, emulated) = scope.inputs, scope.section_on(TITLE, cells)
    for c in cells:
        judge(scope, c)
    label = {role: names[role] or LABELS[role] for role in ROLES}
    sec.tables.append(table(scope.id(SPECFIT_CA.name), tagged(f"{ca} against its goal per cell, {scope.model} / "
                                                       f"{scope.device}", emulated), [
        ("Workload", lambda c: c.workload), ("Cache", lambda c: cache_cell(c.slots)),
        *((tagged(f"{label[role]} Decode TPS", emulated), lambda c, role=role: tps_cell(inputs.tps(c.runs[role])))
          for role in ROLES),
        (f"Best of {label[AR.name]}, {label[EAGLE3.name]}", lambda c: MISSING if c.best is None else names[c.best]),
        (tagged(f"{ca} / best (×)", emulated), lambda c: x_cell(c.ratios["best"])),
        (tagged(f"{ca} / {label[SPECFIT.name]} (×)", emulated), lambda c: x_cell(c.ratios[SPECFIT.name]) + (
            "" if c.cached or c.ratios[SPECFIT.name] is None else " (not counted: no cache)")),
        ("Goal met", lambda c: c.goals["goal"].answer())], cells, key=lambda c: (c.workload, c.slots)))
    sec.notes += [note("specfit_ca", ca=ca, ar=label[AR.name], eagle3=label[EAGLE3.name], specfit=label[SPECFIT.name]),
                  note("specfit_ca_goal", cells=cells), interval_note(inputs.seed)]
    if missed := [c for c in cells if c.goals["goal"].verdict == Verdict.MISSED]:
        where_the_time_went(scope, sec, missed, ca, emulated)
    return sec


def drafted_nothing_pct(m: dict) -> float | None:
    """The share of cycles whose pool held the root alone: ``cycles_without_draft``; from an older metrics.json,
    100% when its mean pool size is 0, else unknown."""
    n, cycles = m.get("cycles_without_draft"), m.get("cycles")
    if n is not None and cycles:
        return 100.0 * n / cycles
    return 100.0 if m.get("pool_nodes_per_cycle") == 0 else None


def ms_per_token(m: dict) -> float | None:
    """ms per committed token of the decode loop: ms/cycle over committed tokens per cycle."""
    ms, committed = m.get("ms_per_cycle"), m.get("committed_per_cycle")
    return None if ms is None or not committed else ms / committed


def why(name: str, m: dict, rival: str, r: dict, rival_is_ar: bool, e) -> str:
    """Why ``name`` (metrics ``m``) misses against ``rival`` (``r``), in words made from the numbers
    (templates/notes.j2): the ratio, the cycle and the parts that differ, the tokens a cycle commits and what it would
    need, the expert copies per token, and the cycles that drafted nothing."""
    parts = []  # (part, this run's ms/cycle, the rival's): those that differ, the largest difference first
    if m.get("ms_per_cycle") is not None and r.get("ms_per_cycle") is not None:
        for label, key in PARTS:
            a, b = m.get(key), 0.0 if rival_is_ar and label == "drafting" else r.get(key)  # AR drafts nothing
            if a is not None and b is not None and abs(a - b) >= PART_SHARE * r["ms_per_cycle"]:
                parts.append((label, a, b))
        parts.sort(key=lambda p: -abs(p[1] - p[2]))
    h, r_h = m.get("h2d_per_token"), r.get("h2d_per_token")
    return note("specfit_ca_why", name=name, rival=rival, ratio=x_cell(e), m=m, r=r, parts=parts, ar=rival_is_ar,
                t=ms_per_token(m), r_t=ms_per_token(r), tie=e is not None and e.verdict == Verdict.TIE,
                copies=h is not None and r_h is not None and abs(h - r_h) > NOISE * max(r_h, 1e-9),
                empty=drafted_nothing_pct(m), r_empty=None if rival_is_ar else drafted_nothing_pct(r))


def where_the_time_went(scope: Scope, sec: Section, missed: list[Cell], ca: str, emulated: bool) -> None:
    """Per missed cell, each method's cycle in parts; then, per part of the goal it missed, the sentence that says
    why."""
    inputs, reasons = scope.inputs, []

    def m(x):  # a row's metrics.json: (role, run)
        return inputs.metrics[x[1]]

    def cycle(key):  # a part of the cycle in ms
        return metric(inputs.metrics, key, emulated, run=lambda x: x[1], ar=lambda x: x[0] == AR.name, spec=".2f")

    for c in missed:
        present = [(role, c.runs[role]) for role in ROLES if c.runs[role] in inputs.metrics]
        sec.tables.append(table(scope.id("where-the-time-went", c.workload, c.slots), tagged(
            f"Where the time went, {scope.title(c.workload)}, cache {cache_cell(c.slots)}", emulated), [
            ("Method", lambda x: x[1].method), *map(cycle, TIMED),
            (METRICS["committed_per_cycle"].label + " per cycle",
             lambda x: fmt(m(x).get("committed_per_cycle"), ".2f")),
            (tagged("ms per committed token", emulated), lambda x: fmt(ms_per_token(m(x)), ".2f")),
            metric(inputs.metrics, "h2d_per_token", emulated, run=lambda x: x[1]),
            ("Cycles that drafted nothing (%)", lambda x: MISSING if x[0] == AR.name
             else fmt(drafted_nothing_pct(m(x)), ".1f"))], present, key=lambda x: x[1]))
        for k in ("best", SPECFIT.name):  # the parts of the goal, by ratio
            if k in c.goals and c.goals[k].verdict == Verdict.MISSED:
                role = c.best if k == "best" else k
                reasons.append([c.workload, cache_cell(c.slots), c.runs[role].method, why(
                    ca, inputs.metrics[c.runs[SPECFIT_CA.name]], c.runs[role].method, inputs.metrics[c.runs[role]],
                    role == AR.name, c.ratios[k])])
    sec.tables.append(Table(scope.id("specfit-ca-why"),
                            tagged(f"Why {ca} misses the goal, {scope.model} / {scope.device}",
                                                              emulated),
                            ["Workload", "Cache", "Against", tagged("Why (from the numbers above)", emulated)],
                            reasons))
    sec.notes.append(note("specfit_ca_time"))
    if any(k not in inputs.metrics[r]
           for c in missed for r in c.runs.values() if r in inputs.metrics for k in LATER_KEYS):
        sec.notes.append(note("specfit_ca_older"))
