# Target lists, config slices and wildcard constraints. File names come from specfit.paths, the logic from
# specfit.workflow (both tested there).
import shlex

from specfit import paths
from specfit.questions import workload_source
from specfit.workflow import (
    DecodeRun,
    code_hash,
    decode_inputs as workflow_decode_inputs,
    decode_runs,
    evaluated_question_ids,
    method_config,
    predictor_question_ids,
    reference_run,
    spec_json,
    theory_cost,
    theory_file,
    theory_runs,
    workload_ids,
)

CONDA_ENV = "../envs/specfit.yaml"
RUNS = decode_runs(config)


wildcard_constraints:
    model="|".join(config["models"]),
    device="|".join(config["devices"]),
    workload="|".join(config["workloads"]),
    method="|".join(config["methods"]),
    slots=r"\d+",
    cache="|".join(paths.CACHE_MODES),


def run_of(w):
    return DecodeRun(w.model, w.device, w.workload, w.method, int(w.slots))


def target_dir(w):
    return config["models"][w.model]["target"]


def drafter_dir(w):
    return config["models"][w.model]["drafter"]


def tokenizer_dir(w):
    model = config["models"][w.model]
    return paths.toy_model(w.model, "tokenizer") if model["toy"] else model["target"]


def device_gpus(w):
    return 1 if config["devices"][w.device]["torch_device"] == "cuda" else 0


def device_gpu_model(w):
    return config["devices"][w.device]["gpu"]


def in_flags(w, input):
    """--in flags for a rule's inputs: one per path, a list input's name repeated (specfit.stage)."""
    flags = []
    for name, value in input.items():
        for path in [value] if isinstance(value, str) else value:
            flags.append(f"--in {name}={shlex.quote(str(path))}")
    return " ".join(flags)


def extract_spec(w):
    # A workload over Spec-Bench (the default source) has no source in its spec; one over another dataset adds
    # its name and its source (specfit.questions.workload_source). `model` names the tokenizer's config key.
    source = None
    if w.workload == "calibration":
        ids, limit, requests = (
            config["calibration"]["question_ids"],
            config["calibration"]["limit_tokens"],
            None,
        )
    elif w.workload == "predictor":
        ids, limit, requests = (
            predictor_question_ids(config),
            config["predictor"]["limit_tokens"],
            None,
        )
    else:
        wl = config["workloads"][w.workload]
        ids, limit, requests = (
            workload_ids(config, w.workload),
            wl["limit_tokens"],
            wl["max_requests"],
        )
        source = workload_source(config, w.workload)
    spec = {
        "model": w.model,
        "question_ids": ids,
        "limit_tokens": limit,
        "max_requests": requests,
    }
    if source is not None:
        spec.update(workload=w.workload, source=source)
    return spec_json(spec)


def toy_spec(part):
    def spec(w):
        return spec_json(
            {
                **config["toy"][part],
                "seed": config["seed"],
                "exclude_question_ids": evaluated_question_ids(config),
            }
        )

    return spec


def calibrate_spec(w):
    device = config["devices"][w.device]
    return spec_json(
        {
            "model": w.model,
            "dtype": config["models"][w.model]["dtype"],
            "logits_dtype": config["models"][w.model]["logits_dtype"],
            "torch_device": device["torch_device"],
            "max_inflight": device["max_inflight"],
            "link": device["link"],
            "coefficients": device["coefficients"],
            "slots": (
                config["models"][w.model]["main_slots"][w.device]
                if w.cache == "cache"
                else 0
            ),
            # the question ids reach the stage as its prompts input
            "protocol": {
                k: v for k, v in config["calibration"].items() if k != "question_ids"
            },
            "seed": config["seed"],
        }
    )


def method_spec(method):
    """The method's config entry as specfit.speculative.config.MethodConfig: `rule` is the registered name."""
    m = dict(config["methods"][method])
    return {"name": m.pop("rule"), **m}


