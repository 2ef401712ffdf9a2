"""``python -m specfit.bench proportions``: the toy's proportions beside the paper's, measured now.

Decodes the first ``--requests`` prompts of each workload with AR and EAGLE-3 on the offload engine (the
config's device, with its with-cache slot count and without a cache, one thread as under ``snakemake --cores 1``)
and prints, beside the paper's A100 figures:

- EAGLE-3's committed tokens per cycle, on all cycles and on cycles whose 4-gram is fresh in the output;
- the expert union of the 8-token tree over the root's, F(tree) / F(root), summed over layers;
- on an emulated device, the proportions of `specfit.engine.paper_gpus.PROPORTIONS` with their goals: AR's cycle
  without over with the cache, EAGLE-3's over AR's with and without it, one drafted level, expert execution and
  the copies as shares of a cached AR cycle;
- the acceptance rows (`specfit.results.acceptance`): EAGLE-3's committed tokens per cycle with the cache (goal:
  within 15% of the paper's, and more on GSM8K than on summarization), and SpecFit's selected nodes, drafted levels,
  cycles stopped before level 5 and coefficient of variation of ρ from the workflow's Table 5
  (``data/theory/<model>/<device>/<workload>.json``, after the workflow has run), each with its direction against
  the paper's;
- from the toy's training records: the target's held-out loss and the drafter's top-1 agreement.

The paper's union ratio is read off Tables 2 and 3 without the cache: H2D per token × committed per cycle
over AR's H2D per token. Timings over an emulated link are labelled so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from specfit import bench
from specfit.engine.offload import make_engine
from specfit.engine.paper_gpus import PROPORTIONS, paper_proportions, proportion_met, run_proportions
from specfit.io import read_json
from specfit.models import eos_ids, load_drafter, load_target
from specfit.paper import paper_results
from specfit.planning import paths
from specfit.planning.config import SCHEMA, add_configfile_option, load_config
from specfit.results.acceptance import (
    ACCEPTANCE,
    acceptance_met,
    direction,
    ordered_met,
    paper_acceptance,
    run_acceptance,
    shown,
)
from specfit.results.metrics import stream_metrics
from specfit.results.records import CYCLE_SCHEMA
from specfit.speculative.config import MethodConfig
from specfit.speculative.kinds import AR, EAGLE3
from specfit.speculative.methods import build_method
from specfit.speculative.request import Limits, decode_request


def expert_union(routes: torch.Tensor) -> int:
    """F of one forward: Σ over layers of the distinct experts its tokens route to (``routes`` [T, L, k])."""
    return sum(len(layer.unique()) for layer in routes.transpose(0, 1))


def decode(model, drafter, engine, method: str, prompts: list[dict], limits: Limits, seed: int) -> dict:
    """Requests, cycles and each verification forward's expert union (summed over layers) of one method."""
    runner = build_method(MethodConfig(name=method), {}, seed, engine.num_experts)  # the paper's K, depth, top-k
    requests, cycles, verify_unions = [], [], []
    for i, p in enumerate([prompts[0]] + prompts):  # the first one again as warm-up, discarded
        with engine.record_routes() as recorded:  # one [T, L, k] per forward: the prefill, then one per cycle
            r = decode_request(model, drafter, runner, p["prompt_ids"], request_id=p["request_id"],
                               question_id=p["question_id"], limits=limits, engine=engine)
        if i == 0:
            engine.clear_cache()
            continue
        requests.append(r.request | {"prompt_ids": p["prompt_ids"]})  # prompt and request rows in one
        cycles += r.cycles
        verify_unions += [expert_union(f) for f in recorded.forwards[1:]]
    return {"requests": requests, "cycles": cycles, "unions": np.asarray(verify_unions)}


def paper_counters(paper: dict) -> dict:
    """The paper's committed tokens and union ratio (A100, Tables 2-3)."""
    counters = paper["counters"]["a100"]
    union = {}
    for w in ("summarization", "gsm8k"):
        e, ar = counters[w]["eagle3"]["no_cache"], counters[w]["ar"]["no_cache"]
        union[w] = e["h2d_per_token"] * e["committed"] / ar["h2d_per_token"]
    return {
        "committed": {w: counters[w]["eagle3"]["cache"]["committed"] for w in ("summarization", "gsm8k")},
        "union": union,
    }


def metrics_of(run: dict, engine) -> dict:
    """The run's metrics.json figures, as the decode stage computes them (`specfit.results.metrics.stream_metrics`; the
    requests double as the prompts, as they carry ``prompt_ids``)."""
    cycles = pa.Table.from_pylist(run["cycles"], schema=CYCLE_SCHEMA)
    return {**stream_metrics(run["requests"], cycles, run["requests"]),
            "experts_per_token": engine.num_layers * engine.top_k}


