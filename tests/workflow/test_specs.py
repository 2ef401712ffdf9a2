"""The config-to-stage contract (specfit.planning.specs): each rule's spec for the shipped config and the smoke overlay,
and the rules passing exactly those specs."""

import copy
import json
import re
import shlex
import subprocess
import sys

import pytest

from specfit.planning import paths, specs
from specfit.planning.code import code_closure
from specfit.planning.config import SCHEMA, load_config
from specfit.planning.matrix import DecodeRun, decode_runs, report_inputs

STAGES = ("specfit.stages.extract", "specfit.stages.toy_tokenizer", "specfit.stages.toy_target",
          "specfit.stages.toy_drafter", "specfit.stages.calibrate", "specfit.stages.atlas", "specfit.stages.predictor",
          "specfit.stages.decode", "specfit.stages.tune", "specfit.stages.tune_choice", "specfit.stages.theory",
          "specfit.stages.report")
EVALUATED = [*range(242, 321, 2), *range(401, 481)]  # summarization's and gsm8k's ids (calibration's are gsm8k's)
A100_LINK = {"bandwidth_gbps": 0.175, "latency_us": 50}
RTX4090 = {"name": "RTX 4090", "fixed_ms": 98.12, "token_ms": 2.23, "expert_ms": 8.624, "copy_ms": 9.847,
           "draft_ms": 16.05, "select_ms": 0.5}
SMOKE_LINK = {"bandwidth_gbps": 4.0, "latency_us": 20}
SPECFIT = {"name": "specfit", "k_max": 7, "max_depth": 5, "top_k_expand": 2, "routes": "atlas"}


@pytest.fixture(scope="module")
def config(root):
    return load_config(root / "config.yaml", root / SCHEMA)


@pytest.fixture(scope="module")
def smoke(root):
    return load_config(root / "config.yaml", root / SCHEMA, root / "tests/smoke.yaml")


def test_extract(config, smoke):
    assert specs.spec_bench(config) == {
        "url": "https://raw.githubusercontent.com/hemingkx/Spec-Bench/fd2c1cd7d2201ef71db4c5f4e455008f017967bf/"
               "data/spec_bench/question.jsonl",
        "sha256": "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"}
    assert specs.extract(config, "toy", "gsm8k") == {
        "model": "toy", "question_ids": list(range(401, 481)), "limit_tokens": 512, "max_requests": None}
    assert specs.extract(smoke, "smoke", "summarization") == {
        "model": "smoke", "question_ids": list(range(242, 321, 2)), "limit_tokens": 2048, "max_requests": 2}
    assert specs.extract(config, "toy", "calibration") == {
        "model": "toy", "question_ids": [401, 402, 403], "limit_tokens": 512, "max_requests": None}
    assert specs.extract(smoke, "smoke", "calibration")["question_ids"] == [401]
    assert specs.extract(config, "toy", "predictor") == {
        "model": "toy", "question_ids": [*range(241, 320, 2), *range(321, 341)], "limit_tokens": 1024,
        "max_requests": None}
    assert specs.extract(smoke, "smoke", "predictor")["question_ids"] == list(range(321, 327))


def test_extract_names_a_workload_of_another_dataset(config):
    config = copy.deepcopy(config)
    config["workloads"]["gsm8k"]["source"] = {"path": "data/gsm8k/test.jsonl", "split": "test",
                                              "fields": {"id": None, "prompt": "question"}}
    assert specs.extract(config, "toy", "gsm8k") == {
        "model": "toy", "question_ids": list(range(401, 481)), "limit_tokens": 512, "max_requests": None,
        "workload": "gsm8k",
        "source": {"path": "data/gsm8k/test.jsonl", "hub": None, "name": None, "split": "test",
                   "fields": {"id": None, "prompt": "question", "category": "category"}}}


