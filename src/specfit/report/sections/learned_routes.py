"""Beyond the paper: learned routes (``routes: learned``). Per cell (workload × slots) of a learned-route
run: SpecFit with exact (``atlas``), learned and simulated noisy routes beside EAGLE-3, judged against its
goals (route accuracy ≥ 60%; decode TPS ≥ 98% of exact routes, a tie counts; faster than EAGLE-3 wherever exact
routes are, a tie does not; the predictor ≤ 5% of a cycle); then the predictor at this model's size and at the
paper's model's, beside the paper's estimate (section 4.6)."""

from specfit.planning.matrix import DecodeRun, method_config
from specfit.report.inputs import Inputs, methods_with, predictor_metrics
from specfit.report.page import MISSING, Section, Table, cache_cell, fmt, interval_note, note, notes, table, tagged
from specfit.report.quantities import METRICS, ROUTE_PREDICTOR, column, tps_cell, x_cell
from specfit.report.scope import Cell, Scope
from specfit.report.verdict import Outcome, Verdict, at_least, judged, not_judged, overall
from specfit.speculative.kinds import EAGLE3, SPECFIT
from specfit.speculative.routes import predictor_cost

TITLE = "Beyond the paper: learned routes"
ACCURACY_GOAL = 0.60  # held-out route accuracy of the predictor
TPS_GOAL = 0.98  # learned / exact-route SpecFit decode TPS (a tie within the interval counts)
SHARE_GOAL_PCT = 5.0  # the predictor's share of the decode cycles' time
PAPER_MODEL = "Qwen3-30B-A3B"  # the paper's model: the size at which it estimates its predictor (section 4.6)
PAPER_SIZE = {"hidden_size": 2048, "num_layers": 48, "num_experts": 128}


def pct(value, spec: str = ".1f") -> str:
    return MISSING if value is None else f"{100.0 * value:{spec}}%"


def millions(n: float) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e5 else f"{n / 1e6:.2g}M"


def share_pct(m: dict | None) -> float | None:
    """The predictor's share of a learned-route run's cycle time (%), from its metrics.json."""
    return ((m or {}).get(ROUTE_PREDICTOR) or {}).get("share_of_cycle_time_pct")


def ms_per_cycle(m: dict | None) -> float | None:
    """The predictor's time per decode cycle (ms): its seconds over the run's cycles."""
    seconds = ((m or {}).get(ROUTE_PREDICTOR) or {}).get("seconds")
    return None if seconds is None or not m.get("cycles") else 1e3 * seconds / m["cycles"]


def judge(inputs: Inputs, c: Cell) -> None:
    """The cell's ratios, and its verdict on goals 2-4."""
    learned, atlas, eagle, metrics = c.runs["learned"], c.runs["atlas"], c.runs[EAGLE3.name], inputs.metrics
    c.ratios = {"atlas": inputs.speedup(learned, atlas), "atlas/eagle3": inputs.speedup(atlas, eagle),
                EAGLE3.name: inputs.speedup(learned, eagle)}
    e = c.ratios["atlas"]  # learned at least TPS_GOAL of exact routes; a tie counts as met
    if e is None or e.verdict is None:
        c.goals["tps"] = not_judged([learned, atlas], metrics, "exact-route")
    else:
        c.goals["tps"] = (Outcome(Verdict.MET, "tie within the interval", Verdict.TIE) if e.verdict == Verdict.TIE
                          else at_least(e.value, TPS_GOAL))
    e = c.ratios["atlas/eagle3"]  # faster than EAGLE-3 where exact routes are; a tie does not count
    if e is None or e.verdict is None:
        c.goals[EAGLE3.name] = not_judged([atlas, eagle], metrics, "exact-route or EAGLE-3")
    elif e.verdict != Verdict.FASTER:
        c.goals[EAGLE3.name] = Outcome(Verdict.NOT_REQUIRED, "exact routes slower than EAGLE-3"
                                    if e.verdict == Verdict.SLOWER else "exact routes tie with EAGLE-3", e.verdict)
    else:
        o = judged(c.ratios[EAGLE3.name], (Verdict.FASTER,), [learned, eagle], metrics, "EAGLE-3")
        c.goals[EAGLE3.name] = Outcome(o.verdict, str(o.basis), o.basis) if o.verdict == Verdict.MISSED else o
    share = share_pct(metrics.get(learned))  # the predictor's share of a cycle at most SHARE_GOAL_PCT
    c.goals["share"] = (Outcome(Verdict.NOT_JUDGED, "no metrics.json") if learned not in metrics
                        else Outcome(Verdict.NOT_JUDGED, f"its metrics.json has no {ROUTE_PREDICTOR}") if share is None
                        else at_least(SHARE_GOAL_PCT, share))


