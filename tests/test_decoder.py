"""The decoder as a library: every deployable method decodes AR's tokens, streaming gives generate's
text, a generation's figures are its decode run's, and oracles and missing workflow outputs are refused by name.

The tiny random pair of conftest.py here; the Qwen3-30B-A3B fakes through the config and the CLI in
tests/compat/test_compat_generate.py; the workflow's own toy below when it has been built."""

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from compat.compat_fakes import COEFFICIENTS
from specfit.api import FIGURES, Decoder, compare, deployable
from specfit.errors import SpecFitError
from specfit.planning import paths
from specfit.planning.config import SCHEMA, load_config
from specfit.results.records import PROMPTS_SCHEMA
from specfit.stages import decode, predictor

DEVICE = os.environ.get("SPECFIT_TEST_DEVICE", "cpu")  # scripts/gpu_check.sh: cuda
ROOT = Path(__file__).resolve().parents[1]
# the deployable methods by their method entries: AR, EAGLE-3, and SpecFit and specfit-ca on learned routes
METHODS = {"ar": {"name": "ar"}, "eagle3": {"name": "eagle3"},
           "specfit-learned": {"name": "specfit", "routes": "learned"},
           "specfit-ca-learned": {"name": "specfit-ca", "routes": "learned"}}


def spec(method: dict, **over) -> dict:
    return {"method": method, "slots": 4, "max_inflight": 2, "link": None, "emulate": None, "torch_device": DEVICE,
            "dtype": "float32", "logits_dtype": "model", "verify": "exact",
            "limit_tokens": 40, "max_new_tokens": 12, "seed": 0,
            "model": "tiny", **over}


@pytest.fixture(scope="module")
def inputs(files, tmp_path_factory):
    """The tiny pair, coefficients with specfit-ca's fits, and a route predictor trained on it."""
    root = tmp_path_factory.mktemp("decoder")
    (root / "coefficients.json").write_text(json.dumps(COEFFICIENTS))
    predictor.run({"model": "tiny", "dtype": "float32", "logits_dtype": "model", "verify": "exact",
                  "torch_device": DEVICE,
                   "limit_tokens": 40, "max_new_tokens": 10, "k_max": 7, "max_depth": 5, "top_k_expand": 2,
                   "validation_requests": 1, "steps": 30, "batch_size": 64, "lr": 0.003, "seed": 0, "threads": 1},
                  {k: files[k] for k in ("prompts", "target", "drafter")}, {"predictor": root / "predictor"})
    return {"target": files["target"], "drafter": files["drafter"], "coefficients": root / "coefficients.json",
            "predictor": root / "predictor"}


@pytest.fixture(scope="module")
def decoders(inputs):
    return {name: Decoder(spec(method), inputs) for name, method in METHODS.items()}


def test_every_deployable_method_decodes_ars_tokens(decoders, prompts):
    for prompt in prompts[:2]:
        ar = decoders["ar"].generate(prompt).output_ids
        assert len(ar) == 12
        for name in METHODS:
            assert decoders[name].generate(prompt).output_ids == ar, name


def test_streaming_yields_generates_text(decoders, prompts):
    decoder = decoders["specfit-ca-learned"]
    decoder.reset()
    pieces = decoder.stream(prompts[1])
    streamed = []
    while True:
        try:
            streamed.append(next(pieces))
        except StopIteration as done:
            result = done.value
            break
    assert len(streamed) > 1 and "".join(streamed) == result.text
    decoder.reset()
    again = decoder.generate(prompts[1])
    assert again.text == result.text and again.output_ids == result.output_ids
    assert again.text == decoder.tokenizer.decode(again.output_ids, skip_special_tokens=True)