def test_toy(config, smoke):
    assert specs.toy(config, "tokenizer") == {
        "vocab_size": 4096, "heldout": 12, "seed": 0, "exclude_question_ids": EVALUATED}
    target = specs.toy(smoke, "target")
    assert target == {
        "hidden_size": 64, "num_layers": 4, "num_experts": 8, "top_k": 2, "moe_intermediate_size": 64,
        "seq_len": 2060, "batch_size": 1, "lr": 0.004, "steps": 40, "span_conversations": 200, "unlikelihood": 1.0,
        "max_minutes": 45, "num_heads": 4, "num_kv_heads": 2, "router_aux_loss_coef": 0.01, "span_max_words": 150,
        "heldout": 12, "seed": 0, "threads": 2, "exclude_question_ids": EVALUATED}
    drafter = specs.toy(smoke, "drafter")
    assert (drafter["steps"], drafter["ttt_steps"], drafter["distill_prompts"]) == (30, 3, 16)
    shipped = specs.toy(config, "drafter")
    assert (shipped["steps"], shipped["draft_vocab_size"]) == (600, 864)
    assert shipped["categories"] == ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                     "humanities", "translation", "qa", "rag"]  # chat: no summarization, no GSM8K
    assert specs.toy(config | {"train_threads": 3}, "drafter")["threads"] == 3


def test_calibrate(config, smoke):
    assert specs.calibrate(config, "toy", "cpu-4090", "cache") == {
        "model": "toy", "dtype": "float32", "logits_dtype": "model", "verify": "exact",
        "torch_device": "cpu", "max_inflight": 2,
        "link": None, "emulate": RTX4090, "coefficients": "fit", "slots": 8,
        "protocol": {"cycle_boundaries": [0, 4, 8], "sizes": 17, "repeats": 2, "limit_tokens": 512}, "seed": 0}
    assert specs.calibrate(config, "toy", "cpu-4090", "nocache")["slots"] == 0
    smoke_fit = specs.calibrate(smoke, "smoke", "cpu-a100link", "cache")
    assert (smoke_fit["link"], smoke_fit["slots"]) == (SMOKE_LINK, 4)
    assert smoke_fit["protocol"] == {"cycle_boundaries": [0, 2], "sizes": 8, "repeats": 1, "limit_tokens": 512}


def test_decode(config, smoke):
    assert specs.decode(config, "toy", "cpu-a100link", "summarization", "specfit-noisy", "6") == {
        "model": "toy", "dtype": "float32", "logits_dtype": "model", "verify": "exact",
        "torch_device": "cpu", "max_inflight": 2,
        "link": A100_LINK, "emulate": None, "method": {**SPECFIT, "routes": "noisy", "accuracy": 0.6}, "slots": 6,
        "limit_tokens": 2048, "max_new_tokens": 128, "seed": 0}
    # a method entry as it is written (the stage fills the defaults): AR sets nothing
    assert specs.decode(config, "toy", "cpu-a100link", "gsm8k", "ar", 0)["method"] == {"name": "ar"}
    assert specs.decode(smoke, "smoke", "cpu-a100link", "gsm8k", "specfit-learned", "4") == {
        "model": "smoke", "dtype": "float32", "logits_dtype": "model", "verify": "exact",
        "torch_device": "cpu", "max_inflight": 2,
        "link": SMOKE_LINK, "emulate": None, "method": {**SPECFIT, "routes": "learned"}, "slots": 4,
        "limit_tokens": 512, "max_new_tokens": 12, "seed": 0}


def test_max_new_tokens_unset_is_the_length_limit(config):
    config = copy.deepcopy(config)
    config["workloads"]["gsm8k"]["max_new_tokens"] = None
    assert specs.decode(config, "toy", "cpu-a100link", "gsm8k", "ar", 0)["max_new_tokens"] == 512
    assert specs.theory(config, "toy", "cpu-a100", "gsm8k")["max_new_tokens"] == 512


def test_atlas_is_built_at_the_main_slots_without_the_link(config):
    """Both cache modes of a variant build with the device's with-cache slot count, no emulated link or device."""
    built = specs.atlas(config, "toy", "cpu-4090", "gsm8k", "specfit", "nocache")
    assert built == {
        "model": "toy", "dtype": "float32", "logits_dtype": "model", "verify": "exact",
        "torch_device": "cpu", "max_inflight": 2,
        "link": None, "emulate": None, "method": SPECFIT, "slots": 8, "limit_tokens": 512, "max_new_tokens": 128,
        "seed": 0}
    assert specs.atlas(config, "toy", "cpu-4090", "gsm8k", "specfit", "cache") == built
    assert built == {**specs.decode(config, "toy", "cpu-4090", "gsm8k", "specfit", 8), "emulate": None}


