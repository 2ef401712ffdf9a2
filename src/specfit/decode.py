"""Decode stage: one method's timed request stream on the offloaded target (paper Section 4, Appendix B).

Inputs: ``prompts`` (Parquet: request_id, question_id, prompt, prompt_ids), ``target`` and ``drafter`` (checkpoint
folders; no drafter for AR), ``coefficients`` and ``atlas`` (SpecFit only) and ``reference`` (an AR
requests.parquet, optional: the lossless check). Outputs: ``requests`` and ``cycles`` (Parquet, schemas in
`specfit.spec.request`), ``metrics`` (JSON) and, with live routes, ``atlas``.

Spec (the rule's config slice)::

    method:        {name: ar | eagle3 | specfit, k_max: 7, max_depth: 5, top_k_expand: 2,
                    routes: atlas | noisy | live, accuracy: 0.6}      see `specfit.spec.methods.MethodConfig`
    slots:         expert slots per MoE layer (0: no expert cache)
    max_inflight:  host-to-device copies in flight (2)
    link:          null, or {bandwidth_gbps: GB/s, latency_us: us}: an emulated link for CPU-only machines
    torch_device:  "cpu" | "cuda"       dtype: "float32" | "bfloat16" | "float16"
    limit_tokens:  input + output tokens per request     max_new_tokens: output tokens per request
    max_requests:  null (all prompts) or the first n     seed: fixes everything stochastic
    warmup_tokens: output tokens of the warm-up request (8)

Each finished request is kept at once in ``{requests}.parts/`` (written atomically), and a rerun after a crash
resumes from there; metrics.json says so, as the expert cache a resumed stream starts with is empty.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from specfit.intervals import tps_interval
from specfit.io import read_json, write_json, write_parquet
from specfit.models import load_drafter, load_target
from specfit.ngrams import stream_split
from specfit.spec import (
    ATLAS_SCHEMA, CYCLE_SCHEMA, REQUEST_SCHEMA, Limits, MethodConfig, build_method, decode_request,
)
from specfit.spec.routes import atlas_source
from specfit.stage import SpecFitError, stage_main

log = logging.getLogger(__name__)

PARTS = {"requests": REQUEST_SCHEMA, "cycles": CYCLE_SCHEMA, "atlas": ATLAS_SCHEMA}


@dataclass(frozen=True)
class DecodeSpec:
    method: MethodConfig
    slots: int
    max_inflight: int = 2
    link: dict | None = None
    torch_device: str = "cpu"
    dtype: str = "float32"
    limit_tokens: int = 2048
    max_new_tokens: int = 2048
    max_requests: int | None = None
    seed: int = 0
    warmup_tokens: int = 8

    @classmethod
    def from_dict(cls, spec: dict) -> "DecodeSpec":
        if "method" not in spec or "slots" not in spec:
            raise SpecFitError("the decode spec needs `method` and `slots`")
        unknown = set(spec) - set(cls.__dataclass_fields__)
        if unknown:
            raise SpecFitError(f"unknown decode spec keys {sorted(unknown)}")
        return cls(**{**spec, "method": MethodConfig(**spec["method"])})


def make_engine(model, slots: int, max_inflight: int = 2, link: dict | None = None, torch_device: str = "cpu"):
    """Offload ``model``'s experts to host memory with ``slots`` device slots per layer (config units: GB/s, us)."""
    from specfit.engine import LinkModel, OffloadConfig, offload_experts

    if link is not None:
        link = LinkModel(link["bandwidth_gbps"] * 1e9, link.get("latency_us", 0.0) * 1e-6)
    config = OffloadConfig(slots, max_inflight=max_inflight, link=link)
    return offload_experts(model, config, device=torch_device)


def eos_ids(model) -> frozenset[int]:
    ids = set()
    for config in (model.config, model.generation_config):
        eos = getattr(config, "eos_token_id", None)
        ids |= set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    return frozenset(ids)


def read_prompts(path, max_requests: int | None) -> list[dict]:
    rows = sorted(pq.read_table(path).to_pylist(), key=lambda r: r["request_id"])
    return rows[:max_requests] if max_requests is not None else rows


