"""The config-to-stage contract: each rule's spec, the slice of the workflow config it passes its stage as
``--spec`` (`specfit.planning.stage`).

One function per rule: the validated config and the job's wildcards by name in, the spec dict out. The rules call
them through rules/common.smk's ``spec`` (the wildcards as keywords, the dict as `specfit.planning.specs.spec_json`),
and the tests call them for the spec a stage gets. No stage imports this module: a spec reaches its rule as params, so
an edit here reruns exactly the jobs whose spec it changes, while the stage's code hash
(`specfit.planning.code.code_hash`) follows only the code the stage runs.
"""

from __future__ import annotations

import json
from typing import Any

from specfit.planning import paths
from specfit.planning.matrix import (
    DecodeRun,
    decode_runs,
    evaluated_ids,
    evaluated_question_ids,
    fold_ids,
    method_config,
    predictor_question_ids,
    theory_cost,
    theory_file,
    theory_runs,
    tune_question_ids,
    tuned_slots,
    workload_ids,
)
from specfit.questions import workload_source
from specfit.speculative.sampling import KEYS as SAMPLING_KEYS


def spec_bench(config: dict) -> dict:
    """Rule spec_bench: where Spec-Bench's question.jsonl is fetched from and its checksum."""
    return {k: config["spec_bench"][k] for k in ("url", "sha256")}


def extract(config: dict, model: str, workload: str) -> dict:
    """Rule extract: the question ids and length limits of a workload's prompts, or of the calibration's or the
    route predictor's (``workload`` "calibration" or "predictor"). ``model`` names the tokenizer's config key.

    A workload over Spec-Bench (the default source) has no source in its spec; one over another dataset adds its
    name and its source (`specfit.questions.workload_source`)."""
    source = None
    if workload == "calibration":
        ids, limit, requests = config["calibration"]["question_ids"], config["calibration"]["limit_tokens"], None
    elif workload == "predictor":
        ids, limit, requests = predictor_question_ids(config), config["predictor"]["limit_tokens"], None
    else:
        wl = config["workloads"][workload]
        ids, limit, requests = workload_ids(config, workload), wl["limit_tokens"], wl["max_requests"]
        source = workload_source(config, workload)
    spec = {"model": model, "question_ids": ids, "limit_tokens": limit, "max_requests": requests}
    if source is not None:
        spec.update(workload=workload, source=source)
    return spec


def extract_tune(config: dict, model: str, workload: str, fold: str = "") -> dict:
    """Rule extract_tune: `extract`'s spec for the questions a tuned method's tree is chosen on
    (`specfit.planning.matrix.tune_question_ids`), all of them; ``fold``: the rule's wildcard (".fold1", or empty
    without cross-fitting)."""
    return {**extract(config, model, workload), "question_ids": tune_question_ids(config, workload, _fold(fold)),
            "max_requests": None}


def _fold(wildcard: str) -> int | None:
    """A ``{fold}`` wildcard's fold: ".fold1" -> 1, "" -> None (`specfit.planning.paths.fold_part`)."""
    return int(wildcard.removeprefix(".fold")) if wildcard else None


def toy(config: dict, part: str) -> dict:
    """Rules toy_tokenizer, toy_target and toy_drafter: ``toy.<part>``, the config's seed, the torch threads the
    target and drafter train with (``train_threads``), and every question id a workload evaluates or calibration
    probes (`specfit.planning.matrix.evaluated_question_ids`): the toy never trains on those."""
    threads = {} if part == "tokenizer" else {"threads": config["train_threads"]}
    return {**config["toy"][part], "seed": config["seed"], **threads,
            "exclude_question_ids": evaluated_question_ids(config)}


