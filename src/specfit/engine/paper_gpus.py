"""The paper's GPUs as emulated devices: their parameters derived from Tables 2-4, and the proportions they imply.

Per-cycle counters from the tables (each request's output has N = AR cycles / requests tokens):
- prefill copies per request P: AR without the cache copies H2D/token * N, of which L * k per decode cycle;
- union per cycle without the cache: (H2D/token * N - P) / cycles per request; with the cache the same for AR and
  EAGLE-3 (the same trees), and for SpecFit U(n) = U_AR * (1 + n)^a through AR's and EAGLE-3's unions (estimated);
- copies per cycle with the cache: (H2D/token * N - P) / cycles per request;
- drafted levels: 5 for EAGLE-3, Table 5 for SpecFit (the A100's; estimated where borrowed).

docs/device.md walks through the derivation; ``python -m specfit.bench device`` prints it.
"""

from __future__ import annotations

import math

from specfit.engine.device import DeviceModel
from specfit.speculative.kinds import PAPER_KINDS

REQUESTS = {("a100", "summarization"): 40, ("a100", "gsm8k"): 80, ("rtx4090", "gsm8k"): 40}
DERIVED_FROM = {"a100": "summarization", "rtx4090": "gsm8k"}
NAMES = {"a100": "A100", "rtx4090": "RTX 4090"}
METHODS = PAPER_KINDS
MODES = ("cache", "no_cache")


def counts(paper: dict, gpu: str, workload: str) -> dict:
    """Per-cycle counters of every row of one table: {(method, mode): {nodes, levels, union, copies, ms, ...}}."""
    setup = paper["setup"]
    per_token = setup["moe_layers"] * setup["top_k"]  # an AR token's union: 48 * 8
    rows = paper["counters"][gpu][workload]
    requests = REQUESTS[gpu, workload]
    ar0 = rows["ar"]["no_cache"]
    tokens = ar0["cycles"] / requests
    prefill = ar0["h2d_per_token"] * tokens - tokens * per_token
    theory = paper["theory"][workload]

    def per_cycle(row: dict) -> float:
        return (row["h2d_per_token"] * tokens - prefill) / (row["cycles"] / requests)

    union_e3 = per_cycle(rows["eagle3"]["no_cache"])
    exponent = math.log(union_e3 / per_token) / math.log(8)
    out = {}
    for method in METHODS:
        for mode in MODES:
            row = rows[method][mode]
            nodes = row["draft_nodes"] or 0.0
            if method == "ar":
                union, levels = float(per_token), 0.0
            elif method == "eagle3":
                union, levels = union_e3, 5.0
            else:
                union = per_cycle(row) if mode == "no_cache" else per_token * (1 + nodes) ** exponent
                levels = theory["mean_drafted_levels"]
            out[method, mode] = {"nodes": nodes, "levels": levels, "union": union, "ms": row["ms_per_cycle"],
                                 "copies": union if mode == "no_cache" else per_cycle(row),
                                 "estimated": method == "specfit"}
    return out


def predict(model: DeviceModel, c: dict, layers: int) -> float:
    """Modelled ms of one cycle of mean counters: drafting, the verify forward's fixed part and its layers."""
    layer = model.mean_layer_ms(c["union"] / layers, min(c["copies"], c["union"]) / layers)
    return c["levels"] * model.draft_ms + model.fixed(1 + round(c["nodes"])) + layers * layer


def derive(paper: dict, gpu: str) -> dict:
    """A GPU's parameters from its AR and EAGLE-3 rows (docs/device.md). Returns them with the AR step and L * k.

    - drafting: one drafted level is 6.8% of a cached AR step (summarization, A100: SpecFit's 28.5% shorter cycle is
      78.3% verification, the rest a 44.9% cut of EAGLE-3's five levels); the RTX 4090 keeps the share;
    - the fixed part grows by the slope of the with-cache intercepts b_1..b_7 of the A100 (a share of its AR step);
    - copies: what removing the cache adds to AR and EAGLE-3 cycles over their unions (least squares), the cached
      cycle hiding its few copies behind its hits;
    - expert execution and the fixed part: the cached AR and EAGLE-3 cycles, whose unions differ by ~800 experts;
    - the host's selection (``select_ms``, what specfit-ca's D(d) prices one selection at): SpecFit's median selection
      time per cycle on summarization over its mean drafted levels there (one selection after each level, Section 4.6
      and Table 5); the paper times it on the A100's host only, and the RTX 4090 keeps it.
    """
    setup, claims = paper["setup"], paper["text_claims"]["summarization"]
    per_token = setup["moe_layers"] * setup["top_k"]
    c = counts(paper, gpu, DERIVED_FROM[gpu])
    ar, e3 = c["ar", "cache"]["ms"], c["eagle3", "cache"]["ms"]
    a100 = paper["counters"]["a100"]["summarization"]
    saving = a100["eagle3"]["cache"]["ms_per_cycle"] - a100["specfit"]["cache"]["ms_per_cycle"]
    level_share = (1 - claims["verification_share_of_saving_pct"] / 100) * saving / (
        claims["drafting_time_cut_pct"] / 100) / 5 / a100["ar"]["cache"]["ms_per_cycle"]
    b = paper["coefficients_ms"]["a100"]["cache"]["b"]
    token_share = (b[7] - b[1]) / 6 / a100["ar"]["cache"]["ms_per_cycle"]
    draft_ms, token_ms = level_share * ar, token_share * ar
    gaps = [(c[m, "no_cache"]["ms"] - c[m, "cache"]["ms"], c[m, "no_cache"]["union"]) for m in ("ar", "eagle3")]
    copy_ms = sum(d * u for d, u in gaps) / sum(u * u for _, u in gaps)
    u_ar, u_e3 = c["ar", "cache"]["union"], c["eagle3", "cache"]["union"]
    expert_ms = (e3 - 5 * draft_ms - 7 * token_ms - ar) / (u_e3 - u_ar)
    select_ms = (paper["selection_cost"]["median_ms_per_cycle"]["summarization"]
                 / paper["theory"]["summarization"]["mean_drafted_levels"])
    return {"name": NAMES[gpu], "fixed_ms": ar - u_ar * expert_ms, "token_ms": token_ms, "expert_ms": expert_ms,
            "copy_ms": copy_ms, "draft_ms": draft_ms, "select_ms": select_ms, "ar_step_ms": ar,
            "experts_per_token": per_token}


