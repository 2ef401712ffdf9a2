"""One model's runs on every device beside the paper's figures for the GPU the device stands for: Table 4's cells and
the paper's headline ratios, computed by the same code from the paper's tables and from this run."""

from specfit.report.page import Section, fmt, interval_note, note, ratio, show, table, tagged
from specfit.report.paper_figures import CELLS, headline
from specfit.report.quantities import tps_cell, x_cell
from specfit.report.scope import ModelScope


def section(model_scope: ModelScope) -> Section | None:
    """None when no device stands for one of the paper's GPUs (resident devices alone)."""
    inputs = model_scope.inputs
    if all(scope.gpu is None for scope in model_scope.on.values()):
        return None
    sec = Section("The paper's headline figures beside this run's")
    sec.notes += [note("headline_miniature"), note("headline_ratios")]
    mapping = ", ".join(f"{d} ↔ {inputs.paper['setup']['devices'][scope.gpu]['name']}" for d,
                        scope in model_scope.on.items() if scope.gpu is not None)  # a resident device: none
    sec.notes.append(f"Devices are mapped by name, label or order: {mapping}.")
    standing = []
    for d, scope in model_scope.on.items():
        for pw, w in scope.stand_ins.items():
            paper = scope.paper.cells(pw)
            if paper is None:
                continue
            if w != pw:
                standing.append(f"{w} on {d} for the paper's {pw}")
            tables(model_scope, sec, d, pw, w, paper)
    if standing:
        sec.notes.append("Workloads are mapped by their config key `paper`: " + "; ".join(standing) + ".")
    if sec.tables:
        sec.notes.append(interval_note(inputs.seed) + " The paper's figures carry no interval.")
    return sec


def tables(model_scope: ModelScope, sec: Section, d: str, pw: str, w: str, paper: dict) -> None:
    """Table 4's cells and the headline ratios of one device's workload beside the paper's."""
    inputs, scope = model_scope.inputs, model_scope.on[d]
    key = scope.paper_runs(w)
    run = {k: inputs.metrics.get(r) or {} for k, r in key.items()}
    sec.missing += inputs.missing_requests(key.values())
    name, emulated = w if w == pw else f"{w} (paper: {pw})", scope.link_emulated
    ar = paper["ar", "nocache"]["tps_dec"]
    sec.tables.append(table(model_scope.id("paper", d, w), tagged(f"{d} vs paper {scope.gpu}, {name}", emulated), [
        ("Method", lambda c: c[0]), ("Cache", lambda c: "Yes" if c[1] == "cache" else "No"),
        ("Paper Decode TPS", lambda c: fmt(paper[c]["tps_dec"], ".2f")),
        (tagged("This run Decode TPS", emulated), lambda c: tps_cell(inputs.tps(key[c]))),
        ("Paper speedup", lambda c: x_cell(ratio(paper[c]["tps_dec"], ar))),
        (tagged("This run speedup", emulated), lambda c: x_cell(inputs.speedup(key[c], key["ar", "nocache"]))),
        ("Paper ms/cycle", lambda c: fmt(paper[c].get("ms_per_cycle"), ".1f")),
        (tagged("This run ms/cycle", emulated), lambda c: fmt(run[c].get("ms_per_cycle"), ".1f")),
        ("Paper H2D/token", lambda c: fmt(paper[c].get("h2d_per_token"), ".1f")),
        ("This run H2D/token", lambda c: fmt(run[c].get("h2d_per_token"), ".1f"))], CELLS))
    # the text's own figure where it states one (computed from rounded table values it can differ)
    claims = scope.paper.claims(pw)
    ratios = headline({k: inputs.metrics.get(r) for k, r in key.items()},
                      lambda a, b: inputs.speedup(key[a], key[b]), lambda a, b: inputs.request_speedup(key[a], key[b]))
    sec.tables.append(table(model_scope.id("headline", d, w),
                            tagged(f"Headline ratios, {d} vs paper {scope.gpu}, {name}",
                                                           emulated), [
        ("Quantity", lambda h: h[0]), ("Paper", lambda h: fmt(claims.get(h[1]), h[3])),
        (tagged("This run", emulated), lambda h: show(h[2], h[3], "×" if h[0].endswith("(×)") else ""))],
        ratios, key=lambda h: h[1]))