def test_predictor(config, smoke):
    # the first decode run's device in the matrix's order: cpu-4090 sorts before cpu-a100
    assert specs.predictor_device(config, "toy") == "cpu-4090"
    assert specs.predictor(config, "toy") == {
        "model": "toy", "dtype": "float32", "logits_dtype": "model", "verify": "exact",
        "torch_device": "cpu", "limit_tokens": 1024,
        "max_new_tokens": 64, "k_max": 7, "max_depth": 5, "top_k_expand": 2, "validation_requests": 8,
        "steps": 1500, "batch_size": 512, "lr": 0.003, "seed": 0, "threads": 2}
    assert specs.predictor_device(smoke, "smoke") == "cpu-a100"
    smoke_spec = specs.predictor(smoke, "smoke")
    assert (smoke_spec["max_new_tokens"], smoke_spec["validation_requests"], smoke_spec["steps"]) == (8, 2, 40)


def test_theory(config, smoke):
    assert specs.theory_run(config, "toy", "cpu-a100", "gsm8k") == DecodeRun(
        "toy", "cpu-a100", "gsm8k", "specfit", 12)
    assert specs.theory(config, "toy", "cpu-a100", "gsm8k") == {
        "beta_multiplier": 2.0, "k_max": 7, "max_depth": 5, "limit_tokens": 512, "max_new_tokens": 128,
        "cost": "paper"}
    assert specs.theory_run(smoke, "smoke", "cpu-a100link", "gsm8k", "specfit-ca") == DecodeRun(
        "smoke", "cpu-a100link", "gsm8k", "specfit-ca", 4)
    assert specs.theory(smoke, "smoke", "cpu-a100link", "gsm8k", "specfit-ca") == {
        "beta_multiplier": 2.0, "k_max": 7, "max_depth": 5, "limit_tokens": 512, "max_new_tokens": 12,
        "cost": "cache_aware"}


def test_report(config):
    report = specs.report(config)
    assert sorted(report) == ["devices", "methods", "models", "runs", "seed", "workloads"]
    assert report["runs"] == config["runs"] and report["devices"]["cpu-a100link"]["link"] == A100_LINK


def test_report_inputs(config, smoke):
    """The report rule's inputs (`specfit.planning.matrix.report_inputs`): every run's metrics and requests, both fits
    and their points per (model, device), each theory file once, the toy's folders (the smoke config's
    trained toy, config.yaml's shipped one), the one learned route predictor the learned methods read, and no cycles
    (no workload samples)."""
    inputs = report_inputs(smoke)
    runs = decode_runs(smoke)
    assert sorted(inputs) == ["calibration", "cycles", "metrics", "models", "points", "predictor", "requests",
                              "theory", "tune"]
    assert inputs["cycles"] == []
    assert inputs["metrics"] == [r.file("metrics.json") for r in runs]
    assert inputs["requests"] == [r.file("requests.parquet") for r in runs]
    assert inputs["calibration"] == [f"data/calibration/smoke/{d}/{c}.json" for d in ("cpu-a100", "cpu-a100link")
                                     for c in ("cache", "nocache")] + ["data/calibration/smoke/cpu-resident/cache.json"]
    assert inputs["points"] == [f"data/calibration/smoke/{d}/{c}.points.parquet"
                                for d in ("cpu-a100", "cpu-a100link") for c in ("cache", "nocache")] + [
        "data/calibration/smoke/cpu-resident/cache.points.parquet"]
    # SpecFit's pools per workload at the main slots; beyond the paper, each exact-route cache-aware method's beside
    assert inputs["theory"] == [
        "data/theory/smoke/cpu-a100/gsm8k.json", "data/theory/smoke/cpu-a100/gsm8k.specfit-prefetch-atlas.json",
        "data/theory/smoke/cpu-a100link/gsm8k.json", "data/theory/smoke/cpu-a100link/gsm8k.specfit-ca.json",
        "data/theory/smoke/cpu-a100link/summarization.json", "data/theory/smoke/cpu-resident/gsm8k.json"]
    assert inputs["models"] == ["data/models/smoke/target", "data/models/smoke/drafter"]
    assert inputs["predictor"] == [paths.predictor("smoke")]
    assert inputs["tune"] == [f"data/tune/smoke/cpu-resident/gsm8k/eagle3-tuned/slots8.fold{f}.json" for f in (0, 1)]
    assert report_inputs(config)["models"] == ["data/models/toy/target", "data/models/toy/drafter",
                                               "data/models/toy/SHIPPED.json"]