def goal_notes(scope: Scope, cells: list[Cell], predictor: dict | None, emulated: bool, atlas: str, eagle: str
               ) -> list[str]:
    """The verdict on its four goals together, then on each (worded in templates/notes.j2). Goal 1 is the
    predictor's; goals 2-4 hold over the cells when every cell that requires one meets it."""
    states = [Verdict.NOT_JUDGED if predictor is None else at_least(predictor["route_accuracy"], ACCURACY_GOAL).verdict,
              *(overall([c.goals[key] for c in cells]).verdict for key in ("tps", EAGLE3.name, "share"))]
    shares = [x for c in cells if (x := share_pct(scope.inputs.metrics.get(c.runs["learned"]))) is not None]
    return notes("learned_goals", model=scope.model, device=scope.device, states=states, p=predictor, pct=pct,
                 which={verdict: [j + 1 for j, state in enumerate(states) if state == verdict]
                        for verdict in (Verdict.MISSED, Verdict.NOT_JUDGED)},
                 path=predictor_metrics(scope.model), low=predictor and [
                     j for j, r in enumerate(predictor["recall_per_layer"]) if r < ACCURACY_GOAL],
                 cells=cells, goal=f"{100 * ACCURACY_GOAL:.0f}", tps_goal=f"{100 * TPS_GOAL:.0f}",
                 share_goal=f"{SHARE_GOAL_PCT:g}", atlas=atlas, eagle=eagle,
                 ties=sum(c.goals["tps"].basis == Verdict.TIE for c in cells),
                 required=sum(c.goals[EAGLE3.name].verdict != Verdict.NOT_REQUIRED for c in cells),
                 largest=tagged(f"; largest share {max(shares):.2f}%", emulated) if shares else "")