def _engine(config: dict, model: str, device: str, link, emulate) -> dict:
    """The model's precision and the engine it runs on: the device, its copies in flight, its emulated link or GPU."""
    dev, mod = config["devices"][device], config["models"][model]
    return {"model": model, "dtype": mod["dtype"], "logits_dtype": mod["logits_dtype"], "verify": mod["verify"],
            "torch_device": dev["torch_device"], "max_inflight": dev["max_inflight"], "link": link, "emulate": emulate}


def _emulated(dev: dict) -> dict | None:
    """A device entry's emulation: its emulated GPU, or a resident device's measurements as {resident: ...}
    (`specfit.engine.offload.make_engine`), so that no other device's spec holds a key of it."""
    return {"resident": dev["resident"]} if dev.get("resident") is not None else dev["emulate"]


def calibrate(config: dict, model: str, device: str, cache: str) -> dict:
    """Rule calibrate: the model's precision, the device, and the calibration protocol; with the cache
    (``cache`` "cache") at the model's main slot count on the device, without it at 0 slots."""
    dev, mod = config["devices"][device], config["models"][model]
    return {
        **_engine(config, model, device, dev["link"], _emulated(dev)),
        "coefficients": dev["coefficients"],
        "slots": mod["main_slots"][device] if cache == "cache" else 0,
        # the question ids reach the stage as its prompts input
        "protocol": {k: v for k, v in config["calibration"].items() if k != "question_ids"},
        "seed": config["seed"],
    }


def method_entry(config: dict, method: str) -> dict:
    """A method's config entry as `specfit.speculative.config.MethodConfig` takes it: its ``kind`` is the name.
    Only the keys the entry sets (the stage fills the defaults), so a default it does not use reruns nothing."""
    entry = dict(config["methods"][method])
    return {"name": entry.pop("kind"), **entry}


def _limits(config: dict, workload: str) -> dict:
    """A workload's decode limits: input + output tokens per request, and output tokens (the limit when unset)."""
    wl = config["workloads"][workload]
    limits = {"limit_tokens": wl["limit_tokens"], "max_new_tokens": wl["max_new_tokens"] or wl["limit_tokens"]}
    return {**limits, **sampling_spec(wl)}


def sampling_spec(keys: dict) -> dict:
    """A stream's ``sampling`` key from a workload's (or a call's) sampling keys; none at T = 0, so that a greedy
    run's spec, and so its jobs, stay what they were before sampling existed."""
    if not keys.get("temperature"):
        return {}
    return {"sampling": {k: keys[k] for k in SAMPLING_KEYS if keys.get(k) is not None}}


def _stream(config: dict, model: str, device: str, limits: dict, method: str, slots: int, link, emulate) -> dict:
    """What the decode and atlas stages share (`specfit.speculative.stream.StreamSpec`)."""
    return {
        **_engine(config, model, device, link, emulate),
        "method": method_entry(config, method),
        "slots": slots,
        **limits,
        "seed": config["seed"],
    }


def decode(config: dict, model: str, device: str, workload: str, method: str, slots: int | str) -> dict:
    """Rule decode: one run of the decode matrix, over the device's link or emulated device (or neither)."""
    dev = config["devices"][device]
    return _stream(config, model, device, _limits(config, workload), method, int(slots), dev["link"], _emulated(dev))


def tune(config: dict, model: str, device: str, workload: str, method: str, fold: str = "") -> dict:
    """Rule tune: the tuned method's decode spec at each slot count it runs at in the cell (a user tunes the tree on
    their device, with their cache; `specfit.planning.matrix.tuned_slots`), the grid of trees
    (`specfit.speculative.tuning.grid`) and the questions the chosen tree will decode (under cross-fitting, fold
    ``fold``'s; else all the workload evaluates)."""
    from specfit.speculative.tuning import grid  # torch-free

    f = _fold(fold)
    decodes = evaluated_ids(config, workload) if f is None else fold_ids(config, workload, f)
    streams = {str(s): decode(config, model, device, workload, method, s)
               for s in tuned_slots(config, model, device, workload, method)}
    return {"streams": streams, "trees": grid(config["tune"]), "decodes": decodes}


