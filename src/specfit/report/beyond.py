"""Beyond the paper: the cache- and draft-aware SpecFit (rule ``specfit-ca``, issue 12) beside AR, EAGLE-3 and the
paper's SpecFit in every cell (workload × slots) of one (model, device) where it ran, judged against the issue's
goal with the paired bootstrap intervals; for a cell that misses it, where the time went and why, in words made
from those numbers.

The goal, per cell: specfit-ca at least as fast as the faster of AR and EAGLE-3 in the cell (a tie within the
interval counts) and, with the cache (slots > 0), faster than the paper's SpecFit (a tie does not count). Without
the cache every expert is copied, the cache-aware cost has nothing to tell apart, and only the first part counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specfit.report.inputs import METRICS, tps_cell
from specfit.report.page import MISSING, Section, Table, cache_cell, fmt, interval_note, tagged, x_cell
from specfit.workflow import DecodeRun

if TYPE_CHECKING:
    from specfit.report.sections import Group

TITLE = "Beyond the paper: specfit-ca"
BASELINES = ("ar", "eagle3")  # the best of these in a cell is the bar to meet (a tie counts)
ROLES = ("ar", "eagle3", "specfit", "specfit-ca")  # the table's methods, by rule
LABELS = {"ar": "AR", "eagle3": "EAGLE-3", "specfit": "SpecFit", "specfit-ca": "specfit-ca"}  # when a role is absent

# the parts of a cycle as the stream times them (specfit.speculative.request.Session), metrics.json keys; select and
# commit ms/cycle and cycles_without_draft are absent from metrics.json files written before issue 12 (shown "–")
PARTS = (("verify", "verify_ms_per_cycle"), ("drafting", "draft_ms_per_cycle"), ("selection", "select_ms_per_cycle"),
         ("commit", "commit_ms_per_cycle"))
NEW_KEYS = ("select_ms_per_cycle", "commit_ms_per_cycle", "cycles_without_draft")
PART_SHARE = 0.02  # a part enters the sentence when it differs by at least this share of the rival's cycle
NOISE = 0.05  # H2D/token enters the sentence when it differs by more than this share (5%)


@dataclass
class Cell:
    """One workload × slots of specfit-ca: each role's run (None: not in the config's matrix) and the verdicts."""

    workload: str
    slots: int
    runs: dict[str, DecodeRun | None]  # by rule (ROLES)
    best: str | None = None  # the rule of the faster of AR and EAGLE-3 (None: a run is missing)
    vs_best: dict | None = None  # specfit-ca / best, with its paired interval and verdict
    vs_specfit: dict | None = None  # specfit-ca / SpecFit
    met: bool | None = None  # None: not judged
    reason: str = ""  # why not judged

    @property
    def cached(self) -> bool:
        return self.slots > 0


def verdict(e: dict | None) -> str | None:
    """A ratio's verdict, None without a ratio or without an interval (a point estimate decides nothing)."""
    return None if e is None else e.get("verdict")


def judge(cell: Cell, metrics: dict) -> None:
    """Goal met: specfit-ca / best ties or wins, and with the cache specfit-ca / SpecFit wins. A part that fails
    decides the cell even when the other cannot be judged; a part without a ratio or its interval is not judged."""
    ca = cell.runs["specfit-ca"]
    parts = [(verdict(cell.vs_best), ("tie", "faster"), [ca] + [cell.runs[b] for b in BASELINES], "AR or EAGLE-3")]
    if cell.cached:
        parts.append((verdict(cell.vs_specfit), ("faster",), [ca, cell.runs["specfit"]], "SpecFit"))
    outcomes = [None if v is None else v in ok for v, ok, _, _ in parts]
    cell.met = False if False in outcomes else None if None in outcomes else True
    if cell.met is None:
        _, _, runs, what = parts[outcomes.index(None)]
        if all(r is None for r in runs[1:]):
            cell.reason = f"no {what} run in this cell"
        elif lacking := [r.method for r in runs if r is not None and r not in metrics]:
            cell.reason = f"no metrics.json of {', '.join(lacking)}"
        else:
            cell.reason = "no interval: a requests.parquet is missing"


def goal_text(cell: Cell) -> str:
    if cell.met is None:
        return f"not judged ({cell.reason})"
    return "yes" if cell.met else "no"


# ------------------------------------------------------------------------------------ the numbers of a missed cell
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


def time_row(name: str, m: dict, is_ar: bool) -> list[str]:
    """One method's row of "where the time went" (AR drafts nothing: a dash where only drafting counts)."""
    return [name, fmt(m.get("ms_per_cycle"), ".2f"),
            MISSING if is_ar else fmt(m.get("draft_ms_per_cycle"), ".2f"),
            fmt(m.get("select_ms_per_cycle"), ".2f"), fmt(m.get("verify_ms_per_cycle"), ".2f"),
            fmt(m.get("commit_ms_per_cycle"), ".2f"), fmt(m.get("committed_per_cycle"), ".2f"),
            fmt(ms_per_token(m), ".2f"), fmt(m.get("h2d_per_token"), METRICS["h2d_per_token"].fmt),
            MISSING if is_ar else fmt(drafted_nothing_pct(m), ".1f")]