def stream_spec(w, slots, link):
    """What the decode and atlas stages share: the model, device, method and the workload's limits."""
    wl = config["workloads"][w.workload]
    device = config["devices"][w.device]
    return {
        "model": w.model,
        "dtype": config["models"][w.model]["dtype"],
        "logits_dtype": config["models"][w.model]["logits_dtype"],
        "torch_device": device["torch_device"],
        "max_inflight": device["max_inflight"],
        "link": link,
        "method": method_spec(w.method),
        "slots": slots,
        "limit_tokens": wl["limit_tokens"],
        "max_new_tokens": wl["max_new_tokens"] or wl["limit_tokens"],
        "seed": config["seed"],
    }


def atlas_spec(w):
    # Built with the slots of the device's with-cache runs (the most its memory is known to hold; routes do not
    # depend on what the cache holds) and without the emulated link: it is off the measured cache and timers.
    slots = config["models"][w.model]["main_slots"][w.device]
    return spec_json(stream_spec(w, slots=slots, link=None))


def decode_spec(w):
    return spec_json(stream_spec(w, int(w.slots), config["devices"][w.device]["link"]))


def decode_inputs(w):
    run = run_of(w)
    inputs = workflow_decode_inputs(config, run)
    reference = reference_run(config, run)
    if reference is not None:
        inputs["reference"] = reference.file("requests.parquet")
    return inputs


def predictor_device(w):
    """The device the model's first decode run uses: the predictor trains and is timed there."""
    return config["devices"][next(r.device for r in RUNS if r.model == w.model)]


def predictor_spec(w):
    p = config["predictor"]
    drafting = method_config(config, p["method"])
    return spec_json(
        {
            "model": w.model,
            "dtype": config["models"][w.model]["dtype"],
            "logits_dtype": config["models"][w.model]["logits_dtype"],
            "torch_device": predictor_device(w)["torch_device"],
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
        }
    )


def atlas_inputs(w):
    return {
        "prompts": paths.prompts(w.model, w.workload),
        "target": target_dir(w),
        "drafter": drafter_dir(w),
        "coefficients": paths.calibration(w.model, w.device, w.cache),
    }


def theory_run(w):
    """The run whose Table 5 the job writes: the paper SpecFit's (rule theory), or the method's its file names
    (rule theory_cache_aware)."""
    path = paths.theory(w.model, w.device, w.workload, w.get("method"))
    return next(r for r in theory_runs(config) if theory_file(config, r) == path)


def theory_inputs(w):
    run = theory_run(w)
    variant = paths.atlas_variant(run.method, run.slots)
    return {
        "cycles": run.file("cycles.parquet"),
        "requests": run.file("requests.parquet"),
        "atlas": paths.atlas(w.model, w.device, w.workload, variant),
        "coefficients": paths.calibration(w.model, w.device, "cache"),
    }


def theory_spec(w):
    run = theory_run(w)
    method = method_config(config, run.method)
    wl = config["workloads"][w.workload]
    return spec_json(
        {
            **config["theory"],
            "k_max": method.k_max,
            "max_depth": method.max_depth,
            # the decode run's limits (as stream_spec gives them): each cycle's depth cap near the length limit
            "limit_tokens": wl["limit_tokens"],
            "max_new_tokens": wl["max_new_tokens"] or wl["limit_tokens"],
            # "paper" (b + β F) for SpecFit, "cache_aware" for specfit-ca (beyond the paper)
            "cost": theory_cost(config, run),
        }
    )


def report_inputs(w):
    """Every file the report reads: each run's metrics and requests, the fits and their points, the theory, the
    learned route predictors (folders: the report reads their metrics.json)."""
    pairs = sorted({(r.model, r.device) for r in RUNS})
    return {
        "metrics": [r.file("metrics.json") for r in RUNS],
        "requests": [r.file("requests.parquet") for r in RUNS],
        "calibration": [
            paths.calibration(m, d, c) for m, d in pairs for c in paths.CACHE_MODES
        ],
        "points": [
            paths.calibration_points(m, d, c)
            for m, d in pairs
            for c in paths.CACHE_MODES
        ],
        "theory": sorted({theory_file(config, r) for r in theory_runs(config)}),
        # the learned route predictors that decode runs read (their metrics.json)
        "predictor": sorted(
            {
                p
                for r in RUNS
                if (p := workflow_decode_inputs(config, r).get("predictor"))
            }
        ),
    }


def report_spec(w):
    keep = ("workloads", "models", "devices", "methods", "runs", "seed")
    return spec_json({k: config[k] for k in keep})
