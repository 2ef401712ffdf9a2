"""``python -m specfit.bench paired``: two or more methods of one decode cell timed in one process, request by request.

The workflow runs each method in its own decode job, so a difference between two runs carries whatever the
machine did between them (seen on the toy: a few percent between DAG runs, more than the bootstrap intervals
over requests cover). Here both methods decode every prompt of the cell in the same process on the same loaded
model and engine, alternating which goes first (A B, then B A; with more methods the order rotates), each request
starting from an empty expert cache, for ``--repeats`` rounds. The ratio of decode TPS of every method over every
one named before it comes with a paired bootstrap over the (round, request) pairs (`specfit.intervals.ratio_interval`).
Every method's outputs are compared with the first's token for token. Per method it prints where a cycle's time
went (drafting, selection, verification; drafted levels, verified nodes, copies) and, for a method that prefetches,
what its prefetches did (`specfit.engine.offload.OffloadEngine.prefetch`). The loop is the paired stage's
(`specfit.paired`), which the workflow runs on the cells of the config's ``paired`` for the paper's claims.

It reads the workflow's own files (prompts, coefficients, atlas or predictor: `specfit.workflow.decode_inputs`),
so run the DAG (or the cell's decode jobs) first. Timings over an emulated link are labelled so.

    python -m specfit.bench paired --cell toy/cpu-a100link/gsm8k/12 --methods ar specfit-ca
    python -m specfit.bench paired --cell toy/cpu-a100link/gsm8k/4 --methods ar specfit-ca --configfile smoke.yaml
    python -m specfit.bench paired --cell toy/cpu-a100/summarization/3 --methods ar ar --slots 3 0
    python -m specfit.bench paired --cell toy/cpu-a100/gsm8k/12 --methods eagle3 eagle3-prefetch specfit-prefetch

With ``--slots`` the sides run at their own slot counts, each on its own copy of the target (a cache against none,
in one process).
"""

import argparse

import torch

from specfit import specs
from specfit.intervals import ratio_interval, round_id, tps_interval
from specfit.models import eos_ids
from specfit.paired import load_sides, time_sides
from specfit.records import read_prompts
from specfit.speculative.request import Limits
from specfit.speculative.stream import StreamSpec
from specfit.workflow import SCHEMA, DecodeRun, decode_inputs, load_config, paired_side


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config.yaml", help="the workflow's config (run from its root)")
    parser.add_argument("--configfile", nargs="*", default=[], help="configs merged over it, as with snakemake")
    parser.add_argument("--cell", required=True, help="model/device/workload/slots, e.g. toy/cpu-a100link/gsm8k/12")
    parser.add_argument("--methods", nargs="+", required=True, metavar="M", help="two or more methods of the config")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over the cell's prompts")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads: 1, as Snakemake gives each decode job (OMP_NUM_THREADS = the rule's "
                             "threads); with 2 on a 2-core machine, any other load stalls every forward")
    parser.add_argument("--slots", nargs="+", type=int, metavar="S",
                        help="one slot count per method (each count on its own engine), instead of the cell's")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if len(args.methods) < 2 or (args.slots and len(args.slots) != len(args.methods)):
        parser.error("give two or more --methods, and as many --slots when given")
    config = load_config(args.config, SCHEMA, *args.configfile)
    model_name, device_name, workload, slots = args.cell.split("/")
    runs = [DecodeRun(model_name, device_name, workload, m, x)
            for m, x in zip(args.methods, args.slots or [int(slots)] * len(args.methods))]
    names = [f"{r.method}@{r.slots}" if args.slots else r.method for r in runs]
    inputs = [decode_inputs(config, r) for r in runs]
    sides = load_sides([paired_side(r.method, r.slots) for r in runs],
                       [StreamSpec.from_dict(specs.decode(config, r.model, r.device, r.workload, r.method, r.slots))
                        for r in runs], inputs)
    prompts = read_prompts(inputs[0]["prompts"], args.max_requests)
    wl = config["workloads"][workload]
    limits = Limits(wl["limit_tokens"], wl["max_new_tokens"] or wl["limit_tokens"], eos_ids(sides[0].target.model))
    time_sides(sides, prompts, limits, args.repeats)
    n = len(sides)
    requests = [[round_id(r) for r in side.requests] for side in sides]
    cycles = [side.cycles for side in sides]
    prefetch = [side.prefetch for side in sides]
    stall = [side.stall_s for side in sides]

    label = sides[0].target.engine.timing_label
    print(f"{args.cell}: {' vs '.join(names)}, {len(prompts)} prompts x {args.repeats} rounds in one process, "
          f"alternating order, empty expert cache before every request, {args.threads} thread(s); timings: {label}")
    for name, rows in zip(names, requests):
        t = tps_interval(rows, seed=config["seed"])
        print(f"  {name:16s} decode TPS {t['value']:8.2f} [{t['low']:.2f}, {t['high']:.2f}]")
    for j in range(1, n):
        for i in range(j):
            r = ratio_interval(requests[j], requests[i], seed=config["seed"])
            print(f"  {names[j]} / {names[i]}: {r['value']:.3f}x [{r['low']:.3f}, {r['high']:.3f}] {r['verdict']} "
                  f"(paired bootstrap over {r['n']} requests)")
    for name, rows in zip(names[1:], requests[1:]):
        same = sum(x["output_ids"] == y["output_ids"] for x, y in zip(requests[0], rows))
        print(f"  outputs identical{f' ({name} vs {names[0]})' if n > 2 else ''}: {same} of {len(rows)}")
    print("  per cycle (ms: draft, select, verify and of it the copies' stall on an emulated device; levels drafted, "
          "nodes verified, copies incl. prefetched):")
    for name, rows, stalled in zip(names, cycles, stall):
        c = len(rows) or 1
        mean = {key: sum(row[key] for row in rows) / c for key in ("t_draft_s", "t_select_s", "t_verify_s",
                                                                  "drafted_levels", "h2d_transfers")}
        print(f"    {name:16s} {len(rows):5d} cycles  draft {mean['t_draft_s'] * 1e3:6.2f}  select "
              f"{mean['t_select_s'] * 1e3:5.2f}  verify {mean['t_verify_s'] * 1e3:6.2f} (stall "
              f"{stalled * 1e3 / c:5.2f})  levels "
              f"{mean['drafted_levels']:.2f}  nodes {sum(len(row['selected']) for row in rows) / c:.2f}  copies "
              f"{mean['h2d_transfers']:.2f}")
    for name, p, rows in zip(names, prefetch, cycles):
        if p["issued"]:
            print(f"  {name} prefetch: {p['issued']:.0f} copies, used by the next forward {p['used']:.0f} "
                  f"(precision {p['used'] / p['issued']:.3f}), evicted unused {p['evicted_unused']:.0f}, idle "
                  f"{p['idle']:.0f}; copy time hidden {p['hidden_ms'] / max(len(rows), 1):.2f} ms per cycle")

if __name__ == "__main__":
    main()