def section(scope: Scope) -> Section | None:
    """None when no method has ``routes: learned`` or none runs on this device."""
    inputs, cells = scope.inputs, []
    kinds = (SPECFIT.name,)  # the paper's SpecFit (the cache-aware and prefetching: sections.specfit_ca, .prefetch)
    noisy = {("noisy", m): m for m in methods_with(scope.spec, kinds, "noisy")}
    for method in methods_with(scope.spec, kinds, "learned"):
        cells += scope.cells(method, {"atlas": scope.roles.specfit, "learned": method, **noisy,
                                      EAGLE3.name: scope.roles.eagle3})
    if not cells:
        return None
    sec = Section(TITLE)
    keys = [r for c in cells for r in c.runs.values() if r is not None]
    predictor = inputs.predictor.get(scope.model)
    sec.missing += inputs.missing(keys) + inputs.missing_requests(keys)
    sec.missing += [] if predictor else [predictor_metrics(scope.model)]
    emulated = scope.emulated(keys)
    for c in cells:
        judge(inputs, c)

    def routes(role, run):  # a run's routes and their accuracy, by its role in the cell
        if isinstance(role, tuple):  # ("noisy", method)
            return "noisy (simulated)", f"{pct(method_config(scope.spec, run.method).accuracy, '.0f')} (configured)"
        return {"atlas": ("exact (atlas)", "100% (exact)"), EAGLE3.name: ("none (full draft tree)", MISSING),
                "learned": ("learned", MISSING if predictor is None
                            else f"{pct(predictor['route_accuracy'])} (held-out)")}[role]

    rows = [(c, r, *routes(role, r)) for c in cells for role, r in c.runs.items() if r is not None]
    atlas = next((c.runs["atlas"].method for c in cells if c.runs["atlas"] is not None), None) or "exact routes"
    eagle, learned = scope.roles.eagle3 or "EAGLE-3", cells[0].runs["learned"].method

    def per_cycle(key):
        return METRICS[key].label + " per cycle", lambda x: fmt((inputs.metrics.get(x[1]) or {}).get(key), ".2f")

    def share(run):
        return fmt(share_pct(inputs.metrics.get(run)), ".2f")

    share_header = tagged("Predictor share of cycle time (%)", emulated)
    sec.tables.append(table(scope.id("learned-routes"),
                            tagged(f"Exact vs learned vs simulated noisy routes, {scope.model} "
                                                           f"/ {scope.device}", emulated), [
        ("Workload", lambda x: x[0].workload), ("Cache", lambda x: cache_cell(x[0].slots)),
        ("Method", lambda x: x[1].method), ("Routes", lambda x: x[2]), ("Route accuracy", lambda x: x[3]),
        per_cycle("draft_nodes_per_cycle"), per_cycle("committed_per_cycle"),
        (column("tps_dec", emulated), lambda x: tps_cell(inputs.tps(x[1]))),
        (tagged(f"/ {atlas} (×)", emulated), lambda x: MISSING if x[1] in (x[0].runs["atlas"], x[0].runs[EAGLE3.name])
         else x_cell(inputs.speedup(x[1], x[0].runs["atlas"]))),
        (share_header, lambda x: share(x[1]) if x[1] == x[0].runs["learned"] else MISSING)], rows, key=lambda x: x[1]))
    sec.tables.append(table(scope.id("learned-routes-goals"), tagged(f"{learned} against their goals per cell, "
                                                                 f"{scope.model} / {scope.device}", emulated), [
        ("Workload", lambda c: c.workload), ("Cache", lambda c: cache_cell(c.slots)),
        (tagged(f"{learned} / {atlas} (×)", emulated), lambda c: x_cell(c.ratios["atlas"])),
        (f"≥ {100 * TPS_GOAL:.0f}% of {atlas}", lambda c: c.goals["tps"].answer()),
        (tagged(f"{atlas} / {eagle} (×)", emulated), lambda c: x_cell(c.ratios["atlas/eagle3"])),
        (tagged(f"{learned} / {eagle} (×)", emulated), lambda c: x_cell(c.ratios[EAGLE3.name])),
        (f"Faster than {eagle} where {atlas} is", lambda c: c.goals[EAGLE3.name].answer()),
        (share_header, lambda c: share(c.runs["learned"])),
        (f"≤ {SHARE_GOAL_PCT:g}% of a cycle", lambda c: c.goals["share"].answer())], cells,
        key=lambda c: (c.workload, c.slots)))
    sec.notes += [note("learned_routes", learned=learned), *goal_notes(scope, cells, predictor, emulated, atlas, eagle),
                  interval_note(inputs.seed)]
    if predictor is not None:
        predictor_table(scope, sec, predictor, [c.runs["learned"] for c in cells], emulated)
    return sec


