"""Paired stage: the sides (method, slots) of one (model, device, workload) timed in one process, request by request.

The decode matrix runs each (method, slots) in its own job, so a ratio between two runs carries whatever the machine
did between the two processes (`specfit.intervals.PROCESS_SPREAD`): a few percent, enough to move a claim's verdict
between a tie and a direction from one rerun to the next. Here every side decodes every prompt in one process on
one loaded target per slot count: the sides take turns (side ``(k + i + r) mod n`` ``k``-th on prompt ``i`` of round
``r``), each request starts from an empty expert cache, after one untimed warm-up request per side. The report
takes the paper's claims from these rows where a cell has them (`specfit.report.sections.claims`), with a paired
bootstrap over (round, request) and no between-process spread. ``python -m specfit.bench paired`` runs the same
loop on any cell from the command line.

spec: names: each side's name, ``method@slots`` with the config's method name (`specfit.workflow.paired_side`);
      sides: one decode spec per side (`specfit.speculative.stream.StreamSpec`: the decode rule's spec of that run),
      all of one model, device and workload; repeats: rounds over the prompts
inputs: prompts, target, drafter (when a side drafts), and each side's own as ``<j>.<name>`` (j: the side's index;
        coefficients, atlas, predictor: `specfit.workflow.decode_inputs`)
outputs: requests (Parquet, `SCHEMA`: one row per side, round and request), metrics (JSON: per side its decode TPS
         with its interval, outputs identical to the first side's, and the emulated device's virtual clock)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow as pa
import torch

from specfit.engine import OffloadEngine
from specfit.errors import SpecFitError
from specfit.intervals import round_id, tps_interval
from specfit.io import write_json, write_parquet
from specfit.models import check_checkpoints, eos_ids
from specfit.records import REQUEST_SCHEMA, read_prompts
from specfit.selection.search import compile_kernels
from specfit.speculative.methods import Method, build_method
from specfit.speculative.request import Limits, decode_request
from specfit.speculative.stream import StreamSpec, drafter_beside, offloaded_target
from specfit.stage import stage_main
from specfit.workflow import PAIRED_SHARED

log = logging.getLogger(__name__)

SCHEMA = pa.schema([("side", pa.string()), ("slots", pa.int64()), ("round", pa.int64()), *REQUEST_SCHEMA])
PREFETCH = ("issued", "used", "evicted_unused", "idle", "hidden_ms")  # OffloadEngine.stats()["prefetch"], summed


@dataclass
class Target:
    """The offloaded target at one slot count, with the drafter when a side drafts: sides at that count share it."""

    model: torch.nn.Module
    engine: OffloadEngine
    drafter: torch.nn.Module | None


@dataclass
class Side:
    name: str
    slots: int
    method: Method
    target: Target
    requests: list[dict] = field(default_factory=list)  # timed rows, with their round
    cycles: list[dict] = field(default_factory=list)
    prefetch: dict = field(default_factory=lambda: dict.fromkeys(PREFETCH, 0.0))  # summed over its requests
    stall_s: float = 0.0  # emulated device: copy time on its verify forwards' critical path


def load_sides(names: list[str], specs: list[StreamSpec], inputs: list[dict]) -> list[Side]:
    """Each side's method on the target at its slot count (one target, engine and drafter per count); ``inputs``:
    each side's decode inputs."""
    first = specs[0]
    if any((s.model, s.torch_device, s.dtype, s.link, s.emulate, s.limit_tokens, s.max_new_tokens)
           != (first.model, first.torch_device, first.dtype, first.link, first.emulate, first.limit_tokens,
               first.max_new_tokens) for s in specs):
        raise SpecFitError("paired sides must share the model, device, precision and workload limits")
    if len(set(names)) != len(names) or len(names) != len(specs):
        raise SpecFitError(f"paired sides need one distinct name each: {names}")
    targets: dict[int, Target] = {}
    drafter_path = next((i["drafter"] for i in inputs if "drafter" in i), None)
    check_checkpoints(inputs[0]["target"], drafter_path, first.model)  # configs and headers, before any weight
    for s in specs:
        if s.slots not in targets:
            model, _, engine = offloaded_target(s, inputs[0]["target"])
            drafter = None if drafter_path is None else drafter_beside(s, drafter_path, model, engine)
            targets[s.slots] = Target(model, engine, drafter)
    return [Side(name, s.slots, build_method(s.method, i, s.seed, targets[s.slots].engine.num_experts),
                 targets[s.slots]) for name, s, i in zip(names, specs, inputs)]


