"""A method's timed request stream on the offloaded target (paper Section 4, Appendix B): what the decode stage
runs, and the atlas stage with live routes. A job's walk: `run_stream` loads and warms up through
`specfit.speculative.loading`, decodes the requests here (`stream`, each through
`specfit.speculative.request.Session`), summarises them in `specfit.results.summary` and writes the records.

Inputs: ``prompts`` (Parquet: `specfit.results.records.PROMPTS_SCHEMA`), ``target`` and ``drafter`` (checkpoint
folders; no drafter for AR), ``coefficients`` and ``atlas`` or ``predictor`` (SpecFit only, by route source) and
``reference`` (an AR requests.parquet, optional: the lossless check). Outputs: ``requests`` and ``cycles``
(Parquet, `specfit.results.records`), ``metrics`` (JSON, `specfit.results.summary`) and, with live routes,
``atlas``.

Spec (the rule's config slice)::

    method:        a method entry, see `specfit.speculative.config.MethodConfig`
    slots:         expert slots per MoE layer (0: no expert cache)
    max_inflight:  host-to-device copies in flight
    link:          null, or {bandwidth_gbps: GB/s, latency_us: us}: an emulated link for CPU-only machines
    emulate:       null, or an emulated GPU for CPU-only machines (`specfit.engine.device.DeviceModel`)
    model:         the model's name in config.yaml (errors name models.<model>.target / .drafter)
    torch_device:  "cpu" | "cuda"       dtype: "float32" | "bfloat16" | "float16"
    logits_dtype:  "model" | "float32" (final norm and LM head in fp32, see `specfit.models.precision`)
    verify:        "exact" | "batched" (every tree row as AR's step, see `specfit.speculative.exact`)
    limit_tokens:  input + output tokens per request     max_new_tokens: output tokens per request
    max_requests:  null (all prompts) or the first n     seed: fixes everything stochastic
    warmup_tokens: output tokens of the warm-up request

Each finished request is kept at once in ``{requests}.parts/`` (written atomically), and a rerun of the same
stream after a crash resumes from there (`Parts`); metrics.json says so, as the expert cache a resumed stream starts
with is empty.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from specfit.errors import SpecFitError
from specfit.io import read_json, write_json, write_parquet
from specfit.models import eos_ids
from specfit.results.records import ATLAS_SCHEMA, CYCLE_SCHEMA, REQUEST_SCHEMA, read_prompts
from specfit.results.summary import stream_summary
from specfit.speculative.config import MethodConfig
from specfit.speculative.loading import Loaded, load
from specfit.speculative.request import Limits
from specfit.speculative.sampling import Sampling

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
    verify: str  # "exact" or "batched" (`specfit.speculative.exact`)
    limit_tokens: int
    max_new_tokens: int
    seed: int
    model: str  # the model's name in config.yaml: errors name `models.<model>.target` / `.drafter`
    max_requests: int | None = None  # the workload's subset is already cut at extraction; this is for tests
    warmup_tokens: int = 8  # output tokens of the warm-up request
    sampling: dict | None = None  # `specfit.speculative.sampling.Sampling`'s keys at T > 0; None: greedy

    @classmethod
    def from_dict(cls, spec: dict) -> StreamSpec:
        names = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING}
        missing, unknown = required - set(spec), set(spec) - names
        if missing or unknown:
            raise SpecFitError(f"decode spec: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
        return cls(**{**spec, "method": MethodConfig(**spec["method"])})


class Parts:
    """Finished requests on disk, one Parquet file per request and table, so that a rerun resumes.

    They resume only the stream that wrote them: ``stream.json`` holds that stream's `fingerprint`. Parts of another
    (the config changed after a crash, or an input was remade) are moved aside to ``{path}.replaced``, with a
    warning, and the stream starts over."""

    def __init__(self, path: Path, fingerprint: str = ""):
        self.path = path
        mark = path / "stream.json"
        if path.is_dir() and (not mark.is_file() or read_json(mark).get("fingerprint") != fingerprint):
            aside = path.with_name(path.name + ".replaced")
            shutil.rmtree(aside, ignore_errors=True)
            path.rename(aside)
            log.warning("%s holds requests of another stream (its spec or inputs differ): moved to %s; starting "
                        "over", path, aside)
        path.mkdir(parents=True, exist_ok=True)
        if not mark.is_file():
            write_json({"fingerprint": fingerprint}, mark)

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


def fingerprint(spec: StreamSpec, inputs: dict) -> str:
    """What a stream's finished requests depend on: its spec, and each input's path, size and modification time (an
    input remade since, such as a retrained checkpoint, is another stream)."""
    stats = {name: [[str(p), *((st.st_size, st.st_mtime_ns) if (st := _stat(p)) else ())]
                    for p in ([path] if isinstance(path, str | os.PathLike) else path)]
             for name, path in sorted(inputs.items())}
    fields_ = dataclasses.asdict(spec)
    if fields_["sampling"] is None:  # greedy: the fingerprint of a stream from before sampling existed
        del fields_["sampling"]
    text = json.dumps({"spec": fields_, "inputs": stats}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _stat(path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def run_stream(spec: StreamSpec, inputs: dict, outputs: dict,
               prepare: Callable[[Loaded], None] | None = None) -> None:
    """Decode every prompt with ``spec.method``, after an untimed warm-up request; write the records. Loading and
    warm-up: `specfit.speculative.loading`; the stream: `stream`; the metrics: `specfit.results.summary`.
    ``prepare``: called with what was loaded before the stream starts (a benchmark's change to the method)."""
    torch.manual_seed(spec.seed)
    loaded = load(spec, inputs, outputs)
    if prepare is not None:
        prepare(loaded)
    prompts = read_prompts(inputs["prompts"], spec.max_requests)
    parts = Parts(Path(str(outputs["requests"]) + ".parts"), fingerprint(spec, inputs))
    resumes = stream(loaded, spec, prompts, parts)

    ids = [p["request_id"] for p in prompts]
    requests, cycles = parts.read("requests", ids), parts.read("cycles", ids)
    metrics = stream_summary(loaded, spec, prompts, requests, cycles, resumes, inputs.get("reference"))
    if loaded.live is not None:
        write_parquet(parts.read("atlas", ids), outputs["atlas"])
    write_parquet(requests, outputs["requests"])
    write_parquet(cycles, outputs["cycles"])
    write_json(metrics, outputs["metrics"])
    shutil.rmtree(parts.path)


def stream(loaded: Loaded, spec: StreamSpec, prompts: list[dict], parts: Parts) -> list[dict]:
    """Decode the prompts that ``parts`` does not hold yet (a crashed run's finished requests are kept), after an
    untimed warm-up request, keeping each request in ``parts`` as it finishes. Returns the resumes so far: where
    each rerun after a crash picked up."""
    limits = Limits(spec.limit_tokens, spec.max_new_tokens, eos_ids(loaded.model), Sampling.of(spec.sampling))
    done = parts.done()
    todo = [p for p in prompts if p["request_id"] not in done]
    resumes = read_json(parts.path / "resumes.json") if (parts.path / "resumes.json").exists() else []
    if done and todo:
        resumes.append({"request_id": todo[0]["request_id"], "requests_done": len(done)})
        write_json(resumes, parts.path / "resumes.json")
        log.warning("resuming at request %d: %d requests were finished", todo[0]["request_id"], len(done))

    if todo:  # warm-up: the first request, short
        loaded.warm_up(todo[0], limits, spec.warmup_tokens)
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