def main(argv: list[str] | None = None) -> None:
    parser = bench.parser(__name__, __doc__, raw=True)
    add_configfile_option(parser)
    parser.add_argument("--model", default="toy")
    parser.add_argument("--device", default="cpu-a100")
    parser.add_argument("--requests", type=int, default=4, help="prompts per workload")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_config("config.yaml", SCHEMA, *(args.configfile or []))
    model_cfg, device = config["models"][args.model], config["devices"][args.device]
    slots = model_cfg["main_slots"][args.device]
    target_dir, drafter_dir = Path(model_cfg["target"]), Path(model_cfg["drafter"])

    def offloaded(slots: int):
        model, _ = load_target(target_dir, model_cfg["dtype"], "cpu", key=f"models.{args.model}.target",
                               logits_dtype=model_cfg["logits_dtype"], verify=model_cfg["verify"])
        engine = make_engine(model, slots, device["max_inflight"], device["link"], device["torch_device"],
                             device["emulate"])
        drafter = load_drafter(drafter_dir, model, device=device["torch_device"], key=f"models.{args.model}.drafter")
        engine.emulate_drafter(drafter)
        return model, engine, drafter

    setups = {slots: offloaded(slots), 0: offloaded(0)}  # with the cache, then without
    model, engine, drafter = setups[slots]
    L, k = engine.num_layers, model.config.num_experts_per_tok
    paper = paper_results()
    paper_p = paper_counters(paper)
    label = " [emulated]" if engine.link_emulated else ""

    rows = []
    for workload in ("summarization", "gsm8k"):
        path = Path("data/prompts") / args.model / f"{workload}.parquet"
        if not path.is_file():
            raise SystemExit(f"no prompts at {path}: run `snakemake --cores 1 {path}` first")
        prompts = sorted(pq.read_table(path).to_pylist(), key=lambda r: r["request_id"])[: args.requests]
        limits = Limits(config["workloads"][workload]["limit_tokens"], args.max_new_tokens, eos_ids(model))
        runs = {(method, s): decode(m, d if method != AR.name else None, e, method, prompts, limits, config["seed"])
                for s, (m, e, d) in setups.items() for method in (AR.name, EAGLE3.name)}
        measured = {key: metrics_of(run, setups[key[1]][1]) for key, run in runs.items()}
        ar, e3 = measured["ar", slots], measured["eagle3", slots]
        full = np.asarray([len(c["selected"]) == 7 for c in runs["eagle3", slots]["cycles"]])  # whole trees
        unions = runs["eagle3", slots]["unions"]
        union = float(unions[full].mean() / (L * k)) if full.any() else None
        toy_p = None
        if device["emulate"] is not None:
            toy_p = run_proportions(measured["ar", slots], measured["ar", 0], measured["eagle3", slots],
                                    measured["eagle3", 0], device["emulate"])
        rows.append((workload, ar, e3, union, toy_p))

    training = read_json(target_dir / paths.TOY_RECORDS["target"])
    acceptance = read_json(drafter_dir / paths.TOY_RECORDS["drafter"])
    print(f"{args.model} on {args.device}, {slots} and 0 slots per layer, {args.requests} requests per workload, "
          f"at most {args.max_new_tokens} new tokens, {args.threads} thread(s)")
    if engine.link_emulated:
        print(f"timings marked [emulated]: {engine.timing_label}")
    print(f"{'quantity':72s} {'toy':>8s} {'paper':>8s}")

    def line(name: str, toy, paper_value, fmt: str = "{:.2f}", goal: str = "") -> None:
        show = lambda v: "-" if v is None else fmt.format(v)  # noqa: E731
        print(f"{name:72s} {show(toy):>8s} {show(paper_value):>8s} {goal}")

    for workload, _, e3, union, _ in rows:
        fresh = 100 * e3["cycles_fresh"] / e3["cycles"]
        line(f"EAGLE-3 committed per cycle starting on a fresh output 4-gram ({fresh:.0f}% of cycles), {workload}",
             e3["committed_per_cycle_fresh"], None)
        line(f"F(8-token tree) / F(root), {workload}", union, paper_p["union"][workload])
        line(f"  EAGLE-3 draft nodes verified per cycle, {workload}", e3["draft_nodes_per_cycle"], 7.0)
    for workload, ar, _, _, toy_p in rows:
        line(f"cached AR step, {workload} (ms){label}", ar["ms_per_cycle"], paper["counters"]["a100"][workload]["ar"]
             ["cache"]["ms_per_cycle"], "{:.2f}")
        if toy_p is None:
            continue
        for key, name in PROPORTIONS:
            toy, ref = toy_p[key], paper_proportions(paper, workload)[key]
            met = proportion_met(key, toy, ref)
            pct = key.endswith("share")
            line(f"{name}, {workload}{label}", 100 * toy if pct else toy, 100 * ref if pct else ref,
                 "{:.1f}" if pct else "{:.2f}", "" if met is None else "met" if met else "not met")
    print_acceptance(line, rows, args.model, args.device, paper)
    line("drafter top-1 agreement, held-out target continuations (%)", 100 * acceptance["top1_agreement"], None,
         "{:.1f}")
    line("target held-out loss (nats/token)", training["heldout_loss"], None)
    print(json.dumps({"target_sha256": training.get("sha256"), "drafter_sha256": acceptance.get("sha256")}))
    for _, e, _ in setups.values():
        e.close()

def print_acceptance(line, rows, model: str, device: str, paper: dict) -> None:
    """The acceptance rows of each workload beside the paper's A100 figures, with the goal or the direction; the
    Table 5 rows from the workflow's theory outputs where they are there."""
    committed = {}
    for workload, _, e3, _, _ in rows:
        path = Path(paths.theory(model, device, workload))
        toy = run_acceptance(e3, read_json(path) if path.is_file() else None)
        ref = paper_acceptance(paper, workload)
        committed[workload] = toy["e3_committed"]
        for key, name, _ in ACCEPTANCE:
            met = acceptance_met(key, toy[key], ref[key])
            line(f"{name}, {workload}", toy[key], ref[key], "{:" + shown(key) + "}",
                 (direction(toy[key], ref[key]) or "-") + ("" if met is None else ", met" if met else ", not met"))
        if not path.is_file():
            print(f"  (no {path}: `snakemake --cores 1 {path}` gives the Table 5 rows)")
    order = ordered_met(committed)
    if order is not None:
        print(f"EAGLE-3 commits more per cycle on gsm8k than on summarization: {'met' if order else 'not met'}")


if __name__ == "__main__":
    main()