def time_header(emulated: bool) -> list[str]:
    return ["Method"] + [tagged(h, emulated) for h in ("ms/cycle", "Draft ms/cycle", "Select ms/cycle",
                                                        "Verify ms/cycle", "Commit ms/cycle")] + [
        "Committed per cycle", tagged("ms per committed token", emulated), "H2D/token",
        "Cycles that drafted nothing (%)"]


def why(name: str, m: dict, rival: str, r: dict, rival_is_ar: bool, e: dict | None) -> str:
    """Why ``name`` (metrics ``m``) misses against ``rival`` (``r``), in words made from the numbers: the ratio,
    the cycle and the parts that differ, the tokens a cycle commits and what it would need, the expert copies per
    token, and the cycles that drafted nothing."""
    clauses = []
    ms, r_ms = m.get("ms_per_cycle"), r.get("ms_per_cycle")
    if ms is not None and r_ms is not None:
        parts = []
        for label, key in PARTS:
            a, b = m.get(key), 0.0 if rival_is_ar and label == "drafting" else r.get(key)  # AR drafts nothing
            if a is None or b is None:
                continue
            d = a - b
            if abs(d) < PART_SHARE * r_ms:
                continue
            if label == "drafting" and rival_is_ar:
                parts.append((abs(d), f"drafting adds {d:.2f} ms/cycle"))
            else:
                what = "forward" if rival_is_ar and label == "verify" else label
                parts.append((abs(d), f"{label} is {abs(d):.2f} ms/cycle {'slower' if d > 0 else 'faster'} than "
                                      f"{rival}'s {what}"))
        text = f"its cycle takes {ms:.2f} ms against {r_ms:.2f} ms"
        if parts:
            text += " (" + ", ".join(p for _, p in sorted(parts, key=lambda p: -p[0])) + ")"
        clauses.append(text)
    c, r_c = m.get("committed_per_cycle"), r.get("committed_per_cycle")
    t, r_t = ms_per_token(m), ms_per_token(r)
    if c is not None and r_c is not None:
        text = f"it commits {c:.2f} tokens per cycle against {r_c:.2f}"
        if t is not None and r_t is not None:
            text += f", {t:.2f} ms per committed token against {r_t:.2f}"
            if t > r_t and ms is not None:
                text += (f": at its cycle time it would need {ms / r_t:.2f} tokens per cycle, or at its tokens a "
                         f"cycle of {c * r_t:.2f} ms, to match")
            elif verdict(e) == "tie":
                text += ": not slower per committed token, but the gain lies within the interval"
            else:
                text += ": not slower per committed token"
        clauses.append(text)
    h, r_h = m.get("h2d_per_token"), r.get("h2d_per_token")
    if h is not None and r_h is not None and abs(h - r_h) > NOISE * max(r_h, 1e-9):
        clauses.append(f"it copies {h:.1f} experts per token against {r_h:.1f} ({'more' if h > r_h else 'fewer'})")
    empty = drafted_nothing_pct(m)
    if empty is not None and empty > 0:
        text = f"{empty:.0f}% of its cycles drafted nothing"
        r_empty = None if rival_is_ar else drafted_nothing_pct(r)
        if r_empty is not None:
            text += f" ({rival}: {r_empty:.0f}%)"
        clauses.append(text)
    lead = f"{name} / {rival}: {x_cell(e)}"
    if not clauses:
        return lead + "."
    return f"{lead}; " + "; ".join(clauses) + "."


