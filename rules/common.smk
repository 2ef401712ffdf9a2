# Wildcard constraints, input functions and the rules' spec params. File names come from specfit.planning.paths, the decode
# matrix from specfit.planning, each stage's spec from specfit.planning.specs (all tested there).
import shlex

from specfit.planning import paths, specs
from specfit.questions import workload_file
from specfit.planning.code import code_hash
from specfit.planning.matrix import (
    DecodeRun,
    decode_inputs as workflow_decode_inputs,
    decode_runs,
    is_toy,
    reference_run,
    report_inputs as workflow_report_inputs,
    trained_toys,
)
from specfit.planning.specs import spec_json

CONDA_ENV = "../envs/specfit.yaml"
RUNS = decode_runs(config)
# the models the toy rules train (`toy: true`); none: the rules match no model (the shipped toy is a plain input)
TRAINED_TOYS = "|".join(trained_toys(config)) or "(?!)"


wildcard_constraints:
    model="|".join(config["models"]),
    device="|".join(config["devices"]),
    workload="|".join(config["workloads"]),
    method="|".join(config["methods"]),
    slots=r"\d+",
    fold=r"(\.fold\d+)?",
    cache="|".join(paths.CACHE_MODES),


def spec(build):
    """A rule's `spec` param: ``build`` (a function of specfit.planning.specs) of the config and the job's wildcards, as
    sorted JSON."""

    def params(w):
        return spec_json(build(config, **w))

    return params


def run_of(w):
    return DecodeRun(w.model, w.device, w.workload, w.method, int(w.slots))


def target_dir(w):
    return config["models"][w.model]["target"]


def drafter_dir(w):
    return config["models"][w.model]["drafter"]


def tokenizer_dir(w):
    model = config["models"][w.model]
    return paths.toy_model(w.model, "tokenizer") if is_toy(model) else model["target"]


def questions_file(w):
    """Spec-Bench's question.jsonl (the spec_bench rule's output) or the workload's own local dataset; none for a
    Hub dataset, which is read from the local cache."""
    return workload_file(config, w.workload) or []


def job_device(w):
    """The device a job runs on: its `device` wildcard, or the predictor's (specfit.planning.specs.predictor_device)."""
    return config["devices"][w.get("device") or specs.predictor_device(config, w.model)]


def device_gpus(w):
    return 1 if job_device(w)["torch_device"] == "cuda" else 0


def device_gpu_model(w):
    return job_device(w)["gpu"]


def in_flags(w, input):
    """--in flags for a rule's inputs: one per path, a list input's name repeated (specfit.planning.stage)."""
    flags = []
    for name, value in input.items():
        for path in [value] if isinstance(value, str) else value:
            flags.append(f"--in {name}={shlex.quote(str(path))}")
    return " ".join(flags)


def decode_inputs(w):
    run = run_of(w)
    inputs = workflow_decode_inputs(config, run)
    reference = reference_run(config, run)
    if reference is not None:
        inputs["reference"] = reference.file("requests.parquet")
    return inputs


def atlas_inputs(w):
    return {
        "prompts": paths.prompts(w.model, w.workload),
        "target": target_dir(w),
        "drafter": drafter_dir(w),
        "coefficients": paths.calibration(w.model, w.device, w.cache),
    }


def theory_inputs(w):
    run = specs.theory_run(config, **w)
    variant = paths.atlas_variant(run.method, run.slots)
    return {
        "cycles": run.file("cycles.parquet"),
        "requests": run.file("requests.parquet"),
        "atlas": paths.atlas(w.model, w.device, w.workload, variant),
        "coefficients": paths.calibration(w.model, w.device, "cache"),
    }


def report_inputs(w):
    return workflow_report_inputs(config)