def test_no_stage_runs_the_specs():
    """A spec reaches its rule as params, so an edit here reruns the jobs whose spec it changes; the stages' code
    hashes leave this module out."""
    for stage in STAGES:
        assert "specfit.planning.specs" not in code_closure(stage), stage


# ------------------------------------------------------------------ the rules pass exactly these specs
def _pattern(path: str) -> re.Pattern:
    """A specfit.planning.paths pattern as a regex with a group per wildcard (`cache` constrained as in the rules)."""
    regex = re.escape(path)
    for name in re.findall(r"\{(\w+)\}", path):
        value = "|".join(paths.CACHE_MODES) if name == "cache" else r"(?:\.fold\d+)?" if name == "fold" else "[^/]+?"
        regex = regex.replace(re.escape(f"{{{name}}}"), f"(?P<{name}>{value})", 1)
    return re.compile(regex + "$")


W = ("{model}", "{device}", "{workload}")
# each stage's spec builder, by the pattern of the first output its rule passes (which holds the job's wildcards)
JOBS = {
    "specfit.stages.extract": (specs.extract, [paths.prompts("{model}", "{workload}")]),
    "specfit.stages.calibrate": (specs.calibrate, [paths.calibration("{model}", "{device}", "{cache}")]),
    "specfit.stages.atlas": (specs.atlas, [paths.atlas(*W, "{method}-{cache}")]),
    "specfit.stages.decode": (specs.decode, [paths.decode(*W, "{method}", "{slots}", "requests.parquet")]),
    "specfit.stages.predictor": (specs.predictor, [paths.predictor("{model}")]),
    "specfit.stages.tune": (specs.tune, [paths.tune_grid(*W, "{method}", "{fold}")]),
    "specfit.stages.tune_choice": (specs.tune_choice, [paths.tune(*W, "{method}", "{slots}", "{fold}")]),
    "specfit.stages.theory": (specs.theory, [paths.theory(*W, "{method}"), paths.theory(*W)]),
}


def _expected(config: dict, module: str, argv: list[str]) -> dict:
    if module == "specfit.stages.spec_bench":
        return specs.spec_bench(config)
    if module.startswith("specfit.stages.toy_"):
        return specs.toy(config, module.rpartition("_")[2])
    if module == "specfit.stages.report":
        return specs.report(config)
    build, patterns = JOBS[module]
    out = argv[argv.index("--out") + 1].partition("=")[2]
    if (m := _pattern(paths.tune_prompts("{model}", "{workload}", "{fold}")).match(out)) is not None:
        return specs.extract_tune(config, **m.groupdict())  # rule extract_tune: the extract stage, another spec
    match = next(m for p in patterns if (m := _pattern(p).match(out)))
    return build(config, **match.groupdict())


@pytest.mark.parametrize("overlays", [(), ("tests/smoke.yaml",)], ids=["config.yaml", "smoke"])
def test_every_job_gets_its_builders_spec(root, overlays):
    config = load_config(root / "config.yaml", root / SCHEMA, *(root / o for o in overlays))
    args = [a for o in overlays for a in ("--configfile", o)]
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", "reports/all", *args],
                          check=False, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    commands = [shlex.split(line.partition(": ")[2]) for line in proc.stdout.splitlines()
                if line.startswith("Shell command: python -m specfit.")]
    # config.yaml: 79 jobs (no toy training: the shipped toy is read; 37 decodes, 5 tune jobs, each sweeping both
    # slot counts of its cell: two folds per cross-fitted workload on the A100, one on the RTX 4090, and their 10
    # parts); smoke: 69 (its toy's 3 training jobs among them, its resident device's two folds and their parts)
    assert len(commands) == (79 if not overlays else 69)
    for argv in commands:
        assert argv[:3] == ["python", "-m", "specfit.launch"]  # the launcher, then the stage's name
        module, argv = f"specfit.stages.{argv[3]}", argv[4:argv.index(">")]
        spec = json.loads(argv[argv.index("--spec") + 1])
        assert spec == _expected(config, module, argv), " ".join(argv)


