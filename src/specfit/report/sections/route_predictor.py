"""The learned route predictor of a model, in the learned-routes section: its held-out recall per layer, accuracy,
size, cost and time, beside its cost at the paper's model's size and the paper's estimate (section 4.6)."""

from specfit.report.inputs import predictor_metrics
from specfit.report.page import EMULATED, MISSING, Section, Table, fmt, tagged
from specfit.report.quantities import ROUTE_PREDICTOR
from specfit.report.scope import Scope
from specfit.speculative.routes import predictor_cost
from specfit.workflow import DecodeRun

# Qwen3-30B-A3B, the paper's model: the size at which the paper estimates its predictor (Section 4.6)
PAPER_MODEL = "Qwen3-30B-A3B"
PAPER_SIZE = {"hidden_size": 2048, "num_layers": 48, "num_experts": 128}


def pct(value, spec: str = ".1f") -> str:
    return MISSING if value is None else f"{100.0 * value:{spec}}%"


def count(n: int) -> str:
    return f"{n:,}"


def millions(n: float) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e5 else f"{n / 1e6:.2g}M"


def share_pct(m: dict | None) -> float | None:
    rp = None if m is None else m.get(ROUTE_PREDICTOR)
    return None if rp is None else rp.get("share_of_cycle_time_pct")


def ms_per_cycle(m: dict | None) -> float | None:
    """The predictor's time per decode cycle (ms): its seconds over the run's cycles."""
    rp = None if m is None else m.get(ROUTE_PREDICTOR)
    if rp is None or rp.get("seconds") is None or not m.get("cycles"):
        return None
    return 1e3 * rp["seconds"] / m["cycles"]


def predictor_table(s: Scope, sec: Section, p: dict, learned: list[DecodeRun], emulated: bool) -> None:
    """``p``: the predictor's metrics.json; ``learned``: the runs that used it on this device."""
    big = predictor_cost(**PAPER_SIZE)
    paper = s.i.paper.get("route_prediction", {})
    head = paper.get("linear_head_predictor", {})
    paper_params, paper_mflop, paper_ms = (head.get("params_millions"), head.get("mflop_per_node"),
                                           head.get("added_ms_per_cycle"))
    device, t = p["torch_device"], p["training"]
    per_cycle = [x for x in (ms_per_cycle(s.i.metrics.get(r)) for r in learned) if x is not None]
    rows = {  # key: quantity, this model's, at the paper model's size, the paper's estimate
        "route_accuracy": ["Held-out route accuracy (draft nodes, mean over layers)", pct(p["route_accuracy"]),
                           MISSING, MISSING if paper.get("accuracy_pct") is None
                           else f"{paper['accuracy_pct']:g}% (simulated predictor)"],
        "recall_per_layer": ["Held-out recall per MoE layer", ", ".join(
            f"{j}: {pct(r)}" for j, r in enumerate(p["recall_per_layer"])), MISSING, MISSING],
        "root_accuracy": ["Held-out accuracy of the root's routes", pct(p["root_accuracy"]), MISSING, MISSING],
        "train_accuracy": ["Training accuracy", pct(p["train_accuracy"]), MISSING, MISSING],
        "chance_accuracy": ["Chance accuracy (top-k of the experts)", pct(p["chance_accuracy"]), MISSING, MISSING],
        "params": ["Parameters", f"{count(p['params'])} ({millions(p['params'])})",
                   f"{count(big['params'])} ({millions(big['params'])})",
                   MISSING if paper_params is None else f"{paper_params:g}M"],
        "flop_per_node": ["FLOP per node", f"{count(p['flop_per_node'])} ({p['flop_per_node'] / 1e6:.3g} MFLOP)",
                          f"{count(big['flop_per_node'])} ({big['flop_per_node'] / 1e6:.3g} MFLOP)",
                          MISSING if paper_mflop is None else f"{paper_mflop:g} MFLOP"],
        "us_per_pool": [f"µs per pool of {p['pool_nodes_timed']} nodes (on {device}: compute only, no link)",
                        fmt(p["us_per_pool"], ".1f"), MISSING, MISSING],
        "ms_per_cycle": [tagged(f"Predictor ms per decode cycle in the {s.device} runs", emulated),
                         MISSING if not per_cycle else (f"{min(per_cycle):.3f}" if len(per_cycle) == 1
                                                        else f"{min(per_cycle):.3f} – {max(per_cycle):.3f}"),
                         MISSING, MISSING if not paper_ms else "–".join(f"{x:g}" for x in paper_ms)
                         + " (added ms per cycle)"],
        "training": ["Training", (f"{t['steps']} steps, {t['seconds']:.1f} s on {device} ({t.get('threads', '?')} "
                                  f"threads), final loss {t['loss']:.3f}; {p['train_requests']} requests "
                                  f"({count(p['train_nodes'])} pool nodes), {p['validation_requests']} held out "
                                  f"({count(p['validation_nodes'])} draft nodes)"), MISSING, MISSING],
    }
    size = f"hidden {p['hidden_size']}, {p['num_layers']} MoE layers, {p['num_experts']} experts, top-{p['top_k']}"
    big_size = (f"hidden {PAPER_SIZE['hidden_size']}, {PAPER_SIZE['num_layers']} MoE layers, "
                f"{PAPER_SIZE['num_experts']} experts")
    sec.tables.append(Table(
        s.id("route-predictor"), f"The route predictor of {s.model} ({predictor_metrics(s.model)}), and its cost at "
        f"{PAPER_MODEL}'s size", ["Quantity", f"{s.model} ({size})", f"At {PAPER_MODEL}'s size ({big_size})",
                                  "Paper's estimate (section 4.6)"], list(rows.values()), list(rows)))
    note = (f"The predictor is one linear router per MoE layer over a node's hidden state and its token's embedding "
            f"(2 × hidden inputs). At {PAPER_MODEL}'s size that is {millions(big['params'])} parameters and "
            f"{big['flop_per_node'] / 1e6:.3g} MFLOP per node")
    if paper_params and paper_mflop:
        note += (f", {big['params'] / (paper_params * 1e6):.1f}× the paper's estimate of a linear head from the "
                 f"hidden state alone ({paper_params:g}M parameters, {paper_mflop:g} MFLOP per node, section 4.6): "
                 "the token's embedding doubles its inputs")
    note += (f". Its µs per pool is plain {device} compute, timed apart from any link (the {s.device} runs' link "
             f"is {'emulated' if emulated else 'real'}); its ms per decode cycle is measured inside those runs"
             + (f" and labelled “{EMULATED}”." if emulated else "."))
    sec.notes.append(note)