class Parts:
    """Finished requests on disk, one Parquet file per request and table, so that a rerun resumes."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def done(self) -> set[int]:
        return {int(p.name.split(".")[0]) for p in self.path.glob("*.requests.parquet")}

    def write(self, request_id: int, tables: dict[str, list[dict]]) -> None:
        for name in ("cycles", "atlas", "requests"):  # requests last: it marks the request finished
            if name in tables:
                write_parquet(pa.Table.from_pylist(tables[name], schema=PARTS[name]), self._file(request_id, name))

    def read(self, name: str, request_ids: list[int]) -> pa.Table:
        files = [self._file(i, name) for i in request_ids]
        return pa.concat_tables([pq.read_table(f) for f in files]) if files else PARTS[name].empty_table()

    def _file(self, request_id: int, name: str) -> Path:
        return self.path / f"{request_id:08d}.{name}.parquet"


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    spec = DecodeSpec.from_dict(spec)
    torch.manual_seed(spec.seed)
    model, _ = load_target(inputs["target"], spec.dtype, "cpu")
    engine = make_engine(model, spec.slots, spec.max_inflight, spec.link, spec.torch_device)
    num_experts = engine.num_experts
    method = build_method(spec.method, inputs, spec.seed, num_experts)
    drafter = None
    if method.drafts:
        if "drafter" not in inputs:
            raise SpecFitError(f"method {spec.method.name} needs the `drafter` input")
        drafter = load_drafter(inputs["drafter"], model, device=spec.torch_device)
    live = method.live
    atlas = atlas_source(getattr(method, "route_source", None))  # routes replayed from an atlas, or None
    if live is not None and "atlas" not in outputs:
        raise SpecFitError("live routes build an atlas: give the `atlas` output")

    prompts = read_prompts(inputs["prompts"], spec.max_requests)
    limits = Limits(spec.limit_tokens, spec.max_new_tokens, eos_ids(model))
    parts = Parts(Path(str(outputs["requests"]) + ".parts"))
    done = parts.done()
    todo = [p for p in prompts if p["request_id"] not in done]
    resumes = read_json(parts.path / "resumes.json") if (parts.path / "resumes.json").exists() else []
    if done and todo:
        resumes.append({"request_id": todo[0]["request_id"], "requests_done": len(done)})
        write_json(resumes, parts.path / "resumes.json")
        log.warning("resuming at request %d: %d requests were finished", todo[0]["request_id"], len(done))

    def decode(prompt: dict, limits: Limits):
        return decode_request(
            model, drafter, method, prompt["prompt_ids"], request_id=prompt["request_id"],
            question_id=prompt["question_id"], limits=limits, engine=engine,
        )

    if todo:  # warm-up: the first request, short; then an empty expert cache and fresh counters
        warmup = Limits(limits.limit_tokens, min(spec.warmup_tokens, limits.max_new_tokens), limits.eos_ids)
        decode(todo[0], warmup)
        engine.clear_cache()
        engine.reset_stats()
        if atlas is not None:
            atlas.reset_counts()
    progress = tqdm(total=len(prompts), initial=len(prompts) - len(todo), unit="req", desc=spec.method.name)
    tokens = seconds = 0.0
    for prompt in todo:
        if live is not None:
            live.rows.clear()  # on disk request by request, not held for the whole stream
        result = decode(prompt, limits)
        tables = {"requests": [result.request], "cycles": result.cycles}
        if live is not None:
            tables["atlas"] = live.rows
        parts.write(prompt["request_id"], tables)
        tokens += result.request["n_output"]
        seconds += result.request["t_request_s"]
        progress.update()
        progress.set_postfix(tok_s=f"{tokens / seconds:.1f}")
    progress.close()

    ids = [p["request_id"] for p in prompts]
    requests, cycles = parts.read("requests", ids), parts.read("cycles", ids)
    metrics = stream_metrics(requests.to_pylist(), cycles, prompts, spec.seed)
    metrics.update(
        method=spec.method.name, slots=spec.slots, link_emulated=engine.link_emulated,
        timing_label=engine.timing_label, resumed=resumes,
    )
    if atlas is not None:  # pool nodes (roots included) of this process's requests; missed: a fallback's routes
        metrics.update(atlas_nodes=atlas.nodes_looked_up, atlas_nodes_missed=atlas.nodes_missed,
                       atlas_nodes_from_earlier_rows=atlas.nodes_from_earlier_rows,
                       atlas_prob_mismatches=atlas.prob_mismatches)
    metrics["lossless"] = None  # this run is the reference, or no AR run is configured beside it
    if "reference" in inputs:
        metrics["lossless"] = lossless_check(model, prompts, requests.to_pylist(), inputs["reference"])
    if live is not None:
        write_parquet(parts.read("atlas", ids), outputs["atlas"])
    write_parquet(requests, outputs["requests"])
    write_parquet(cycles, outputs["cycles"])
    write_json(metrics, outputs["metrics"])
    shutil.rmtree(parts.path)


def stream_metrics(requests: list[dict], cycles: pa.Table, prompts: list[dict] | None = None, seed: int = 0) -> dict:
    """Eq. 10 throughputs and per-cycle means; times in seconds unless the key says ms.

    ``tps_dec_low`` / ``tps_dec_high``: the 95% percentile-bootstrap interval of ``tps_dec`` over requests
    (`specfit.intervals.tps_interval`, seeded by ``seed``). With ``prompts`` (rows with ``request_id`` and
    ``prompt_ids``), cycles are split into fresh ones and ones that start inside a repeated output 4-gram
    (`specfit.ngrams`): ``committed_per_cycle_fresh`` / ``_repeated`` and ``cycles_fresh`` / ``_repeated``
    (None without prompts).
    """
    n = sum(r["n_output"] for r in requests)
    t_req = sum(r["t_request_s"] for r in requests)
    t_dec = t_req - sum(r["t_prefill_s"] for r in requests)
    c = {name: np.asarray(cycles.column(name).to_pylist()) for name in (
        "committed", "accepted", "drafted_levels", "t_draft_s", "t_select_s", "t_verify_s",
    )}
    selected = np.asarray([len(s) for s in cycles.column("selected").to_pylist()])
    pool = np.asarray([len(p) - 1 for p in cycles.column("pool_token").to_pylist()])
    n_cycles = len(selected)

    def mean(x):
        return float(np.mean(x)) if len(x) else None

    interval = tps_interval(requests, seed=seed) if requests and t_dec > 0 else None
    split = dict.fromkeys(("committed_per_cycle_fresh", "committed_per_cycle_repeated", "cycles_fresh",
                           "cycles_repeated"))
    if prompts is not None:
        columns = ("request_id", "prefix_len", "committed")
        split = stream_split(prompts, requests, cycles.select(list(columns)).to_pylist())

    return {
        "n_requests": len(requests),
        "n_output_tokens": n,
        "cycles": n_cycles,
        "tps_dec": (n - len(requests)) / t_dec if t_dec > 0 else None,
        "tps_dec_low": None if interval is None else interval["low"],
        "tps_dec_high": None if interval is None else interval["high"],
        "tps_req": n / t_req if t_req > 0 else None,
        "draft_nodes_per_cycle": mean(selected),
        "pool_nodes_per_cycle": mean(pool),
        "drafted_levels_per_cycle": mean(c["drafted_levels"]),
        "accepted_per_cycle": mean(c["accepted"]),
        "committed_per_cycle": mean(c["committed"]),
        **split,
        "ms_per_cycle": 1e3 * t_dec / n_cycles if n_cycles else None,
        "draft_ms_per_cycle": 1e3 * mean(c["t_draft_s"]) if n_cycles else None,
        "verify_ms_per_cycle": 1e3 * mean(c["t_verify_s"]) if n_cycles else None,
        "select_ms_median": 1e3 * float(np.median(c["t_select_s"])) if n_cycles else None,
        "select_share_pct": 100.0 * float(c["t_select_s"].sum()) / t_dec if t_dec > 0 else None,
        "h2d_per_token": sum(r["h2d_transfers"] for r in requests) / n if n else None,
    }


def lossless_check(model, prompts: list[dict], requests: list[dict], reference_path) -> dict:
    """Compare outputs with an AR reference; at a divergence, the target's top-2 logit margin there."""
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
            "margin": top2_margin(model, prompt_ids[r["request_id"]] + ref[:pos]),
        })
    return {"reference": str(reference_path), "n_requests": compared, "n_identical": identical,
            "missing": len(requests) - compared, "divergences": divergences}


def top2_margin(model, tokens: list[int]) -> float:
    """Top-1 minus top-2 logit of the target's next-token prediction after ``tokens`` (one causal forward)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([tokens], device=model.device)).logits[0, -1].float()  # [V]
    top = logits.topk(2).values
    return float(top[0] - top[1])


main = stage_main(run)

if __name__ == "__main__":
    main()
