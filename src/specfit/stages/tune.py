"""Stage tune: the fixed EAGLE-3 tree a user tunes by hand, chosen by a sweep on questions the workload does not
evaluate (`specfit.speculative.tuning`), at every slot count the tuned method runs at in the cell.

Each tree of the grid decodes the tuning prompts with plain EAGLE-3 on the run's device, through the decode stage's
code (`specfit.speculative.loading`, one warm-up per job, an empty cache at each tree's start); its decode TPS is the
stream's (`specfit.results.metrics.stream_metrics`: decode tokens over decode time, on the device's clock). The highest
is chosen, the first of equals in grid order.

Plain EAGLE-3 reads nothing of the cache: at every slot count a tree drafts, verifies and commits the same tokens, and
only the clock differs. On an emulated device each tree therefore decodes once, at the most slots (the fewest copies
on this machine), and the other slot counts are priced on the same forwards (`specfit.engine.pricing`: their own
LRU and virtual clock, the same drafter forwards and host work). Where the clock is measured (a
GPU, an emulated link) it decodes once per slot count. On an emulated device each tuning prompt's prefill computes
once, at the first tree; every later tree replays it (`specfit.speculative.prefill`: the same cache, counters and
modelled clock).

Under cross-fitting (a workload's ``tune_folds``) one tune job runs per fold: its prompts are the other folds'
questions, and the tree it chooses decodes its fold's (``decodes``). Rule tune_choice writes each slot count's part.

spec: {"streams": {slots: the tuned method's decode spec at those slots (`specfit.speculative.stream.StreamSpec`)},
       "trees": [{max_depth, top_k_expand, k_max}, ...], "decodes": [question ids the chosen tree decodes]}
inputs: prompts (the tuning questions, Parquet), target, drafter
outputs: grid (JSON: per slot count, every tree with its decode TPS, committed tokens and ms per cycle, and the
         chosen one; the questions it was tuned on and those it decodes; the clock; how each slot count was clocked)
"""

from __future__ import annotations

import dataclasses
import logging

import pyarrow as pa
import torch

from specfit.engine.pricing import can_price, price
from specfit.errors import SpecFitError
from specfit.io import write_json
from specfit.models import eos_ids
from specfit.planning.stage import stage_main
from specfit.results.metrics import stream_metrics
from specfit.results.records import CYCLE_SCHEMA, read_prompts
from specfit.speculative.config import MethodConfig
from specfit.speculative.kinds import EAGLE3
from specfit.speculative.loading import load
from specfit.speculative.methods import build_method
from specfit.speculative.prefill import SharedPrefills
from specfit.speculative.request import Limits, RequestResult, drain
from specfit.speculative.sampling import Sampling
from specfit.speculative.stream import StreamSpec
from specfit.speculative.tuning import TREE_KEYS, best

log = logging.getLogger("specfit.stages.tune")
TREE_METRICS = ("tps_dec", "committed_per_cycle", "ms_per_cycle", "cycles", "n_output_tokens")  # per tree


def tree_spec(spec: StreamSpec, tree: dict) -> StreamSpec:
    """The stream of one tree: plain EAGLE-3 at that tree."""
    return dataclasses.replace(spec, method=MethodConfig(name=EAGLE3.name, **{k: tree[k] for k in TREE_KEYS}))


def decode_priced(loaded, prompt: dict, limits: Limits, clocks: list,
                  prefills: SharedPrefills | None = None) -> tuple[RequestResult, list[dict]]:
    """Decode ``prompt``; its `RequestResult` and, per clock of ``clocks`` (the slot counts priced beside the
    engine's, `specfit.engine.pricing.price`), the request's times on it: ``t_request_s`` and ``t_prefill_s`` read
    as the request's own clock reads them (from its start, and to the end of its prefill, the first step).
    ``prefills``: the prompt's prefill replayed where an earlier tree computed it (`specfit.speculative.prefill`)."""
    start = [c.clock_s for c in clocks]
    steps = loaded.decode_cycles(prompt, limits, prefills)
    next(steps)  # the prefill
    prefilled = [c.clock_s for c in clocks]
    result = drain(steps)
    times = [{"t_request_s": c.clock_s - s, "t_prefill_s": p - s} for c, s, p in zip(clocks, start, prefilled)]
    return result, times