# ------------------------------------------------------------------------------------ the section
def beyond_the_paper(g: Group) -> Section | None:
    """The section of one (model, device); None when no method has rule specfit-ca or it has no run here."""
    ca = g.roles.specfit_ca
    if ca is None:
        return None
    names = {"ar": g.roles.ar, "eagle3": g.roles.eagle3, "specfit": g.roles.specfit, "specfit-ca": ca}
    matrix = set(g.runs)
    cells = []
    for w in g.workloads:
        slots = sorted({r.slots for r in g.runs if r.workload == w and r.method == ca}, key=lambda s: (s == 0, -s))
        for s in slots:
            runs = {role: (DecodeRun(g.model, g.device, w, name, s) if name is not None else None)
                    for role, name in names.items()}
            cells.append(Cell(w, s, {role: r if r in matrix else None for role, r in runs.items()}))
    if not cells:
        return None
    i = g.i
    sec = Section(TITLE)
    keys = [r for c in cells for r in c.runs.values() if r is not None]
    sec.missing += i.missing(keys)
    sec.missing += i.missing_requests(keys)
    emulated = g.emulated(keys)
    rows = []
    for c in cells:
        base = [c.runs[b] for b in BASELINES if c.runs[b] is not None]
        if base and all(r in i.metrics for r in base):
            best = max(base, key=lambda r: i.metrics[r]["tps_dec"] or 0.0)
            c.best = next(b for b in BASELINES if c.runs[b] == best)
            c.vs_best = i.speedup(c.runs["specfit-ca"], best)
        c.vs_specfit = i.speedup(c.runs["specfit-ca"], c.runs["specfit"])
        judge(c, i.metrics)
        rows.append([c.workload, cache_cell(c.slots)]
                    + [tps_cell(i.tps(c.runs[role])) for role in ROLES]
                    + [MISSING if c.best is None else names[c.best], x_cell(c.vs_best),
                       x_cell(c.vs_specfit) + ("" if c.cached or c.vs_specfit is None else " (not counted: no cache)"),
                       goal_text(c)])
    label = {role: names[role] or LABELS[role] for role in ROLES}
    header = (["Workload", "Cache"] + [tagged(f"{label[role]} Decode TPS", emulated) for role in ROLES]
              + [f"Best of {label['ar']}, {label['eagle3']}", tagged(f"{ca} / best (×)", emulated),
                 tagged(f"{ca} / {label['specfit']} (×)", emulated), "Goal met"])
    sec.tables.append(Table(tagged(f"{ca} against the issue's goal per cell, {g.model} / {g.device}", emulated),
                            header, rows))
    met = sum(c.met is True for c in cells)
    unjudged = sum(c.met is None for c in cells)
    sec.notes.append(
        f"{ca} is SpecFit beyond the paper: it prices the experts its layer cache already holds apart from the ones "
        "it must copy (β_hit, β_miss), drafts a further level only when it could pay for itself, and skips drafting "
        f"while speculation has not paid lately. The goal, per cell (workload × slots): {ca} at least as fast as the "
        f"faster of {label['ar']} and {label['eagle3']} in that cell (a tie within the interval counts) and, with the "
        f"cache (slots > 0), faster than the paper's SpecFit ({label['specfit']}; a tie does not count). Without the "
        "cache (slots 0) only the first part counts: every expert is copied, so the cache-aware cost is the paper's.")
    summary = f"Goal met in {met} of {len(cells)} cells."
    if unjudged:
        summary += f" {unjudged} not judged: " + "; ".join(
            f"{c.workload}, cache {cache_cell(c.slots)}: {c.reason}" for c in cells if c.met is None) + "."
    sec.notes.append(summary)
    sec.notes.append(interval_note(i.seed))
    missed = [c for c in cells if c.met is False]
    if missed:
        where_the_time_went(g, sec, missed, names, emulated)
    return sec


def where_the_time_went(g: Group, sec: Section, missed: list[Cell], names: dict, emulated: bool) -> None:
    """Per missed cell, each method's cycle in parts; then, per comparison that failed, the sentence that says why."""
    i, ca = g.i, names["specfit-ca"]
    reasons = []
    older = False
    for c in missed:
        present = [(role, c.runs[role]) for role in ROLES if c.runs[role] in i.metrics]
        older |= any(k not in i.metrics[r] for _, r in present for k in NEW_KEYS)
        sec.tables.append(Table(
            tagged(f"Where the time went, {g.workload_title(c.workload)}, cache {cache_cell(c.slots)}", emulated),
            time_header(emulated), [time_row(r.method, i.metrics[r], role == "ar") for role, r in present]))
        m = i.metrics[c.runs["specfit-ca"]]
        fails = []
        if verdict(c.vs_best) == "slower":
            fails.append((c.best, c.vs_best))
        if c.cached and verdict(c.vs_specfit) not in (None, "faster"):
            fails.append(("specfit", c.vs_specfit))
        for role, e in fails:
            rival = c.runs[role]
            reasons.append([c.workload, cache_cell(c.slots), rival.method,
                            why(ca, m, rival.method, i.metrics[rival], role == "ar", e)])
    sec.tables.append(Table(tagged(f"Why {ca} misses the goal, {g.model} / {g.device}", emulated),
                            ["Workload", "Cache", "Against", tagged("Why (from the numbers above)", emulated)],
                            reasons))
    sec.notes.append(
        "Where the time went, in the cells that miss the goal: each method's mean ms per cycle and its parts as the "
        "stream times them (draft: the drafter's catch-up and levels; select: the selection and the decision whether "
        "to draft; verify: the target's forward with its expert copies; commit), the tokens a cycle commits, ms per "
        "committed token (ms/cycle over committed per cycle), H2D expert copies per output token (prefill included) "
        "and the share of cycles whose pool held the root alone (drafted nothing).")
    if older:
        sec.notes.append("Select and commit ms/cycle and the cycles that drafted nothing are absent from metrics.json "
                         "written before they were recorded: a dash (drafted nothing: 100% where the mean pool is "
                         "empty).")
