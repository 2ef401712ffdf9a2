"""Stage tune: the fixed EAGLE-3 tree a user tunes by hand, chosen by a sweep on questions the workload does not
evaluate (`specfit.speculative.tuning`).

Each tree of the grid decodes the tuning prompts with plain EAGLE-3 on the run's device, through the decode stage's
code (`specfit.speculative.loading`, one warm-up per tree, an empty cache at its start); its decode TPS is the
stream's (`specfit.results.metrics.stream_metrics`: decode tokens over decode time, on the device's clock). The highest
is chosen, the first of equals in grid order.

Under cross-fitting (a workload's ``tune_folds``) one tune job runs per fold: its prompts are the other folds'
questions, and the tree it chooses decodes its fold's (``decodes``).

spec: {"stream": the tuned method's decode spec (`specfit.speculative.stream.StreamSpec`), "trees": [{max_depth,
       top_k_expand, k_max}, ...], "decodes": [question ids the chosen tree decodes]}
inputs: prompts (the tuning questions, Parquet), target, drafter
outputs: tune (JSON: every tree with its decode TPS, committed tokens and ms per cycle; ``chosen``; the questions it
         was tuned on and those it decodes; the clock)
"""

from __future__ import annotations

import dataclasses
import logging

import pyarrow as pa
import torch

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
from specfit.speculative.request import Limits
from specfit.speculative.sampling import Sampling
from specfit.speculative.stream import StreamSpec
from specfit.speculative.tuning import TREE_KEYS, best

log = logging.getLogger("specfit.stages.tune")
TREE_METRICS = ("tps_dec", "committed_per_cycle", "ms_per_cycle", "cycles", "n_output_tokens")  # per tree


def tree_spec(spec: StreamSpec, tree: dict) -> StreamSpec:
    """The stream of one tree: plain EAGLE-3 at that tree."""
    return dataclasses.replace(spec, method=MethodConfig(name=EAGLE3.name, **{k: tree[k] for k in TREE_KEYS}))


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    stream, trees = StreamSpec.from_dict(spec["stream"]), spec["trees"]
    prompts = read_prompts(inputs["prompts"], None)
    if not prompts:
        raise SpecFitError(f"{inputs['prompts']}: no tuning prompts; give the workload questions it does not "
                           "evaluate (workloads.<name>.tune_question_ids, or a max_requests below its ids)")
    tuned_on = [p["question_id"] for p in prompts]
    if overlap := sorted(set(tuned_on) & set(spec["decodes"])):  # before any decode
        raise SpecFitError(f"{inputs['prompts']}: the tuning questions hold questions the tree will decode "
                           f"({', '.join(map(str, overlap[:8]))}); re-extract them (rule extract_tune)")
    torch.manual_seed(stream.seed)
    loaded = load(tree_spec(stream, trees[0]), inputs, {})
    limits = Limits(stream.limit_tokens, stream.max_new_tokens, eos_ids(loaded.model), Sampling.of(stream.sampling))
    rows = []
    for tree in trees:
        t = tree_spec(stream, tree)
        loaded.method = build_method(t.method, inputs, t.seed, loaded.engine.num_experts)
        loaded.warm_up(prompts[0], limits, t.warmup_tokens)
        results = [loaded.decode(p, limits) for p in prompts]
        m = stream_metrics([r.request for r in results],
                           pa.Table.from_pylist([c for r in results for c in r.cycles], schema=CYCLE_SCHEMA))
        rows.append({**{k: tree[k] for k in TREE_KEYS}, **{k: m[k] for k in TREE_METRICS}})
        log.info("tree %s: %.2f tok/s, %.2f committed per cycle", tree, rows[-1]["tps_dec"],
                 rows[-1]["committed_per_cycle"])
    chosen = best(rows)
    log.info("chosen: %s", chosen)
    write_json({"chosen": chosen, "trees": rows, "question_ids": tuned_on, "decodes": spec["decodes"],
                "timing_label": loaded.engine.timing_label, "slots": stream.slots}, outputs["tune"])


main = stage_main(run)

if __name__ == "__main__":
    main()