def test_the_figures_are_the_decode_runs_metrics_for_the_same_request(inputs, prompts, tmp_path):
    """The decode stage on one prompt (after its warm-up, from an empty cache) and a new decoder on it, with the
    method whose decisions depend most on what came before (the cache, the cycles it drafted in)."""
    name = "specfit-ca-learned"
    pq.write_table(pa.Table.from_pylist([{"request_id": 0, "question_id": 0, "category": "test", "prompt": "",
                                          "prompt_ids": prompts[2], "n_prompt": len(prompts[2])}],
                                        schema=PROMPTS_SCHEMA), tmp_path / "prompts.parquet")
    run = {k: tmp_path / f"run.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(dict(spec(METHODS[name]), warmup_tokens=3), dict(inputs, prompts=tmp_path / "prompts.parquet"), run)
    metrics = json.loads(run["metrics"].read_text())
    result = Decoder(spec(METHODS[name]), inputs).generate(prompts[2])
    figures = result.figures
    timed = {"tps_dec", "select_ms_per_cycle"}
    assert {k: figures[k] for k in FIGURES if k not in timed} == {k: metrics[k] for k in FIGURES if k not in timed}
    assert figures["tps_dec"] > 0 and figures["select_ms_per_cycle"] > 0
    assert figures["timing_label"] == metrics["timing_label"] and figures["slots"] == 4
    assert figures["routes"] == "learned" and figures["method"] == "specfit-ca"
    assert pq.read_table(run["requests"]).column("output_ids").to_pylist() == [result.output_ids]
    assert pq.read_table(run["cycles"]).column("selected").to_pylist() == [c["selected"] for c in result.cycles]


def test_compare_runs_ar_on_the_same_target_from_an_empty_cache(decoders, prompts):
    decoder = decoders["specfit-learned"]
    ours, ar = compare(decoder, prompts[0])
    assert ar.figures["method"] == "ar" and ours.figures["method"] == "specfit"
    assert ar.output_ids == ours.output_ids and ar.cycles[0]["selected"] == []
    assert decoder.loaded.method.name == "specfit"  # the decoder itself still decodes with its method


def test_bad_requests_are_refused_by_name(decoders):
    decoder = decoders["ar"]
    with pytest.raises(SpecFitError, match="the prompt is 40 tokens, and tiny takes at most 40 tokens"):
        decoder.generate(list(range(40)))
    with pytest.raises(SpecFitError, match="the prompt is empty"):
        decoder.generate("  ")
    with pytest.raises(SpecFitError, match="has no chat template: pass token ids"):
        decoder.generate("Hello")  # the tiny tokenizer has none
    with pytest.raises(SpecFitError, match="ask for at least 1 token"):
        decoder.generate([1, 2, 3], max_new_tokens=0)


def test_oracle_methods_are_refused_naming_the_deployable_alternative():
    config = load_config(ROOT / "config.yaml", ROOT / SCHEMA)
    for method in ("ar", "eagle3", "specfit-learned", "specfit-ca-learned", "specfit-prefetch", "eagle3-prefetch"):
        deployable(config, method)
    with pytest.raises(SpecFitError, match=r"'specfit' reads its expert routes from an atlas .* experiment oracle.*"
                                           r"use --method specfit-learned, or --routes learned"):
        deployable(config, "specfit")
    config["methods"]["specfit-ca"]["routes"] = "atlas"
    with pytest.raises(SpecFitError, match=r"'specfit-ca' reads .* use --method specfit-ca-learned, or --routes "
                                           r"learned to run 'specfit-ca'"):
        deployable(config, "specfit-ca")
    with pytest.raises(SpecFitError, match=r"'specfit-prefetch-atlas' reads .* use --method specfit-prefetch, or"):
        deployable(config, "specfit-prefetch-atlas")
    del config["methods"]["specfit-ca-learned"]
    with pytest.raises(SpecFitError, match=r"'specfit-ca' reads .* use --routes learned to run 'specfit-ca'"):
        deployable(config, "specfit-ca")


def test_missing_workflow_outputs_name_their_snakemake_target(tmp_path):
    """A config whose calibration and predictor were never made: the message names the file to ask Snakemake for,
    or for the shipped toy the command that restores it."""
    (tmp_path / "workflow/schemas").mkdir(parents=True)
    (tmp_path / SCHEMA).write_text((ROOT / SCHEMA).read_text())
    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    with pytest.raises(SpecFitError, match=r"'models\.toy\.shipped': the shipped toy's manifest .* is missing"):
        Decoder.from_config("toy", "cpu-a100", "ar", configfile=tmp_path / "config.yaml")
    (tmp_path / paths.SHIPPED_MANIFEST).parent.mkdir(parents=True)
    shutil.copy(ROOT / paths.SHIPPED_MANIFEST, tmp_path / paths.SHIPPED_MANIFEST)
    calibration = paths.calibration("toy", "cpu-a100", "cache")
    with pytest.raises(SpecFitError, match=rf"no calibration of toy on cpu-a100 at .*: make it with "
                                           rf"`snakemake --cores 1 {calibration}`"):
        Decoder.from_config("toy", "cpu-a100", "specfit-learned", configfile=tmp_path / "config.yaml")
    with pytest.raises(SpecFitError, match=r"no shipped toy target at .*: restore the shipped files with "
                                           r"`git checkout -- data/models/toy`"):
        Decoder.from_config("toy", "cpu-a100", "ar", configfile=tmp_path / "config.yaml")
    (tmp_path / "mytoy.yaml").write_text("models: {mytoy: {target: data/models/mytoy/target, drafter: "
                                         "data/models/mytoy/drafter, toy: true, main_slots: {cpu-a100: 4}}}\n")
    with pytest.raises(SpecFitError, match=r"no toy target for mytoy at .*`snakemake --cores 1 "
                                           r"data/models/mytoy/target`"):
        Decoder.from_config("mytoy", "cpu-a100", "ar", configfile=tmp_path / "config.yaml",
                            overlays=[tmp_path / "mytoy.yaml"])
    for name in (paths.toy_model("toy", "target"), paths.toy_model("toy", "drafter"), calibration):
        (tmp_path / name).mkdir(parents=True)
    with pytest.raises(SpecFitError, match=rf"no route predictor for toy at .*`snakemake --cores 1 "
                                           rf"{paths.predictor('toy')}`"):
        Decoder.from_config("toy", "cpu-a100", "specfit-learned", configfile=tmp_path / "config.yaml")
    with pytest.raises(SpecFitError, match="unknown device 'gpu': the config defines cpu-a100, cpu-4090"):
        Decoder.from_config("toy", "gpu", "ar", configfile=tmp_path / "config.yaml")
    with pytest.raises(SpecFitError, match="unknown model 'llama'"):
        Decoder.from_config("llama", "cpu-a100", "ar", configfile=tmp_path / "config.yaml")
    with pytest.raises(SpecFitError, match="unknown method 'medusa': the config's deployable methods are ar, eagle3, "
                                           "specfit-learned, specfit-ca-learned, specfit-prefetch, eagle3-prefetch, "
                                           "specfit-dense, specfit-online$"):
        Decoder.from_config("toy", "cpu-a100", "medusa", configfile=tmp_path / "config.yaml")
    with pytest.raises(SpecFitError, match="no config at"):
        Decoder.from_config("toy", "cpu-a100", "ar", configfile=tmp_path / "nowhere.yaml")


TOY = [paths.toy_model("toy", "target"), paths.toy_model("toy", "drafter"), paths.predictor("toy"),
       paths.calibration("toy", "cpu-a100link", "cache")]


@pytest.mark.skipif(not all((ROOT / p).exists() for p in TOY), reason="the workflow's toy is not built here")
def test_the_workflows_toy_decodes_ars_tokens_with_every_deployable_method(monkeypatch):
    monkeypatch.chdir(ROOT)
    methods = [("ar", None), ("eagle3", None), ("specfit-learned", None), ("specfit-ca", "learned")]
    outputs = {}
    for method, routes in methods:
        decoder = Decoder.from_config("toy", "cpu-a100link", method, routes=routes, max_new_tokens=8)
        outputs[method] = decoder.generate("Summarize: the cat sat on the mat all day long.").output_ids
    assert len(outputs["ar"]) > 1 and all(ids == outputs["ar"] for ids in outputs.values())


def m5_max() -> dict:
    """The source measurement of the workflow's resident devices (config.resident.yaml; gather set per test)."""
    return yaml.safe_load((Path(__file__).resolve().parents[1] / "config.resident.yaml").read_text())[
        "devices"]["cpu-m5max-pair"]["resident"]


@pytest.mark.parametrize("gather", ["pair", "distinct"])
def test_a_resident_device_decodes_ars_tokens_with_no_copy(inputs, prompts, gather):
    """On a resident device (every expert in memory, the M5 Max's measured widths) AR, EAGLE-3 and SpecFit decode
    AR's tokens, nothing is copied, and the timings say where they come from."""
    resident = {"resident": {**m5_max(), "gather": gather}}
    outputs = {}
    for name in ("ar", "eagle3", "specfit-learned"):
        if DEVICE != "cpu":
            pytest.skip("a resident device is emulated on a CPU")
        decoder = Decoder(spec(METHODS[name], slots=8, emulate=resident), inputs)  # the tiny target: 8 experts
        result = decoder.generate(prompts[0])
        outputs[name] = result.output_ids
        assert result.figures["h2d_per_token"] == 0 and decoder.loaded.engine.h2d_transfers == 0
        assert result.figures["timing_label"] == f"emulated M5 Max (resident, {gather} gather), virtual clock"
        assert result.figures["tps_dec"] > 0
    assert len(outputs["ar"]) == 12 and all(ids == outputs["ar"] for ids in outputs.values())


def test_a_resident_device_calibrates_at_every_expert_and_specfit_decodes_on_it(inputs, files, prompts, tmp_path):
    """Calibration on a resident device runs its probes at slots = every expert (nothing copied) and its NNLS fit
    works as on the other devices (β then prices an expert read, not a copy); SpecFit on those coefficients decodes
    AR's tokens."""
    from specfit.stages import calibrate

    if DEVICE != "cpu":
        pytest.skip("a resident device is emulated on a CPU")
    resident = {"resident": {**m5_max(), "gather": "distinct"}}
    protocol = {"cycle_boundaries": [0, 2], "sizes": 8, "repeats": 2, "limit_tokens": 60}
    outputs = {"coefficients": tmp_path / "c.json", "points": tmp_path / "c.points.parquet"}
    calibrate.run({"dtype": "float32", "torch_device": "cpu", "max_inflight": 2, "link": None, "emulate": resident,
                   "slots": 8, "coefficients": "fit", "protocol": protocol, "seed": 0, "model": "tiny",
                   "logits_dtype": "model", "verify": "exact"}, files, outputs)
    coefficients = json.loads(outputs["coefficients"].read_text())
    points = pq.read_table(outputs["points"]).to_pylist()
    assert coefficients["cache"] is True and coefficients["slots"] == 8 and coefficients["source"] == "fit"
    assert min(coefficients["b"]) >= 0 and coefficients["beta"] > 0  # an expert read costs: β prices it
    assert all(p["y_ms"] > 8.0 for p in points)  # every probe costs at least the fitted single-token path
    calibrated = {**inputs, "coefficients": outputs["coefficients"]}
    ar = Decoder(spec(METHODS["ar"], slots=8, emulate=resident), calibrated).generate(prompts[0])
    for name in ("specfit-learned", "specfit-ca-learned"):
        ours = Decoder(spec(METHODS[name], slots=8, emulate=resident), calibrated).generate(prompts[0])
        assert ours.output_ids == ar.output_ids and ours.figures["h2d_per_token"] == 0, name


def test_a_tuned_method_is_refused_naming_the_fixed_tree_alternative():
    config = load_config(ROOT / "config.yaml", ROOT / SCHEMA, ROOT / "config.resident.yaml")
    with pytest.raises(SpecFitError, match=r"'eagle3-tuned' decodes with the tree the tune rule chose .*"
                                           r"data/tune/<model>/<device>/<workload>/eagle3-tuned/slots<N>.json.* "
                                           r"kind eagle3"):
        deployable(config, "eagle3-tuned")


def test_the_shipped_toy_in_bf16_decodes_its_bf16_ars_tokens(monkeypatch):
    """config.bf16.yaml: the shipped toy in bfloat16 with the exact verify; EAGLE-3's trees commit AR's tokens."""
    monkeypatch.chdir(ROOT)
    prompts = ["Summarize: the council voted to close the bridge for repairs next spring.",
               "Tom has 3 boxes of 12 pencils and gives away 7. How many pencils are left?"]
    decoders = {m: Decoder.from_config("toy", "cpu-a100", m, overlays=["config.bf16.yaml"], max_new_tokens=32)
                for m in ("ar", "eagle3")}
    assert decoders["ar"].spec.dtype == "bfloat16" and decoders["ar"].spec.verify == "exact"
    for prompt in prompts:
        ar, eagle = (decoders[m].generate(prompt) for m in ("ar", "eagle3"))
        assert len(ar.output_ids) > 1 and eagle.output_ids == ar.output_ids
        assert eagle.figures["committed_per_cycle"] > 1  # drafts were accepted: trees were verified and committed


@pytest.mark.parametrize("method", ["eagle3", "specfit-learned"])
def test_a_sampled_decoder_prints_ars_sampled_tokens_and_records_its_sampling(inputs, prompts, method):
    sampling = {"temperature": 0.8, "top_p": 0.95, "top_k": 0, "seed": 7, "sampling": "coupled"}
    decoder = Decoder(spec(METHODS[method], sampling=sampling), inputs)
    ours, ar = compare(decoder, prompts[0])
    assert ours.output_ids == ar.output_ids and ours.figures["sampling"] == ar.figures["sampling"] == sampling
    greedy = Decoder(spec(METHODS[method]), inputs).generate(prompts[0])
    assert greedy.output_ids != ours.output_ids and greedy.figures["sampling"]["temperature"] == 0