def check(paper: dict) -> list[dict]:
    """Every row of Tables 2-4: the paper's ms per cycle and the model's, with the error."""
    layers = paper["setup"]["moe_layers"]
    rows = []
    for gpu, workload in REQUESTS:
        params = derive(paper, gpu)
        model = DeviceModel.from_spec(params)
        for (method, mode), c in counts(paper, gpu, workload).items():
            ms = predict(model, c, layers)
            rows.append({"gpu": gpu, "workload": workload, "method": method, "mode": mode, "paper_ms": c["ms"],
                         "model_ms": ms, "error": ms / c["ms"] - 1, "union": c["union"], "copies": c["copies"],
                         "estimated": c["estimated"],
                         "fitted": workload == DERIVED_FROM[gpu] and method != "specfit"})
    return rows


# The toy's proportions on an emulated device beside the paper's: key and label (`proportion_met` holds the goals).
PROPORTIONS = (
    ("ar_nocache_over_cache", "AR ms per cycle, without / with the cache"),
    ("e3_over_ar_cache", "EAGLE-3 / AR ms per cycle, with the cache"),
    ("e3_over_ar_nocache", "EAGLE-3 / AR ms per cycle, without the cache"),
    ("level_share", "one drafted level / cached AR cycle"),
    ("execution_share", "expert execution / cached AR cycle"),
    ("copy_share", "expert copies (link busy) / cached AR cycle"),
)
TOLERANCE = 0.15  # each ratio within ±15% of the paper's; a drafted level within 5-10% of a cached AR step
LEVEL_SHARE_RANGE = (0.05, 0.10)


def paper_proportions(paper: dict, workload: str, gpu: str = "a100") -> dict:
    """A GPU's proportions on ``workload`` (Tables 2-4), with the derived device's shares of a cached AR step."""
    c = counts(paper, gpu, workload)
    params = derive(paper, gpu)
    ar, ar0 = c["ar", "cache"]["ms"], c["ar", "no_cache"]["ms"]
    return {
        "ar_nocache_over_cache": ar0 / ar,
        "e3_over_ar_cache": c["eagle3", "cache"]["ms"] / ar,
        "e3_over_ar_nocache": c["eagle3", "no_cache"]["ms"] / ar0,
        "level_share": params["draft_ms"] / ar,
        "execution_share": c["ar", "cache"]["union"] * params["expert_ms"] / ar,
        "copy_share": c["ar", "cache"]["copies"] * params["copy_ms"] / ar,
    }


def run_proportions(ar: dict, ar0: dict, e3: dict, e30: dict, emulate: dict) -> dict:
    """The same proportions from four decode runs' metrics.json (AR and EAGLE-3, with and without the cache) on an
    emulated device (its ``emulate`` entry): measured ratios, and the device's expert and copy time per AR cycle
    (``experts_per_token`` experts executed, ``h2d_per_cycle`` copied) over the measured cached AR cycle."""
    ms = ar["ms_per_cycle"]
    return {
        "ar_nocache_over_cache": ar0["ms_per_cycle"] / ms,
        "e3_over_ar_cache": e3["ms_per_cycle"] / ms,
        "e3_over_ar_nocache": e30["ms_per_cycle"] / ar0["ms_per_cycle"],
        "level_share": e3["draft_ms_per_cycle"] / e3["drafted_levels_per_cycle"] / ms,
        "execution_share": ar["experts_per_token"] * emulate["expert_ms"] / ms,
        "copy_share": ar["h2d_per_cycle"] * emulate["copy_ms"] / ms,
    }


def proportion_met(key: str, toy: float, paper: float) -> bool | None:
    """Whether a toy proportion meets its goal: ratios within ±15% of the paper's, a drafted level 5-10% of a cached
    AR cycle; the two shares of a cached AR cycle are shown beside the paper's, without a goal (None)."""
    if key == "level_share":
        return LEVEL_SHARE_RANGE[0] <= toy <= LEVEL_SHARE_RANGE[1]
    if key in ("execution_share", "copy_share"):
        return None
    return abs(toy / paper - 1) <= TOLERANCE