def predictor_table(scope: Scope, sec: Section, p: dict, learned: list[DecodeRun], emulated: bool) -> None:
    """The predictor (``p``: its metrics.json) beside its cost at the paper's model's size and the paper's estimate;
    ``learned``: the runs that used it on this device."""
    big = predictor_cost(**PAPER_SIZE)
    paper = scope.inputs.paper.get("route_prediction", {})
    head = paper.get("linear_head_predictor", {})
    paper_params, paper_mflop, paper_ms = (head.get(k) for k in ("params_millions", "mflop_per_node",
                                                                 "added_ms_per_cycle"))
    per_cycle = [x for x in (ms_per_cycle(scope.inputs.metrics.get(r)) for r in learned) if x is not None]
    device, t, big_mflop = p["torch_device"], p["training"], big["flop_per_node"] / 1e6
    rows = [  # key, quantity, this model's, at the paper model's size, the paper's estimate (a dash where not given)
        ("route_accuracy", "Held-out route accuracy (draft nodes, mean over layers)", pct(p["route_accuracy"]), MISSING,
         MISSING if paper.get("accuracy_pct") is None else f"{paper['accuracy_pct']:g}% (simulated predictor)"),
        ("recall_per_layer", "Held-out recall per MoE layer",
         ", ".join(f"{j}: {pct(r)}" for j, r in enumerate(p["recall_per_layer"]))),
        ("root_accuracy", "Held-out accuracy of the root's routes", pct(p["root_accuracy"])),
        ("train_accuracy", "Training accuracy", pct(p["train_accuracy"])),
        ("chance_accuracy", "Chance accuracy (top-k of the experts)", pct(p["chance_accuracy"])),
        ("params", "Parameters", f"{p['params']:,} ({millions(p['params'])})",
         f"{big['params']:,} ({millions(big['params'])})", MISSING if paper_params is None else f"{paper_params:g}M"),
        ("flop_per_node", "FLOP per node", f"{p['flop_per_node']:,} ({p['flop_per_node'] / 1e6:.3g} MFLOP)",
         f"{big['flop_per_node']:,} ({big_mflop:.3g} MFLOP)",
         MISSING if paper_mflop is None else f"{paper_mflop:g} MFLOP"),
        ("us_per_pool", f"µs per pool of {p['pool_nodes_timed']} nodes (on {device}: compute only, no link)",
         fmt(p["us_per_pool"], ".1f")),
        ("ms_per_cycle", tagged(f"Predictor ms per decode cycle in the {scope.device} runs", emulated),
         MISSING if not per_cycle else f"{min(per_cycle):.3f}" if len(per_cycle) == 1
         else f"{min(per_cycle):.3f} – {max(per_cycle):.3f}",
         MISSING, MISSING if not paper_ms else "–".join(f"{x:g}" for x in paper_ms) + " (added ms per cycle)"),
        ("training", "Training", f"{t['steps']} steps, {t['seconds']:.1f} s on {device} ({t.get('threads', '?')} "
         f"threads), final loss {t['loss']:.3f}; {p['train_requests']} requests ({p['train_nodes']:,} pool nodes), "
         f"{p['validation_requests']} held out ({p['validation_nodes']:,} draft nodes)")]
    size = f"hidden {p['hidden_size']}, {p['num_layers']} MoE layers, {p['num_experts']} experts, top-{p['top_k']}"
    big_size = ", ".join(f"{PAPER_SIZE[k]} {what}" for k, what in (("num_layers", "MoE layers"),
                                                                   ("num_experts", "experts")))
    sec.tables.append(Table(
        scope.id("route-predictor"),
        f"The route predictor of {scope.model} ({predictor_metrics(scope.model)}), and its cost at "
        f"{PAPER_MODEL}'s size", ["Quantity", f"{scope.model} ({size})", f"At {PAPER_MODEL}'s size (hidden "
                                  f"{PAPER_SIZE['hidden_size']}, {big_size})", "Paper's estimate (section 4.6)"],
        [[*row[1:], *[MISSING] * (5 - len(row))] for row in rows], [row[0] for row in rows]))
    versus = f"{big['params'] / (paper_params * 1e6):.1f}" if paper_params and paper_mflop else ""
    sec.notes.append(note("route_predictor", paper_model=PAPER_MODEL, params=millions(big["params"]),
                          mflop=f"{big_mflop:.3g}", versus=versus, paper_params=f"{paper_params:g}" if versus else "",
                          paper_mflop=f"{paper_mflop:g}" if versus else "", device=device, run_device=scope.device,
                          emulated=emulated))
