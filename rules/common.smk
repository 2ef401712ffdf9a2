# Target lists, config slices and wildcard constraints. The logic lives in specfit.workflow (tested there).
import shlex

from specfit.workflow import (
    atlas_variant,
    cache_mode,
    code_hash,
    decode_runs,
    method_rule,
    reference_run,
    spec_json,
    theory_runs,
    DecodeRun,
)

CONDA_ENV = "../envs/specfit.yaml"
RUNS = decode_runs(config)


wildcard_constraints:
    model="|".join(config["models"]),
    device="|".join(config["devices"]),
    workload="|".join(config["workloads"]),
    method="|".join(config["methods"]),
    slots=r"\d+",
    cache="cache|nocache",


def run_of(w):
    return DecodeRun(w.model, w.device, w.workload, w.method, int(w.slots))


def target_dir(w):
    return config["models"][w.model]["target"]


def drafter_dir(w):
    return config["models"][w.model]["drafter"]


def tokenizer_dir(w):
    model = config["models"][w.model]
    return f"data/models/{w.model}/tokenizer" if model["toy"] else model["target"]


def device_gpus(w):
    return 1 if config["devices"][w.device]["torch_device"] == "cuda" else 0


def device_gpu_model(w):
    return config["devices"][w.device]["gpu"]


def workload_ids(workload):
    q = config["workloads"][workload]["question_ids"]
    return list(range(q["start"], q["stop"] + 1, q.get("step", 1)))


def calibration_limit():
    """The calibration states come from GSM8K questions, under the GSM8K limit (Appendix B)."""
    return config["workloads"].get("gsm8k", {}).get("limit_tokens", 512)


def extract_spec(w):
    if w.workload == "calibration":
        ids, limit, requests = (
            config["calibration"]["question_ids"],
            calibration_limit(),
            None,
        )
    else:
        wl = config["workloads"][w.workload]
        ids, limit, requests = (
            workload_ids(w.workload),
            wl["limit_tokens"],
            wl["max_requests"],
        )
    return spec_json(
        {"question_ids": ids, "limit_tokens": limit, "max_requests": requests}
    )


def toy_spec(part):
    def spec(w):
        return spec_json({**config["toy"][part], "seed": config["seed"]})

    return spec


def calibrate_spec(w):
    device = config["devices"][w.device]
    return spec_json(
        {
            "dtype": config["models"][w.model]["dtype"],
            "torch_device": device["torch_device"],
            "max_inflight": device["max_inflight"],
            "link": device["link"],
            "coefficients": device["coefficients"],
            "slots": (
                config["models"][w.model]["main_slots"][w.device]
                if w.cache == "cache"
                else 0
            ),
            "limit_tokens": calibration_limit(),
            # the question ids reach the stage as its prompts input
            "protocol": {
                k: v for k, v in config["calibration"].items() if k != "question_ids"
            },
            "seed": config["seed"],
        }
    )


def method_spec(method):
    """The method's config entry as specfit.spec.methods.MethodConfig: `rule` is the registered name."""
    m = dict(config["methods"][method])
    return {"name": m.pop("rule"), **m}


def stream_spec(w, slots, link):
    """What the decode and atlas stages share: the model, device, method and the workload's limits."""
    wl = config["workloads"][w.workload]
    device = config["devices"][w.device]
    return {
        "dtype": config["models"][w.model]["dtype"],
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
    # The atlas stage itself makes every expert resident and drops the link: it is off the measured cache.
    return spec_json(stream_spec(w, slots=0, link=None))


def decode_spec(w):
    return spec_json(stream_spec(w, int(w.slots), config["devices"][w.device]["link"]))


def coefficients_file(w):
    return f"data/calibration/{w.model}/{w.device}/{cache_mode(w.slots)}.json"


def decode_inputs(w):
    run = run_of(w)
    inputs = {
        "prompts": f"data/prompts/{w.model}/{w.workload}.parquet",
        "target": target_dir(w),
    }
    kind = method_rule(config, w.method)
    if kind != "ar":
        inputs["drafter"] = drafter_dir(w)
    if kind == "specfit":
        inputs["coefficients"] = coefficients_file(w)
        variant = atlas_variant(w.method, w.slots)
        inputs["atlas"] = (
            f"data/atlas/{w.model}/{w.device}/{w.workload}/{variant}/atlas.parquet"
        )
    reference = reference_run(config, run)
    if reference is not None:
        inputs["reference"] = f"{reference.path}/requests.parquet"
    return inputs


def atlas_inputs(w):
    inputs = {
        "prompts": f"data/prompts/{w.model}/{w.workload}.parquet",
        "target": target_dir(w),
        "drafter": drafter_dir(w),
        "coefficients": f"data/calibration/{w.model}/{w.device}/{w.cache}.json",
    }
    return inputs


def theory_run(w):
    runs = [
        r
        for r in theory_runs(config)
        if (r.model, r.device, r.workload) == (w.model, w.device, w.workload)
    ]
    return runs[0]


def theory_inputs(w):
    run = theory_run(w)
    variant = atlas_variant(run.method, run.slots)
    return {
        "cycles": f"{run.path}/cycles.parquet",
        "requests": f"{run.path}/requests.parquet",
        "atlas": f"data/atlas/{w.model}/{w.device}/{w.workload}/{variant}/atlas.parquet",
        "coefficients": f"data/calibration/{w.model}/{w.device}/cache.json",
    }


def theory_spec(w):
    method = config["methods"][theory_run(w).method]
    pool = {k: method[k] for k in ("k_max", "max_depth") if k in method}
    return spec_json({**config["theory"], **pool})


def all_decode_metrics():
    return [f"{r.path}/metrics.json" for r in RUNS]


def all_decode_requests():
    """The per-request rows beside each metrics.json: the report's bootstrap intervals resample them."""
    return [f"{r.path}/requests.parquet" for r in RUNS]


def all_theory():
    return sorted(
        {
            f"data/theory/{r.model}/{r.device}/{r.workload}.json"
            for r in theory_runs(config)
        }
    )


def all_calibration():
    pairs = sorted({(r.model, r.device) for r in RUNS})
    return [
        f"data/calibration/{m}/{d}/{c}.json"
        for m, d in pairs
        for c in ("cache", "nocache")
    ]


def report_spec(w):
    keep = (
        "workloads",
        "models",
        "devices",
        "methods",
        "runs",
        "seed",
    )
    return spec_json({k: config[k] for k in keep})


def decode_in_flags(w, input):
    """--in flags for the decode inputs, which vary by method (AR has no drafter, SpecFit has an atlas)."""
    return " ".join(
        f"--in {name}={shlex.quote(str(path))}" for name, path in input.items()
    )