def tree_metrics(tree: dict, requests: list[dict], cycles: list[dict]) -> dict:
    m = stream_metrics(requests, pa.Table.from_pylist(cycles, schema=CYCLE_SCHEMA))
    return {**{k: tree[k] for k in TREE_KEYS}, **{k: m[k] for k in TREE_METRICS}}


def sweep(stream: StreamSpec, others: list[int], trees: list[dict], prompts: list[dict], inputs: dict):
    """Every tree over ``prompts`` at ``stream``'s slots and, where the engine's clock prices them
    (`specfit.engine.pricing.can_price`), at each of ``others`` on the same forwards: rows by slot count, how each
    was clocked, and the engine's timing label."""
    loaded = load(tree_spec(stream, trees[0]), inputs, {})
    priced = others if can_price(loaded.engine) else []
    clocks = [price(loaded.engine, s) for s in priced]
    limits = Limits(stream.limit_tokens, stream.max_new_tokens, eos_ids(loaded.model), Sampling.of(stream.sampling))
    rows = {s: [] for s in (stream.slots, *priced)}
    loaded.warm_up(prompts[0], limits, stream.warmup_tokens)  # once: what it compiles and allocates, every tree uses
    prefills = SharedPrefills.for_engine(loaded.engine)  # each prompt prefilled once, replayed for the other trees
    for tree in trees:
        t = tree_spec(stream, tree)
        loaded.method = build_method(t.method, inputs, t.seed, loaded.engine.num_experts)
        loaded.reset()  # an empty cache (every priced one too) and fresh counters
        results, times = zip(*(decode_priced(loaded, p, limits, clocks, prefills) for p in prompts))
        requests = [r.request for r in results]
        cycles = [c for r in results for c in r.cycles]
        rows[stream.slots].append(tree_metrics(tree, requests, cycles))
        for i, s in enumerate(priced):
            rows[s].append(tree_metrics(tree, [{**r, **t[i]} for r, t in zip(requests, times)], cycles))
        log.info("tree %s: %s tok/s at slots %s", tree, ", ".join(f"{rows[s][-1]['tps_dec']:.2f}" for s in rows),
                 ", ".join(map(str, rows)))
    clocked = {stream.slots: "decoded", **{s: f"priced on the decodes at {stream.slots} slots" for s in priced}}
    return rows, clocked, loaded.engine.timing_label


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    streams = {int(s): StreamSpec.from_dict(v) for s, v in spec["streams"].items()}
    trees = spec["trees"]
    prompts = read_prompts(inputs["prompts"], None)
    if not prompts:
        raise SpecFitError(f"{inputs['prompts']}: no tuning prompts; give the workload questions it does not "
                           "evaluate (workloads.<name>.tune_question_ids, or a max_requests below its ids)")
    tuned_on = [p["question_id"] for p in prompts]
    if overlap := sorted(set(tuned_on) & set(spec["decodes"])):  # before any decode
        raise SpecFitError(f"{inputs['prompts']}: the tuning questions hold questions the tree will decode "
                           f"({', '.join(map(str, overlap[:8]))}); re-extract them (rule extract_tune)")
    torch.manual_seed(streams[max(streams)].seed)
    rows, clocked = {}, {}
    for s in sorted(streams, reverse=True):  # the most slots first (the fewest copies on this machine)
        if s not in rows:
            found, how, label = sweep(streams[s], sorted(o for o in streams if o not in rows and o != s), trees,
                                      prompts, inputs)
            rows.update(found)
            clocked.update(how)
    slots = {str(s): {"chosen": best(rows[s]), "trees": rows[s], "clocked": clocked[s]} for s in sorted(rows)}
    log.info("chosen: %s", {s: v["chosen"] for s, v in slots.items()})
    write_json({"slots": slots, "question_ids": tuned_on, "decodes": spec["decodes"], "timing_label": label},
               outputs["grid"])


main = stage_main(run)

if __name__ == "__main__":
    main()
