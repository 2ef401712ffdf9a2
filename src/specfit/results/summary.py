"""A decode stream's metrics.json: `specfit.results.metrics.stream_metrics` over its records, with the offload
engine's and the route sources' counters, and the lossless check against an AR reference run (`stream_summary`).
The one place the decode and atlas stages (`specfit.speculative.stream`) summarise a stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from specfit.results.metrics import stream_metrics
from specfit.speculative.sampling import Sampling

if TYPE_CHECKING:
    from specfit.speculative.loading import Loaded
    from specfit.speculative.stream import StreamSpec


def stream_summary(loaded: Loaded, spec: StreamSpec, prompts: list[dict], requests: pa.Table, cycles: pa.Table,
                   resumes: list[dict], reference=None) -> dict:
    """The stream's metrics.json: `specfit.results.metrics.stream_metrics` with the engine's and the route sources'
    counters, and the lossless check against the ``reference`` AR run's requests (when given)."""
    engine, stats = loaded.engine, loaded.engine.stats()
    metrics = stream_metrics(requests.to_pylist(), cycles, prompts, spec.seed)
    metrics.update(
        method=spec.method.name, slots=spec.slots, slot_rows_allocated=slot_rows(engine),
        dtype=spec.dtype, verify=spec.verify,  # the arithmetic the lossless check's guarantee rests on
        link_emulated=engine.link_emulated, timing_label=engine.timing_label, resumed=resumes,
        device=stats.get("device"),  # an emulated device: its virtual clock (modelled time, host work)
        prefetch=stats["prefetch"],  # copies a prefetching method issued and how each was settled
        experts_per_token=engine.num_layers * engine.top_k,  # an AR cycle's expert union
        experts_executed=stats["demand"],  # the per-layer unions of every forward, summed (prefill included)
    )
    atlas, learned = loaded.atlas, loaded.learned
    if atlas is not None:  # pool nodes (roots included) of this process's requests; missed: a fallback's routes
        metrics.update(atlas_nodes=atlas.nodes_looked_up, atlas_nodes_missed=atlas.nodes_missed,
                       atlas_nodes_from_earlier_rows=atlas.nodes_from_earlier_rows,
                       atlas_prob_mismatches=atlas.prob_mismatches)
    if learned is not None:  # the predictor's time, inside selection: its share of the decode cycles' time
        t_cycles = metrics["ms_per_cycle"] * metrics["cycles"] / 1e3 if metrics["cycles"] else 0.0
        share = 100.0 * learned.seconds / t_cycles if t_cycles > 0 else None
        metrics["route_predictor"] = {**learned.stats(), "share_of_cycle_time_pct": share}
    metrics["lossless"] = None  # this run is the reference, or no AR run is configured beside it
    if reference is not None:
        # under rejection sampling the tokens are AR's distribution's, not AR's: a divergence is expected, and its
        # margin (a target forward over the prefix, per request) explains nothing
        margins = not Sampling.of(spec.sampling).rejection
        metrics["lossless"] = lossless_check(loaded.model, prompts, requests.to_pylist(), reference, margins)
    return metrics


def slot_rows(engine) -> int:
    """Expert slot rows the engine allocated on the device, over all layers (a buffer shared by layers once)."""
    buffers = {id(layer.slots): layer.rows for layer in engine.layers}
    return sum(buffers.values())


def lossless_check(model, prompts: list[dict], requests: list[dict], reference_path, margins: bool = True) -> dict:
    """Compare outputs with an AR reference; at a divergence, the target's top-2 logit margin there (None without
    ``margins``)."""
    reference = {r["request_id"]: r["output_ids"] for r in pq.read_table(reference_path).to_pylist()}
    prompt_ids = {p["request_id"]: p["prompt_ids"] for p in prompts}
    compared = identical = 0
    divergences = []
    for r in requests:
        ref = reference.get(r["request_id"])
        if ref is None:
            continue
        compared += 1
        ours = r["output_ids"]
        if ours == ref:
            identical += 1
            continue
        pos = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        divergences.append({
            "request_id": r["request_id"], "position": pos,
            "ours": ours[pos] if pos < len(ours) else None, "reference": ref[pos] if pos < len(ref) else None,
            "margin": top2_margin(model, prompt_ids[r["request_id"]] + ref[:pos]) if margins else None,
        })
    return {"reference": str(reference_path), "n_requests": compared, "n_identical": identical,
            "missing": len(requests) - compared, "divergences": divergences}


def top2_margin(model, tokens: list[int]) -> float:
    """Top-1 minus top-2 logit of the target's next-token prediction after ``tokens`` (one causal forward)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([tokens], device=model.device)).logits[0, -1].float()  # [V]
    top = logits.topk(2).values
    return float(top[0] - top[1])
