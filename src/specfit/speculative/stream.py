"""A method's timed request stream on the offloaded target (paper Section 4, Appendix B): what the decode stage
runs, and the atlas stage with live routes.

Inputs: ``prompts`` (Parquet: `specfit.results.records.PROMPTS_SCHEMA`), ``target`` and ``drafter`` (checkpoint folders; no
drafter for AR), ``coefficients`` and ``atlas`` or ``predictor`` (SpecFit only, by route source) and ``reference``
(an AR requests.parquet, optional: the lossless check). Outputs: ``requests`` and ``cycles`` (Parquet,
`specfit.results.records`), ``metrics`` (JSON, `specfit.results.metrics`) and, with live routes, ``atlas``.

Spec (the rule's config slice)::

    method:        a method entry, see `specfit.speculative.config.MethodConfig`
    slots:         expert slots per MoE layer (0: no expert cache)
    max_inflight:  host-to-device copies in flight
    link:          null, or {bandwidth_gbps: GB/s, latency_us: us}: an emulated link for CPU-only machines
    emulate:       null, or an emulated GPU for CPU-only machines (`specfit.engine.device.DeviceModel`)
    model:         the model's name in config.yaml (errors name models.<model>.target / .drafter)
    torch_device:  "cpu" | "cuda"       dtype: "float32" | "bfloat16" | "float16"
    logits_dtype:  "model" | "float32" (final norm and LM head in fp32, see `specfit.models.precision`)
    limit_tokens:  input + output tokens per request     max_new_tokens: output tokens per request
    max_requests:  null (all prompts) or the first n     seed: fixes everything stochastic
    warmup_tokens: output tokens of the warm-up request

Each finished request is kept at once in ``{requests}.parts/`` (written atomically), and a rerun after a crash
resumes from there; metrics.json says so, as the expert cache a resumed stream starts with is empty.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from specfit.engine.offload import OffloadEngine, make_engine
from specfit.errors import SpecFitError
from specfit.io import read_json, write_json, write_parquet
from specfit.models import Eagle3Drafter, check_checkpoints, eos_ids, load_drafter, load_target
from specfit.results.metrics import stream_metrics
from specfit.results.records import ATLAS_SCHEMA, CYCLE_SCHEMA, REQUEST_SCHEMA, read_prompts
from specfit.selection.search import compile_kernels
from specfit.speculative.config import MethodConfig
from specfit.speculative.learned import LearnedRoutes
from specfit.speculative.methods import Method, build_method
from specfit.speculative.request import Limits, decode_cycles, decode_request
from specfit.speculative.routes import AtlasRoutes, LiveRoutes, find_source

log = logging.getLogger(__name__)

PARTS = {"requests": REQUEST_SCHEMA, "cycles": CYCLE_SCHEMA, "atlas": ATLAS_SCHEMA}


@dataclass(frozen=True)
class StreamSpec:
    """A decode or atlas rule's spec. The rule passes every key; the optional ones have a fixed meaning here."""

    method: MethodConfig
    slots: int
    max_inflight: int
    link: dict | None
    emulate: dict | None
    torch_device: str
    dtype: str
    logits_dtype: str  # "model" or "float32" (`specfit.models.precision`)
    limit_tokens: int
    max_new_tokens: int
    seed: int
    model: str  # the model's name in config.yaml: errors name `models.<model>.target` / `.drafter`
    max_requests: int | None = None  # the workload's subset is already cut at extraction; this is for tests
    warmup_tokens: int = 8  # output tokens of the warm-up request

    @classmethod
    def from_dict(cls, spec: dict) -> StreamSpec:
        names = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING}
        missing, unknown = required - set(spec), set(spec) - names
        if missing or unknown:
            raise SpecFitError(f"decode spec: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
        return cls(**{**spec, "method": MethodConfig(**spec["method"])})


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


def run_stream(spec: StreamSpec, inputs: dict, outputs: dict) -> None:
    """Decode every prompt with ``spec.method``, after an untimed warm-up request; write the records."""
    torch.manual_seed(spec.seed)
    loaded = load(spec, inputs, outputs)
    prompts = read_prompts(inputs["prompts"], spec.max_requests)
    parts = Parts(Path(str(outputs["requests"]) + ".parts"))
    resumes = stream(loaded, spec, prompts, parts)

    ids = [p["request_id"] for p in prompts]
    requests, cycles = parts.read("requests", ids), parts.read("cycles", ids)
    metrics = summarize(loaded, spec, prompts, requests, cycles, resumes, inputs.get("reference"))
    if loaded.live is not None:
        write_parquet(parts.read("atlas", ids), outputs["atlas"])
    write_parquet(requests, outputs["requests"])
    write_parquet(cycles, outputs["cycles"])
    write_json(metrics, outputs["metrics"])
    shutil.rmtree(parts.path)


@dataclass
class Loaded:
    """What a stream decodes with: the offloaded target, the method and its drafter, and the method's route
    sources that count what they answer."""

    model: torch.nn.Module
    engine: OffloadEngine
    method: Method
    drafter: Eagle3Drafter | None  # None for a method that does not draft (AR)
    live: LiveRoutes | None  # routes of the target itself, kept as atlas rows (the atlas build)
    atlas: AtlasRoutes | None  # routes replayed from an atlas
    learned: LearnedRoutes | None  # routes from a route predictor
    tokenizer: PreTrainedTokenizerBase  # the target's (`specfit.api` renders and detokenizes with it)

    def decode(self, prompt: dict, limits: Limits):
        return decode_request(
            self.model, self.drafter, self.method, prompt["prompt_ids"], request_id=prompt["request_id"],
            question_id=prompt["question_id"], limits=limits, engine=self.engine,
        )

    def decode_cycles(self, prompt: dict, limits: Limits):
        """`decode` as it goes (`specfit.speculative.request.decode_cycles`): each step's committed tokens."""
        return decode_cycles(
            self.model, self.drafter, self.method, prompt["prompt_ids"], request_id=prompt["request_id"],
            question_id=prompt["question_id"], limits=limits, engine=self.engine,
        )

    def warm_up(self, prompt: dict, limits: Limits) -> None:
        """Compile the selector's kernels and decode ``prompt`` untimed, then start over: an empty expert cache and
        fresh counters."""
        compile_kernels()
        self.decode(prompt, limits)
        self.reset()

    def reset(self) -> None:
        """An empty expert cache, fresh engine counters, and a method and route sources that forget earlier requests."""
        self.engine.clear_cache()
        self.engine.reset_stats()
        self.method.reset()
        for source in (self.atlas, self.learned):
            if source is not None:
                source.reset_counts()


def offloaded_target(spec: StreamSpec, path) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, OffloadEngine]:
    """The target checkpoint at ``path`` on the offload engine at ``spec.slots`` (its experts on the host)."""
    model, tokenizer = load_target(path, spec.dtype, "cpu", key=f"models.{spec.model}.target",
                                   logits_dtype=spec.logits_dtype)
    return model, tokenizer, make_engine(model, spec.slots, spec.max_inflight, spec.link, spec.torch_device,
                                         spec.emulate)