def decode(side: Side, prompt: dict, limits: Limits):
    """One request of ``side`` from an empty expert cache."""
    t = side.target
    t.engine.clear_cache()
    return decode_request(t.model, t.drafter if side.method.drafts else None, side.method, prompt["prompt_ids"],
                          request_id=prompt["request_id"], question_id=prompt["question_id"], limits=limits,
                          engine=t.engine)


def time_sides(sides: list[Side], prompts: list[dict], limits: Limits, repeats: int, warmup_tokens: int = 8) -> None:
    """Every side decodes every prompt ``repeats`` times, taking turns, after one untimed warm-up request each; each
    side keeps its rows, cycles, prefetch counters and copy stall."""
    compile_kernels()
    with torch.inference_mode():
        warmup = Limits(limits.limit_tokens, min(warmup_tokens, limits.max_new_tokens), limits.eos_ids)
        for side in sides:
            decode(side, prompts[0], warmup)
            side.method.reset()
        for engine in {id(s.target.engine): s.target.engine for s in sides}.values():
            engine.reset_stats()
        n = len(sides)
        for round_ in range(repeats):
            for i, prompt in enumerate(prompts):
                for k in range(n):
                    side = sides[(k + i + round_) % n]
                    engine = side.target.engine
                    before = engine.stats()
                    result = decode(side, prompt, limits)
                    after = engine.stats()
                    for key in PREFETCH:
                        side.prefetch[key] += after["prefetch"][key] - before["prefetch"][key]
                    if "device" in after:
                        side.stall_s += after["device"]["copy_stall_s"] - before["device"]["copy_stall_s"]
                    side.requests.append({"side": side.name, "slots": side.slots, "round": round_,
                                          **result.request})
                    side.cycles += result.cycles


def side_inputs(inputs: dict, n: int) -> list[dict]:
    """Each side's decode inputs: the shared ones and its own ``<j>.<name>`` as ``<name>``."""
    shared = {k: v for k, v in inputs.items() if k in PAIRED_SHARED}
    return [{**shared, **{k.partition(".")[2]: v for k, v in inputs.items() if k.partition(".")[0] == str(j)}}
            for j in range(n)]


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    specs = [StreamSpec.from_dict(s) for s in spec["sides"]]
    if len(specs) < 2 or spec["repeats"] < 1:
        raise SpecFitError("paired: give two or more sides and at least one round (paired.repeats)")
    torch.manual_seed(specs[0].seed)
    sides = load_sides(spec["names"], specs, side_inputs(inputs, len(specs)))
    prompts = read_prompts(inputs["prompts"], specs[0].max_requests)
    limits = Limits(specs[0].limit_tokens, specs[0].max_new_tokens, eos_ids(sides[0].target.model))
    time_sides(sides, prompts, limits, spec["repeats"], specs[0].warmup_tokens)
    rows = [r for side in sides for r in side.requests]
    write_parquet(pa.Table.from_pylist(rows, schema=SCHEMA), outputs["requests"])
    metrics = summary(sides, prompts, spec["repeats"], specs[0].seed)
    for name, side in metrics["sides"].items():
        if side["identical_to_first"] < len(side_rows := [r for r in rows if r["side"] == name]):
            log.warning("%s: %d of %d outputs differ from %s's (greedy decoding should be lossless; the decode "
                        "runs' lossless check gives each divergence's logit margin)", name,
                        len(side_rows) - side["identical_to_first"], len(side_rows), sides[0].name)
    write_json(metrics, outputs["metrics"])


def summary(sides: list[Side], prompts: list[dict], repeats: int, seed: int) -> dict:
    """metrics.json: per side its decode TPS with its interval, how many outputs equal the first side's (greedy
    decoding is lossless: all of them), and the emulated device's counters of its target."""
    reference = [r["output_ids"] for r in sides[0].requests]
    out = {"sides": {}, "requests": len(prompts), "repeats": repeats,
           "timing_label": sides[0].target.engine.timing_label, "link_emulated": sides[0].target.engine.link_emulated}
    for side in sides:
        device = side.target.engine.stats().get("device")
        out["sides"][side.name] = {
            "slots": side.slots,
            "tps_dec": tps_interval([round_id(r) for r in side.requests], seed=seed),
            "identical_to_first": sum(r["output_ids"] == o for r, o in zip(side.requests, reference)),
            "cycles": len(side.cycles), "copy_stall_s": side.stall_s, "prefetch": side.prefetch,
            "device": device,  # its target's, shared with the sides at the same slot count
        }
    return out


main = stage_main(run)

if __name__ == "__main__":
    main()
