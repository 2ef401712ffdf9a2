"""``python -m specfit.bench paired``: two methods of one decode cell timed in one process, request by request.

The workflow runs each method in its own decode job, so a difference between two runs carries whatever the
machine did between them (seen on the toy: a few percent between DAG runs, more than the bootstrap intervals
over requests cover). Here both methods decode every prompt of the cell in the same process on the same loaded
model and engine, alternating which goes first (A B, then B A), each request starting from an empty expert
cache, for ``--repeats`` rounds. The ratio of decode TPS comes with a paired bootstrap over the (round, request)
pairs (`specfit.intervals.ratio_interval`). Both methods' outputs are compared token for token.

It reads the workflow's own files (prompts, coefficients, atlas or predictor: `specfit.workflow.decode_inputs`),
so run the DAG (or the cell's decode jobs) first. Timings over an emulated link are labelled so.

    python -m specfit.bench paired --cell toy/cpu-a100link/gsm8k/12 --methods ar specfit-ca
    python -m specfit.bench paired --cell toy/cpu-a100link/gsm8k/4 --methods ar specfit-ca --configfile smoke.yaml
    python -m specfit.bench paired --cell toy/cpu-a100/summarization/3 --methods ar ar --slots 3 0

With ``--slots`` the two sides run at two slot counts, each on its own copy of the target (a cache against none,
in one process).
"""

import argparse

import torch

from specfit.engine import make_engine
from specfit.intervals import ratio_interval, tps_interval
from specfit.models import eos_ids, load_drafter, load_target
from specfit.records import read_prompts
from specfit.speculative.methods import build_method
from specfit.speculative.request import Limits, decode_request
from specfit.workflow import SCHEMA, DecodeRun, decode_inputs, load_config, method_config

ROUND = 100_000  # a request of round r counts as r * ROUND + request_id in the paired bootstrap


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config.yaml", help="the workflow's config (run from its root)")
    parser.add_argument("--configfile", nargs="*", default=[], help="configs merged over it, as with snakemake")
    parser.add_argument("--cell", required=True, help="model/device/workload/slots, e.g. toy/cpu-a100link/gsm8k/12")
    parser.add_argument("--methods", nargs=2, required=True, metavar=("A", "B"), help="method names of the config")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over the cell's prompts")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--slots", nargs=2, type=int, metavar=("SA", "SB"),
                        help="A at SA slots and B at SB (each on its own engine), instead of both at the cell's")
    args = parser.parse_args(argv)
    config = load_config(args.config, SCHEMA, *args.configfile)
    model_name, device_name, workload, slots = args.cell.split("/")
    device, wl = config["devices"][device_name], config["workloads"][workload]
    sides = list(zip(args.methods, args.slots or [int(slots)] * 2))  # (method, slots) of A and B
    names = [f"{m}@{x}" if args.slots else m for m, x in sides]
    inputs = [decode_inputs(config, DecodeRun(model_name, device_name, workload, m, x)) for m, x in sides]
    model_cfg = config["models"][model_name]

    def offloaded(slots: int):
        """The target on its own engine at ``slots``, with the drafter when a side drafts."""
        model, _ = load_target(inputs[0]["target"], model_cfg["dtype"], "cpu", key=f"models.{model_name}.target",
                               logits_dtype=model_cfg["logits_dtype"])
        engine = make_engine(model, slots, device["max_inflight"], device["link"], device["torch_device"],
                             device["emulate"])
        path = next((i["drafter"] for i in inputs if "drafter" in i), None)
        drafter = None if path is None else load_drafter(path, model, device=device["torch_device"],
                                                         key=f"models.{model_name}.drafter")
        if drafter is not None:
            engine.emulate_drafter(drafter)
        return model, engine, drafter

    setups = {x: offloaded(x) for x in dict.fromkeys(x for _, x in sides)}
    methods = [build_method(method_config(config, m), i, config["seed"], setups[x][1].num_experts)
               for (m, x), i in zip(sides, inputs)]
    prompts = read_prompts(inputs[0]["prompts"], args.max_requests)
    limits = Limits(wl["limit_tokens"], wl["max_new_tokens"] or wl["limit_tokens"], eos_ids(setups[sides[0][1]][0]))

    def decode(side: int, prompt: dict, limits: Limits, request_id: int) -> dict:
        method, (model, engine, drafter) = methods[side], setups[sides[side][1]]
        engine.clear_cache()
        return decode_request(model, drafter if method.drafts else None, method, prompt["prompt_ids"],
                              request_id=request_id, question_id=prompt["question_id"], limits=limits,
                              engine=engine).request

    with torch.inference_mode():
        warmup = Limits(limits.limit_tokens, min(8, limits.max_new_tokens), limits.eos_ids)
        for side, method in enumerate(methods):
            decode(side, prompts[0], warmup, prompts[0]["request_id"])
            method.reset()
        for _, engine, _ in setups.values():
            engine.reset_stats()
        requests = [[], []]
        for round_ in range(args.repeats):
            for i, prompt in enumerate(prompts):
                for side in ((0, 1) if (i + round_) % 2 == 0 else (1, 0)):
                    request = decode(side, prompt, limits, prompt["request_id"])  # the atlas knows it by its id
                    requests[side].append({**request, "request_id": round_ * ROUND + prompt["request_id"]})

    a, b = names
    same = sum(x["output_ids"] == y["output_ids"] for x, y in zip(*requests))
    label = setups[sides[0][1]][1].timing_label
    print(f"{args.cell}: {a} vs {b}, {len(prompts)} prompts x {args.repeats} rounds in one process, alternating "
          f"order, empty expert cache before every request; timings: {label}")
    for name, rows in zip(names, requests):
        t = tps_interval(rows, seed=config["seed"])
        print(f"  {name:16s} decode TPS {t['value']:8.2f} [{t['low']:.2f}, {t['high']:.2f}]")
    r = ratio_interval(requests[1], requests[0], seed=config["seed"])
    print(f"  {b} / {a}: {r['value']:.3f}x [{r['low']:.3f}, {r['high']:.3f}] {r['verdict']} "
          f"(paired bootstrap over {r['n']} requests)")
    print(f"  outputs identical: {same} of {len(requests[0])}")
    for x, (_, engine, _) in setups.items():
        if (device_stats := engine.stats().get("device")) is not None:
            t = device_stats["target"]
            print(f"  {x} slots: {t['overruns']} of {t['forwards']} target forwards overran the device's model, "
                  f"{device_stats['drafter']['overruns']} of {device_stats['drafter']['forwards']} drafter forwards")

if __name__ == "__main__":
    main()
