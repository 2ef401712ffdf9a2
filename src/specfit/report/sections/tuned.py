"""Beyond the paper: every method against EAGLE-3 at the tree a user tunes by hand (kind ``eagle3-tuned``), in every
cell (workload × slots) where the tuned tree ran, with paired intervals, and where each cycle's time went.

The goal of a ``specfit-online`` method (`judge`), judged per device: in no cell slower than the best of AR,
EAGLE-3, the tuned tree and the paper's SpecFit (the methods of those roles, `specfit.report.scope.Roles`; a tie
counts), and faster than the tuned tree by more than the interval in at least half the cells. The paper's SpecFit
is shown against the same bars, its verdicts as they come.
"""

from specfit.planning.matrix import method_kind
from specfit.report.page import Section, cache_cell, fmt, interval_note, note, table, tagged
from specfit.report.quantities import tps_cell, x_cell
from specfit.report.scope import Scope
from specfit.report.sections.resident import tree as verified_from
from specfit.report.verdict import Verdict
from specfit.speculative.kinds import EAGLE3, EAGLE3_PREFETCH, SPECFIT_ONLINE

TITLE = "Beyond the paper: against the hand-tuned tree"
FIXED = {EAGLE3_PREFETCH.name: EAGLE3.name}  # a kind that verifies EAGLE-3's fixed tree
# where a cycle's time went (metrics.json keys), beside the throughput
SHOWN = (("Committed per cycle", "committed_per_cycle"), ("Verified draft nodes per cycle", "draft_nodes_per_cycle"),
         ("Drafted levels per cycle", "drafted_levels_per_cycle"), ("ms per cycle", "ms_per_cycle"),
         ("Draft ms per cycle", "draft_ms_per_cycle"), ("Host ms per cycle", "select_ms_per_cycle"),
         ("Verify ms per cycle", "verify_ms_per_cycle"))


def rows(scope: Scope, workload: str, slots: int) -> list[dict]:
    """A row per method that ran in the cell (config order), with its ratios to the tuned tree and to the best
    baseline."""
    inputs = scope.inputs
    ran = [r for r in scope.runs_of(workload) if r.slots == slots and r in inputs.metrics]
    kinds = {r: method_kind(scope.spec, r.method).name for r in ran}
    tuned = next((r for r in ran if r.method == scope.roles.eagle3_tuned), None)
    base = [r for r in ran if r.method in scope.roles.baselines]
    if tuned is None or not base:
        return []
    best = max(base, key=lambda r: inputs.metrics[r]["tps_dec"] or 0.0)
    return [{"run": r, "kind": kinds[r], "best": best, "tps": inputs.tps(r),
             "tuned": None if r == tuned else inputs.speedup(r, tuned),
             "vs_best": None if r == best else inputs.speedup(r, best)} for r in ran]


def judge(cells: list[list[dict]], method: str) -> dict:
    """A specfit-online method's goal over the cells it ran in: never behind the best baseline (a tie counts), and
    faster than the tuned tree in at least half the cells."""
    mine = [next(x for x in c if x["run"].method == method) for c in cells if any(x["run"].method == method for x in c)]
    behind = [x for x in mine if x["vs_best"] is not None and x["vs_best"].verdict == Verdict.SLOWER]
    unjudged = [x for x in mine if x["run"] != x["best"] and x["vs_best"] is None]
    faster = [x for x in mine if x["tuned"] is not None and x["tuned"].verdict == Verdict.FASTER]
    met = not behind and not unjudged and bool(mine) and 2 * len(faster) >= len(mine)
    return {"method": method, "cells": len(mine), "behind": len(behind), "faster": len(faster),
            "unjudged": len(unjudged), "met": met}


def section(scope: Scope) -> Section | None:
    """None when no method has kind eagle3-tuned on this device."""
    if scope.roles.eagle3_tuned is None:
        return None
    cells = [(w, s) for w in scope.workloads
             for s in sorted({r.slots for r in scope.runs_of(w) if r.method == scope.roles.eagle3_tuned}, reverse=True)]
    if not cells:
        return None
    sec = Section(TITLE)
    runs = [r for w, s in cells for r in scope.runs_of(w) if r.slots == s]
    sec.missing += scope.inputs.missing(runs) + scope.inputs.missing_requests(runs)
    emulated = scope.emulated(runs)
    found = {(w, s): cell for w, s in cells if (cell := rows(scope, w, s))}
    flat = [x | {"workload": w, "slots": s} for (w, s), cell in found.items() for x in cell]
    if not flat:
        return sec if sec.missing else None
    m = scope.inputs.metrics
    sec.tables.append(table(scope.id("tuned"), tagged(f"Every method against EAGLE-3 at the hand-tuned tree, "
                                                      f"{scope.model} / {scope.device}", emulated), [
        ("Workload", lambda x: x["workload"]), ("Cache", lambda x: cache_cell(x["slots"])),
        ("Method", lambda x: x["run"].method), ("Kind", lambda x: x["kind"]),
        ("Tree", lambda x: verified_from(scope.inputs, FIXED.get(x["kind"], x["kind"]), x["run"])),
        (tagged("Decode TPS", emulated), lambda x: tps_cell(x["tps"])),
        (tagged("/ tuned tree (×)", emulated), lambda x: "–" if x["tuned"] is None else x_cell(x["tuned"])),
        (tagged("/ best baseline (×)", emulated),
         lambda x: f"best: {x['run'].method}" if x["vs_best"] is None else f"{x_cell(x['vs_best'])} "
                                                                            f"(best: {x['best'].method})"),
        *((tagged(label, emulated) if "ms" in label else label, lambda x, key=key: fmt(m[x["run"]].get(key), ".2f"))
          for label, key in SHOWN)], flat, key=lambda x: (x["workload"], x["slots"], x["run"].method)))
    online = [name for name in scope.spec["methods"] if method_kind(scope.spec, name).name == SPECFIT_ONLINE.name
              and any(x["run"].method == name for x in flat)]
    goals = [judge(list(found.values()), name) for name in online]
    if goals:
        sec.tables.append(table(scope.id("tuned-goal"), tagged(f"The goal of {SPECFIT_ONLINE.name}, {scope.model} / "
                                                               f"{scope.device}", emulated), [
            ("Method", lambda g: g["method"]), ("Cells", lambda g: str(g["cells"])),
            ("Slower than the best baseline", lambda g: str(g["behind"])), ("Not judged", lambda g: str(g["unjudged"])),
            ("Faster than the tuned tree", lambda g: f"{g['faster']} of {g['cells']}"),
            ("Goal met", lambda g: "yes" if g["met"] else "no")], goals, key=lambda g: g["method"]))
    sec.notes += [note("tuned"), interval_note(scope.inputs.seed)]
    return sec