def tune_choice(config: dict, model: str, device: str, workload: str, method: str, slots, fold: str = "") -> dict:
    """Rule tune_choice: the slot count whose part of the tune job's sweep it writes."""
    return {"slots": int(slots)}


def generate(config: dict, model: str, device: str, method: str, slots: int, limit_tokens: int,
             max_new_tokens: int, sampling: dict | None = None) -> dict:
    """Not a rule: `specfit generate` (`specfit.api.Decoder.from_config`), a decode run's spec with the caller's
    limits and sampling keys in place of a workload's."""
    dev = config["devices"][device]
    limits = {"limit_tokens": limit_tokens, "max_new_tokens": max_new_tokens, **sampling_spec(sampling or {})}
    return _stream(config, model, device, limits, method, int(slots), dev["link"], _emulated(dev))


def atlas(config: dict, model: str, device: str, workload: str, method: str, cache: str | None = None) -> dict:
    """Rule atlas: the method's stream with the slots of the device's with-cache runs (the most its memory is
    known to hold; routes do not depend on what the cache holds) and without the emulated link or device: the build
    is off the measured cache and timers. ``cache`` picks the coefficients the build selects with (an input), so both
    variants of a method have this spec."""
    slots = config["models"][model]["main_slots"][device]
    return _stream(config, model, device, _limits(config, workload), method, slots, link=None, emulate=None)


def predictor_device(config: dict, model: str) -> str:
    """The device the model's first decode run uses: the route predictor trains and is timed there."""
    return next(r.device for r in decode_runs(config) if r.model == model)


def predictor(config: dict, model: str) -> dict:
    """Rule predictor: the model's precision, the device it trains on, the pool shape of ``predictor.method``,
    and the training protocol."""
    p, mod = config["predictor"], config["models"][model]
    drafting = method_config(config, p["method"])
    return {
        "model": model,
        "dtype": mod["dtype"],
        "logits_dtype": mod["logits_dtype"],
        "verify": mod["verify"],
        "torch_device": config["devices"][predictor_device(config, model)]["torch_device"],
        "limit_tokens": p["limit_tokens"],
        "max_new_tokens": p["max_new_tokens"],
        "k_max": drafting.k_max,
        "max_depth": drafting.max_depth,
        "top_k_expand": drafting.top_k_expand,
        "validation_requests": p["validation_requests"],
        "steps": p["steps"],
        "batch_size": p["batch_size"],
        "lr": p["lr"],
        "seed": config["seed"],
        "threads": config["train_threads"],
    }


def theory_run(config: dict, model: str, device: str, workload: str, method: str | None = None) -> DecodeRun:
    """The run whose Table 5 a theory job writes: the paper SpecFit's (rule theory, no ``method``), or the
    method's its file names (rule theory_cache_aware)."""
    path = paths.theory(model, device, workload, method)
    return next(r for r in theory_runs(config) if theory_file(config, r) == path)


def theory(config: dict, model: str, device: str, workload: str, method: str | None = None) -> dict:
    """Rules theory and theory_cache_aware: ``theory`` with the run's pool shape, limits and cost model."""
    run = theory_run(config, model, device, workload, method)
    drafting = method_config(config, run.method)
    return {
        **config["theory"],
        "k_max": drafting.k_max,
        "max_depth": drafting.max_depth,
        # the decode run's limits: each cycle's depth cap near the length limit
        **_limits(config, workload),
        # "paper" (b + β F) for SpecFit, "cache_aware" for specfit-ca and specfit-prefetch (beyond the paper)
        "cost": theory_cost(config, run),
    }


def report(config: dict) -> dict:
    """Rule report: what the report names and groups runs by."""
    return {k: config[k] for k in ("workloads", "models", "devices", "methods", "runs", "seed")}


def spec_json(obj: Any) -> str:
    """A config slice as rule params: sorted keys, so equal slices compare equal across runs."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