def drafter_beside(spec: StreamSpec, path, model, engine: OffloadEngine) -> Eagle3Drafter:
    """The drafter checkpoint at ``path`` for ``model``, its forwards timed by ``engine``'s emulated device if any."""
    drafter = load_drafter(path, model, device=spec.torch_device, key=f"models.{spec.model}.drafter")
    engine.emulate_drafter(drafter)
    return drafter


def load(spec: StreamSpec, inputs: dict, outputs: dict) -> Loaded:
    """The target offloaded as ``spec`` says, the method and, if it drafts, the drafter; checkpoints are checked
    from their configs and headers before any weight is read."""
    check_checkpoints(inputs["target"], inputs.get("drafter"), spec.model)  # configs and headers, before any weight
    model, tokenizer, engine = offloaded_target(spec, inputs["target"])
    method = build_method(spec.method, inputs, spec.seed, engine.num_experts)
    drafter = None
    if method.drafts:
        if "drafter" not in inputs:
            raise SpecFitError(f"method {spec.method.name} needs the `drafter` input")
        drafter = drafter_beside(spec, inputs["drafter"], model, engine)
    if method.live is not None and "atlas" not in outputs:
        raise SpecFitError("live routes build an atlas: give the `atlas` output")
    source = getattr(method, "route_source", None)
    return Loaded(model, engine, method, drafter, live=method.live, atlas=find_source(source, AtlasRoutes),
                  learned=find_source(source, LearnedRoutes), tokenizer=tokenizer)


def stream(loaded: Loaded, spec: StreamSpec, prompts: list[dict], parts: Parts) -> list[dict]:
    """Decode the prompts that ``parts`` does not hold yet (a crashed run's finished requests are kept), after an
    untimed warm-up request, keeping each request in ``parts`` as it finishes. Returns the resumes so far: where
    each rerun after a crash picked up."""
    limits = Limits(spec.limit_tokens, spec.max_new_tokens, eos_ids(loaded.model))
    done = parts.done()
    todo = [p for p in prompts if p["request_id"] not in done]
    resumes = read_json(parts.path / "resumes.json") if (parts.path / "resumes.json").exists() else []
    if done and todo:
        resumes.append({"request_id": todo[0]["request_id"], "requests_done": len(done)})
        write_json(resumes, parts.path / "resumes.json")
        log.warning("resuming at request %d: %d requests were finished", todo[0]["request_id"], len(done))

    if todo:  # warm-up: the first request, short
        loaded.warm_up(todo[0], Limits(limits.limit_tokens, min(spec.warmup_tokens, limits.max_new_tokens),
                                       limits.eos_ids))
    progress = tqdm(total=len(prompts), initial=len(prompts) - len(todo), unit="req", desc=spec.method.name)
    tokens = seconds = 0.0
    live = loaded.live
    for prompt in todo:
        if live is not None:
            live.rows.clear()  # on disk request by request, not held for the whole stream
        result = loaded.decode(prompt, limits)
        tables = {"requests": [result.request], "cycles": result.cycles}
        if live is not None:
            tables["atlas"] = live.rows
        parts.write(prompt["request_id"], tables)
        tokens += result.request["n_output"]
        seconds += result.request["t_request_s"]
        progress.update()
        progress.set_postfix(tok_s=f"{tokens / seconds:.1f}")
    progress.close()
    return resumes


def summarize(loaded: Loaded, spec: StreamSpec, prompts: list[dict], requests: pa.Table, cycles: pa.Table,
              resumes: list[dict], reference=None) -> dict:
    """The stream's metrics.json: `specfit.results.metrics.stream_metrics` with the engine's and the route sources'
    counters, and the lossless check against the ``reference`` AR run's requests (when given)."""
    engine, stats = loaded.engine, loaded.engine.stats()
    metrics = stream_metrics(requests.to_pylist(), cycles, prompts, spec.seed)
    metrics.update(
        method=spec.method.name, slots=spec.slots, slot_rows_allocated=slot_rows(engine),
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
        metrics["lossless"] = lossless_check(loaded.model, prompts, requests.to_pylist(), reference)
    return metrics


def slot_rows(engine) -> int:
    """Expert slot rows the engine allocated on the device, over all layers (a buffer shared by layers once)."""
    buffers = {id(layer.slots): layer.rows for layer in engine.layers}
    return sum(buffers.values())


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
