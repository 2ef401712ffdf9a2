"""The cache-size sweep (Figure 4): EAGLE-3 and SpecFit at each slot count, their cycle time and transfers, and the
paper's Figure 4 beside on the workload that stands for its summarization on the A100."""

from specfit.report.figures import slug, sweep_panels
from specfit.report.page import Section, fmt, interval_note, note, pct_less, pct_more, table, tagged
from specfit.report.quantities import TOKENS_PER_TRANSFER, column, gain_cell, tokens_per_transfer, tps_cell
from specfit.report.scope import Scope, slot_order


def section(scope: Scope) -> Section | None:
    """None on a resident device: it holds every expert, there is no cache size to sweep."""
    if scope.resident:
        return None
    sec = Section("Cache-size sweep (Figure 4)")
    a, b = pair = (scope.roles.eagle3, scope.roles.specfit)
    for w in scope.workloads:
        workload(scope, sec, w, pair)
    if sec.tables:
        sec.notes.append(interval_note(scope.inputs.seed))
        sec.notes.append(note("sweep_tokens_per_transfer", tokens_per_transfer=TOKENS_PER_TRANSFER))
    elif not sec.missing:
        sec.notes.append(f"No workload has at least three slot values for both {a} and {b}.")
    return sec


def workload(scope: Scope, sec: Section, w: str, pair: tuple[str, str]) -> None:
    a, b = pair
    slots = {m: {r.slots for r in scope.runs_of(w) if r.method == m} for m in pair if m}
    if len(slots) < 2 or min(len(x) for x in slots.values()) < 3:
        return
    common = slot_order(slots[a] & slots[b])
    runs = {(k, x): scope.run(w, k, x) for k in pair for x in common}
    present, emulated = scope.present(sec, list(runs.values()))
    if not present:
        return
    sec.missing += scope.inputs.missing_requests(runs.values())
    m = {k: scope.inputs.metrics.get(r) or {} for k, r in runs.items()}
    tps = {k: scope.inputs.tps(r) for k, r in runs.items()}
    per = {k: tokens_per_transfer(m[k] or None) for k in runs}
    paper = scope.paper.sweep(scope.paper_key(w), len(common))
    rank = {x: j for j, x in enumerate(common)}  # Figure 4's slot counts matched to this run's by rank

    def both(header, cell, timed=True):  # a column per method of the pair
        return [(tagged(f"{k} {header}", timed and emulated), lambda x, k=k: cell(k, x)) for k in pair]

    def paper_both(header, key, spec=".1f"):  # the paper's figure for each method at the slot count of the same rank
        return [(f"Paper {name} {header}", lambda x, k=k: fmt(paper[key][k][rank[x]], spec))
                for k, name in (("eagle3", "EAGLE-3"), ("specfit", "SpecFit"))]

    def stated(x):  # the text's advantage where it states one, else computed from Figure 4b
        h2d = paper["h2d_per_token"]
        value = paper["tokens_per_transfer_advantage_pct"][rank[x]]
        return fmt(value if value is not None else pct_more(h2d["eagle3"][rank[x]], h2d["specfit"][rank[x]]), ".1f")

    by = [("Paper slots (A100, by rank)", lambda x: str(paper["slots"][rank[x]]))]
    paper_tps = [*by, *paper_both("Decode TPS", "decode_tps", ".2f"),
                 ("Paper gain (%)", lambda x: fmt(paper["specfit_gain_pct"][rank[x]], ".1f"))] if paper else []
    paper_cost = [*by, *paper_both("ms/cycle", "ms_per_cycle"), ("Paper cycle shorter (%)", lambda x: fmt(
        pct_less(paper["ms_per_cycle"]["specfit"][rank[x]], paper["ms_per_cycle"]["eagle3"][rank[x]]), ".1f")),
                  *paper_both("H2D/token", "h2d_per_token"),
                  ("Paper tokens per transfer over EAGLE-3 (%)", stated)] if paper else []
    sec.tables.append(table(scope.id("sweep", w), tagged(f"Slot sweep, {scope.title(w)} (0 = no cache)", emulated), [
        ("Slots", str), *both("Decode TPS", lambda k, x: tps_cell(tps[k, x])),
        (tagged(f"{b} gain over {a} (%)", emulated), lambda x: gain_cell(scope.inputs.speedup(runs[b, x], runs[a, x]))),
        *paper_tps], common))
    sec.tables.append(table(scope.id("sweep-cost", w), tagged(f"Cycle time and transfers per slot count, "
                                                          f"{scope.title(w)} (0 = no cache)", emulated), [
        ("Slots", str), *both("ms/cycle", lambda k, x: fmt(m[k, x].get("ms_per_cycle"), ".1f")),
        (tagged(f"{b} cycle shorter (%)", emulated),
         lambda x: fmt(pct_less(m[b, x].get("ms_per_cycle"), m[a, x].get("ms_per_cycle")), ".1f")),
        *both("H2D/token", lambda k, x: fmt(m[k, x].get("h2d_per_token"), ".1f"), timed=False),
        *both(TOKENS_PER_TRANSFER, lambda k, x: fmt(per[k, x], ".4f"), timed=False),
        (f"{b} tokens per transfer over {a} (%)", lambda x: fmt(pct_more(per[b, x], per[a, x]), ".1f")),
        *paper_cost], common))
    panels = [(column("tps_dec", emulated), {k: [tps[k, x] for x in common] for k in pair}),
              (column("ms_per_cycle", emulated), {k: [m[k, x].get("ms_per_cycle") for x in common] for k in pair}),
              (column("h2d_per_token", False), {k: [m[k, x].get("h2d_per_token") for x in common] for k in pair}),
              (TOKENS_PER_TRANSFER, {k: [per[k, x] for x in common] for k in pair})]
    fig = sweep_panels(panels, common, tagged(f"{scope.model} / {scope.device} / {w}: (a) decode TPS, (b) ms/cycle, "
                                               "H2D/token and tokens per transfer vs slots", emulated))
    sec.figures.append(scope.figures.save(fig, slug(scope.model, scope.device, w, "sweep"),
                                      tagged(f"Slot sweep, {scope.title(w)}", emulated)))