def test_a_resident_devices_measurements_ride_in_emulate(root, config):
    """A resident device (config.resident.yaml) passes its measurements as emulate: {resident: ...} to calibrate,
    decode and generate; the atlas build stays off the emulation; no other device's spec changes."""
    resident = load_config(root / "config.yaml", root / SCHEMA, root / "config.resident.yaml")
    measured = resident["devices"]["cpu-m5max-distinct"]["resident"]
    assert measured["gather"] == "distinct"
    calibrate = specs.calibrate(resident, "toy", "cpu-m5max-distinct", "cache")
    assert calibrate["emulate"] == {"resident": measured} and calibrate["slots"] == 32 and calibrate["link"] is None
    decode = specs.decode(resident, "toy", "cpu-m5max-distinct", "gsm8k", "ar", 32)
    assert decode["emulate"] == {"resident": measured}
    generate = specs.generate(resident, "toy", "cpu-m5max-pair", "ar", 32, 100, 8)
    assert generate["emulate"]["resident"]["gather"] == "pair"
    assert specs.atlas(resident, "toy", "cpu-m5max-distinct", "gsm8k", "specfit")["emulate"] is None
    for run in decode_runs(config):  # the default matrix's specs, with the overlay or without
        where = (run.model, run.device, run.workload, run.method, run.slots)
        assert specs.decode(resident, *where) == specs.decode(config, *where)


def test_a_resident_device_is_calibrated_with_every_expert_only(root, tmp_path):
    """A resident device holds every expert: no run without the cache, so the report asks it no `nocache` fit
    (whose 0 slots the device refuses) and the workflow plans none; the other devices keep both."""
    runs = tmp_path / "runs.yaml"
    runs.write_text("runs:\n"
                    "  - {models: [toy], devices: [cpu-a100], workloads: [gsm8k], methods: [ar, specfit],"
                    " slots: [0, 12]}\n"
                    "  - {models: [toy], devices: [cpu-m5max-distinct], workloads: [gsm8k], methods: [ar, specfit],"
                    " slots: [32]}\n")
    config = load_config(root / "config.yaml", root / SCHEMA, root / "config.resident.yaml", runs)
    assert report_inputs(config)["calibration"] == [
        "data/calibration/toy/cpu-a100/cache.json", "data/calibration/toy/cpu-a100/nocache.json",
        "data/calibration/toy/cpu-m5max-distinct/cache.json"]
    assert report_inputs(config)["points"] == [
        "data/calibration/toy/cpu-a100/cache.points.parquet", "data/calibration/toy/cpu-a100/nocache.points.parquet",
        "data/calibration/toy/cpu-m5max-distinct/cache.points.parquet"]
    listed = subprocess.run(["snakemake", "-n", "reports/all", "--configfile", "config.resident.yaml", str(runs)],
                            cwd=root, capture_output=True, text=True, check=True).stdout
    assert "data/calibration/toy/cpu-m5max-distinct/cache.json" in listed
    assert "cpu-m5max-distinct/nocache" not in listed


def test_the_tune_rules_specs(root):
    """extract_tune: the workload's questions after the ones it evaluates, all of them; tune: the tuned method's decode
    spec at each slot count it runs at in the cell and the grid's trees."""
    resident = load_config(root / "config.yaml", root / SCHEMA, root / "config.resident.yaml")
    extract = specs.extract_tune(resident, "toy", "gsm8k", ".fold1")  # cross-fitted: fold 0's first 12
    assert extract["question_ids"] == list(range(401, 424, 2)) and extract["max_requests"] is None
    assert {k: v for k, v in extract.items() if k != "question_ids"} == {
        k: v for k, v in specs.extract(resident, "toy", "gsm8k").items() if k not in ("question_ids", "max_requests")
    } | {"max_requests": None}
    tune = specs.tune(resident, "toy", "cpu-m5max-pair", "gsm8k", "eagle3-tuned", ".fold1")
    assert tune["decodes"] == list(range(402, 481, 2))  # fold 1's questions, none of them tuned on
    default = load_config(root / "config.yaml", root / SCHEMA)
    odd = specs.tune(default, "toy", "cpu-4090", "gsm8k-odd", "eagle3-tuned")
    assert odd["decodes"] == list(range(401, 480, 2))
    assert tune["streams"] == {"32": specs.decode(resident, "toy", "cpu-m5max-pair", "gsm8k", "eagle3-tuned", 32)}
    assert odd["streams"] == {str(s): specs.decode(default, "toy", "cpu-4090", "gsm8k-odd", "eagle3-tuned", s)
                              for s in (0, 8)}  # both slot counts of the cell, one job
    assert len(tune["trees"]) == 24 and tune["trees"][-1] == {"max_depth": 6, "top_k_expand": 4, "k_max": 24}
