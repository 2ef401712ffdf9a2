"""``python -m specfit.bench device``: the emulated device's cost model against the hardware it stands for.

Derives a GPU's parameters (:class:`specfit.device.DeviceModel`) from the paper's AR and EAGLE-3 rows of one
workload (A100: summarization, Table 2; RTX 4090: GSM8K, Table 4), feeds the model the per-cycle counters of every
row of Tables 2-4 (nodes, drafted levels, expert union and copies per cycle), and prints its predicted ms per cycle
beside the paper's, with the error per cell. Then prints the toy's parameters for a cached AR step of
``--step-ms`` on the A100 (the one scaling rule, :func:`specfit.device.scaled`), the numbers config.yaml's emulated
devices carry. docs/device.md walks through the derivation.

Per-cycle counters from the tables (each request's output has N = AR cycles / requests tokens):
- prefill copies per request P: AR without the cache copies H2D/token * N, of which L * k per decode cycle;
- union per cycle without the cache: (H2D/token * N - P) / cycles per request; with the cache the same for AR and
  EAGLE-3 (the same trees), and for SpecFit U(n) = U_AR * (1 + n)^a through AR's and EAGLE-3's unions (marked ~);
- copies per cycle with the cache: (H2D/token * N - P) / cycles per request;
- drafted levels: 5 for EAGLE-3, Table 5 for SpecFit (the A100's; marked ~ where borrowed).
"""

from __future__ import annotations

import argparse
import math

from specfit.device import PARAMETERS, DeviceModel, scaled
from specfit.paper import paper_results

REQUESTS = {("a100", "summarization"): 40, ("a100", "gsm8k"): 80, ("rtx4090", "gsm8k"): 40}
DERIVED_FROM = {"a100": "summarization", "rtx4090": "gsm8k"}
NAMES = {"a100": "A100", "rtx4090": "RTX 4090"}
METHODS = ("ar", "eagle3", "specfit")
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
                                 "copies": union if mode == "no_cache" else per_cycle(row), "estimated": method == "specfit"}
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
    - expert execution and the fixed part: the cached AR and EAGLE-3 cycles, whose unions differ by ~800 experts.
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
    return {"name": NAMES[gpu], "fixed_ms": ar - u_ar * expert_ms, "token_ms": token_ms, "expert_ms": expert_ms,
            "copy_ms": copy_ms, "draft_ms": draft_ms, "ar_step_ms": ar, "experts_per_token": per_token}


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specfit.bench device", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-ms", type=float, default=20.0, help="the toy's cached AR step (ms)")
    parser.add_argument("--experts-per-token", type=int, default=16, help="the toy's MoE layers x top-k")
    args = parser.parse_args(argv)
    paper = paper_results()
    print("The device model fed the paper's per-cycle counters (Tables 2-4): predicted vs reported ms per cycle.")
    print("'fit': a row the parameters were derived from; '~': union or drafted levels estimated (see --help).")
    print(f"{'GPU':9s} {'workload':14s} {'method':8s} {'cache':9s} {'union':>7s} {'copies':>7s} "
          f"{'paper':>8s} {'model':>8s} {'error':>7s}")
    for r in check(paper):
        note = "fit" if r["fitted"] else ("~" if r["estimated"] else "")
        print(f"{NAMES[r['gpu']]:9s} {r['workload']:14s} {r['method']:8s} {r['mode']:9s} {r['union']:7.0f} "
              f"{r['copies']:7.0f} {r['paper_ms']:8.1f} {r['model_ms']:8.1f} {100 * r['error']:+6.1f}% {note}")
    worst = max(abs(r["error"]) for r in check(paper))
    print(f"largest error: {100 * worst:.1f}% (goal: within 10%)")
    reference = derive(paper, "a100")["ar_step_ms"]
    print(f"\nParameters (ms); the toy's: one unit for every GPU, {args.step_ms:g} ms per {reference} ms of the A100's "
          f"cached AR step, per-expert times also x 384 / {args.experts_per_token} (the experts of an AR token):")
    for gpu in DERIVED_FROM:
        params = derive(paper, gpu)
        print(f"  {NAMES[gpu]} (from its {DERIVED_FROM[gpu]} AR and EAGLE-3 rows): "
              + ", ".join(f"{k} {params[k]:.4g}" for k in PARAMETERS) + f"; cached AR step {params['ar_step_ms']}")
        toy = scaled(params, reference, args.step_ms, args.experts_per_token)
        print("    toy: emulate: {" + ", ".join(
            f"{k}: {v}" if k == "name" else f"{k}: {v:.4g}" for k, v in toy.items()) + "}")

if __name__ == "__main__":
    main()
