"""Config validation at load: typos and wrong types stop the workflow with the key named."""

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specfit.errors import SpecFitError
from specfit.planning.code import code_hash
from specfit.planning.config import validate_config
from specfit.planning.matrix import (
    DecodeRun,
    decode_inputs,
    decode_runs,
    fold_ids,
    reference_run,
    report_inputs,
    theory_cost,
    theory_file,
    theory_runs,
    tune_question_ids,
    workload_ids,
)
from specfit.planning.paths import atlas_variant
from specfit.speculative.config import MethodConfig


@pytest.fixture(autouse=True)
def in_root(root, monkeypatch):
    """Validation looks for the files a config names (the shipped toy's manifest) in the working directory, as
    Snakemake runs: the workflow root."""
    monkeypatch.chdir(root)


@pytest.fixture()
def config(root):
    return yaml.safe_load((root / "config.yaml").read_text())


@pytest.fixture()
def schema(root):
    return root / "workflow/schemas/config.schema.yaml"


def test_default_config_is_valid_and_gets_defaults(config, schema):
    validate_config(config, schema)
    assert config["spec_bench"]["sha256"] == "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
    assert config["methods"]["eagle3"] == {"kind": "eagle3", "k_max": 7, "max_depth": 5, "top_k_expand": 2}
    assert config["devices"]["cpu-a100link"]["max_inflight"] == 2


def test_unknown_key_is_named(config, schema):
    config["workloads"]["gsm8k"]["limt_tokens"] = 512
    with pytest.raises(SpecFitError, match=r"'workloads\.gsm8k\.limt_tokens' is not allowed.*limit_tokens"):
        validate_config(config, schema)


def test_wrong_type_is_named(config, schema):
    config["methods"]["specfit"]["k_max"] = "seven"
    with pytest.raises(SpecFitError, match=r"'methods\.specfit\.k_max': 'seven' is not of type 'integer'"):
        validate_config(config, schema)


def test_wrong_enum_is_named(config, schema):
    config["devices"]["cpu-a100link"]["torch_device"] = "tpu"
    with pytest.raises(SpecFitError, match=r"'devices\.cpu-a100link\.torch_device'.*cpu.*cuda"):
        validate_config(config, schema)


def test_the_old_rule_key_is_refused_naming_kind(config, schema):
    config["methods"]["specfit"]["rule"] = config["methods"]["specfit"].pop("kind")
    with pytest.raises(SpecFitError, match=r"config key 'methods\.specfit\.rule' was renamed to 'kind': write kind: "
                                           r"specfit"):
        validate_config(config, schema)
    with pytest.raises(SpecFitError, match="'rule' was renamed to 'kind'"):
        MethodConfig.of_entry({"rule": "specfit"})


def test_an_unknown_kind_is_named_at_load(config, schema):
    config["methods"]["specfit"]["kind"] = "specfti"
    with pytest.raises(SpecFitError, match=r"'methods\.specfit\.kind': unknown method kind 'specfti'"):
        validate_config(config, schema)


def test_run_naming_an_undefined_method(config, schema):
    config["runs"][0]["methods"].append("medusa")
    with pytest.raises(SpecFitError, match=r"'runs\.0\.methods' names 'medusa'"):
        validate_config(config, schema)


def test_missing_main_slots_for_a_device(config, schema):
    del config["models"]["toy"]["main_slots"]["cpu-4090"]
    with pytest.raises(SpecFitError, match=r"main_slots' has no entry for device 'cpu-4090'"):
        validate_config(config, schema)


def test_snakemake_stops_before_any_job(root, config, tmp_path):
    bad = copy.deepcopy(config)
    bad["seed"] = "zero"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "reports/all", "--configfile", str(path)],
        check=False, cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "config key 'seed': 'zero' is not of type 'integer'" in proc.stdout + proc.stderr


def test_decode_matrix(config, schema):
    """The default matrix: the runs a claim reads, on the paper's sample (40 summarization articles and 80 GSM8K
    questions on the A100, the 40 odd-numbered GSM8K questions on the RTX 4090)."""
    validate_config(config, schema)
    runs = decode_runs(config)
    assert len(runs) == len(set(runs)) == 37
    assert {(r.device, r.workload) for r in runs} == {("cpu-a100", "summarization"), ("cpu-a100", "gsm8k"),
                                                      ("cpu-4090", "gsm8k-odd")}
    assert [len(workload_ids(config, w)) for w in ("summarization", "gsm8k", "gsm8k-odd")] == [40, 80, 40]
    # the paper's methods, the tuned tree, specfit-online and the thesis's dense cost in every cell, with the cache
    # and without it
    cells = {(r.device, r.workload, r.slots) for r in runs if r.method == "specfit"}
    assert cells == {("cpu-a100", w, s) for w in ("summarization", "gsm8k") for s in (0, 12)} | {
        ("cpu-4090", "gsm8k-odd", s) for s in (0, 8)}
    for method in ("ar", "eagle3", "specfit-dense", "eagle3-tuned", "specfit-online"):
        assert cells == {(r.device, r.workload, r.slots) for r in runs if r.method == method}, method
    run = DecodeRun("toy", "cpu-a100", "gsm8k", "specfit-noisy", 12)
    assert run in runs and reference_run(config, run) == DecodeRun("toy", "cpu-a100", "gsm8k", "ar", 0)
    assert reference_run(config, DecodeRun("toy", "cpu-a100", "gsm8k", "ar", 0)) is None
    assert atlas_variant("specfit-noisy", 12) == "specfit-noisy-cache"
    assert atlas_variant("specfit", 0) == "specfit-nocache"
    assert {(r.device, r.workload, r.slots) for r in theory_runs(config)} == {
        ("cpu-a100", "summarization", 12), ("cpu-a100", "gsm8k", 12), ("cpu-4090", "gsm8k-odd", 8)}
    # the dense cost reads the calibration, no routes: no atlas, no predictor
    dense = decode_inputs(config, DecodeRun("toy", "cpu-a100", "gsm8k", "specfit-dense", 12))
    assert dense["coefficients"] == "data/calibration/toy/cpu-a100/cache.json"
    assert "atlas" not in dense and "predictor" not in dense


@pytest.fixture()
def beyond(root, config):
    """config.yaml with config.beyond.yaml merged over it, as --configfile merges it."""
    from snakemake.utils import update_config

    update_config(config, yaml.safe_load((root / "config.beyond.yaml").read_text()))
    return config


def test_the_beyond_overlay_adds_the_cells_no_claim_reads(config, beyond, schema):
    default = set(decode_runs(yaml.safe_load((Path("config.yaml")).read_text())))
    validate_config(beyond, schema)
    runs = decode_runs(beyond)
    assert default <= set(runs) and len(runs) == len(set(runs)) == 59
    # the prefetching methods beside specfit-prefetch's self without prefetch, on the A100 at the main slots
    prefetching = ("specfit-ca-learned", "specfit-prefetch", "specfit-prefetch-atlas", "eagle3-prefetch")
    assert {(r.device, r.workload, r.method, r.slots) for r in runs if r.method in prefetching} == {
        ("cpu-a100", w, m, 12) for w in ("summarization", "gsm8k") for m in prefetching}
    assert DecodeRun("toy", "cpu-a100", "summarization", "specfit", 3) in runs
    assert {(r.workload, r.slots) for r in runs if r.method == "specfit-ca"} == {
        (w, s) for w in ("summarization", "gsm8k") for s in (0, 12)}
    # the link-only cell has no AR without the cache: its reference is its AR with the cache
    link_ar = DecodeRun("toy", "cpu-a100link", "gsm8k", "ar", 12)
    assert reference_run(beyond, DecodeRun("toy", "cpu-a100link", "gsm8k", "eagle3", 12)) == link_ar


def test_theory_runs_hold_specfit_specfit_ca_and_specfit_prefetch(beyond, schema):
    """Table 5 on SpecFit's pools (the paper's cost, the workload's file), on specfit-ca's and on the exact-route
    specfit-prefetch's (the cache-aware cost, a file of their own), each with the cache at the main slot count and
    exact routes (specfit-prefetch with learned routes has no Table 5)."""
    config = beyond
    validate_config(config, schema)
    cells = {("cpu-a100", "summarization", 12), ("cpu-a100", "gsm8k", 12)}
    runs = theory_runs(config)
    assert sorted((r.device, r.workload, r.slots, r.method) for r in runs) == sorted(
        [(*cell, method) for cell in cells for method in ("specfit", "specfit-ca", "specfit-prefetch-atlas")]
        + [("cpu-4090", "gsm8k-odd", 8, "specfit"), ("cpu-a100link", "gsm8k", 12, "specfit")])
    files = {(r.method, theory_cost(config, r), theory_file(config, r)) for r in runs if r.device == "cpu-a100"
             and r.workload == "gsm8k"}
    assert files == {("specfit", "paper", "data/theory/toy/cpu-a100/gsm8k.json"),
                     ("specfit-ca", "cache_aware", "data/theory/toy/cpu-a100/gsm8k.specfit-ca.json"),
                     ("specfit-prefetch-atlas", "cache_aware",
                      "data/theory/toy/cpu-a100/gsm8k.specfit-prefetch-atlas.json")}
    # one run per rule and cell: a second SpecFit entry with exact routes does not add a file
    config["methods"]["specfit-k5"] = dict(config["methods"]["specfit"], k_max=5)
    config["runs"][0]["methods"].append("specfit-k5")
    assert theory_runs(config) == runs


def test_code_hash_follows_specfit_imports(tmp_path, monkeypatch):
    import specfit.planning.code as wf

    pkg = tmp_path / "specfit"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "stage.py").write_text("from specfit.sub import helper\nimport numpy\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "helper.py").write_text("X = 1\n")
    (pkg / "other.py").write_text("Y = 1\n")
    monkeypatch.setattr(wf, "PACKAGE_DIR", pkg)
    before = code_hash("specfit.stage")
    (pkg / "other.py").write_text("Y = 2\n")  # not imported: same hash
    assert code_hash("specfit.stage") == before
    (pkg / "sub" / "helper.py").write_text("X = 2\n")  # imported transitively: new hash
    assert code_hash("specfit.stage") != before


def test_code_hash_follows_package_data(tmp_path, monkeypatch):
    import specfit.planning.code as wf

    pkg = tmp_path / "specfit"
    (pkg / "templates").mkdir(parents=True)
    (pkg / "report.py").write_text("X = 1\n")
    (pkg / "templates" / "page.j2").write_text("{{ x }}")
    monkeypatch.setattr(wf, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(wf, "MODULE_DATA", {"specfit.report": ("templates/page.j2",)})
    before = code_hash("specfit.report")
    (pkg / "templates" / "page.j2").write_text("<b>{{ x }}</b>")  # a template edit reruns the report
    assert code_hash("specfit.report") != before


def test_a_forbidden_combination_says_what_it_is(config, schema):
    config["workloads"]["gsm8k"]["source"] = {"path": "data/raw/gsm8k/test.jsonl", "hub": "openai/gsm8k"}
    with pytest.raises(SpecFitError,
                       match=r"workloads\.gsm8k\.source.*Both `path` and `hub` set, which is not allowed"):
        validate_config(config, schema)


def test_k_max_beyond_the_fitted_intercepts_is_named(config, schema):
    """SpecFit needs b_0..b_K: a calibration of fewer probe sizes would fail deep inside the selector."""
    config["calibration"] = {"sizes": 6}
    with pytest.raises(SpecFitError, match=r"'methods\.specfit\.k_max' is 7.*b_0\.\.b_5.*calibration\.sizes"):
        validate_config(copy.deepcopy(config), schema)
    config["calibration"] = {"sizes": 8}
    with pytest.raises(SpecFitError, match=r"'methods\.specfit-online\.k_max' is 16.*b_0\.\.b_7.*calibration\.sizes"):
        validate_config(copy.deepcopy(config), schema)
    for method in ("specfit", "specfit-noisy", "specfit-dense", "specfit-ca", "specfit-learned", "specfit-ca-learned",
                   "specfit-prefetch", "specfit-prefetch-atlas", "eagle3-prefetch", "specfit-online"):
        config["methods"][method]["k_max"] = 6
    config["calibration"]["sizes"] = 7
    validate_config(config, schema)


def test_a_pool_too_wide_to_search_exactly_is_refused_by_name(config, schema):
    """A width-3 pool at K 16 gives the exact search 12.5 million subtrees per selection (120 ms a cycle, measured):
    refused at load, before any job, naming the method and what to lower; width 2 at K 16 (3,269) is fine."""
    config["methods"]["specfit-online"]["top_k_expand"] = 3
    with pytest.raises(SpecFitError, match=r"'methods\.specfit-online': max_depth 5, top_k_expand 3 and k_max 16 give "
                                           r"a full pool 12,549,607 legal subtrees.*lower k_max or top_k_expand"):
        validate_config(copy.deepcopy(config), schema)
    config["methods"]["specfit-online"]["k_max"] = 7  # 4,685
    validate_config(copy.deepcopy(config), schema)
    config["methods"]["eagle3"]["top_k_expand"] = 4  # EAGLE-3 does not search
    validate_config(config, schema)


def test_predictor_questions_must_not_be_evaluated(config, schema):
    """The learned route predictor trains on questions no workload evaluates: an overlap is named before any job."""
    config["predictor"] = {"question_ids": [{"start": 241, "stop": 245}]}  # 242 and 244 are summarization's
    with pytest.raises(SpecFitError, match=r"'predictor\.question_ids' holds questions .*\(242, 244\)"):
        validate_config(config, schema)
    config["predictor"] = {"question_ids": [{"start": 241, "stop": 245, "step": 2}], "method": "eagle4"}
    with pytest.raises(SpecFitError, match=r"'predictor\.method' names 'eagle4'"):
        validate_config(config, schema)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(torch_device="cuda"), r"'devices\.cpu-a100\.emulate' emulates a GPU on a cuda device"),
    (lambda d: d.update(link={"bandwidth_gbps": 1.0}), r"'devices\.cpu-a100\.emulate' comes with 'devices\.cpu-a100"
                                                       r"\.link'"),
    (lambda d: d["emulate"].update(expert_ms=-0.5), r"devices\.cpu-a100\.emulate\.expert_ms"),
    (lambda d: d["emulate"].pop("copy_ms"), r"devices\.cpu-a100\.emulate.*copy_ms"),
    (lambda d: d["emulate"].update(fixed_ms=0), r"devices\.cpu-a100\.emulate\.fixed_ms"),
])
def test_a_bad_emulated_device_is_named_at_load(config, schema, edit, message):
    """An emulated GPU on a GPU, beside a link, or with a missing, negative or zero cost is refused, naming the key."""
    edit(config["devices"]["cpu-a100"])
    with pytest.raises(SpecFitError, match=message):
        validate_config(config, schema)


TRAINED = {"target": "data/models/mytoy/target", "drafter": "data/models/mytoy/drafter", "toy": True,
           "main_slots": {"cpu-a100": 4}}


@pytest.mark.parametrize("edit, message", [
    (lambda models: models["toy"].update(toy=True),
     r"'models\.toy': `toy: true` \(the toy rules train it\) and `shipped: true` .* exclude each other"),
    (lambda models: models["toy"].update(shipped=False, toy=True),
     r"'models\.toy\.toy': a toy to train named 'toy', whose folders are the shipped toy's \(data/models/toy/\): "
     r"training would overwrite it; pick another model name"),
    (lambda models: models.update(mytoy={**TRAINED, "target": "data/models/toy/target"}),
     r"'models\.mytoy\.target': a toy model is built at 'data/models/mytoy/target'"),  # never the shipped toy's
    (lambda models: models.update(other={**models["toy"]}),
     r"'models\.other\.shipped': the shipped toy is the model named 'toy'"),
    (lambda models: models["toy"].update(drafter="data/models/toy/drafter-v2"),
     r"'models\.toy\.drafter': the shipped toy's drafter is 'data/models/toy/drafter'"),
])
def test_the_shipped_toy_is_never_retrained_or_renamed(config, schema, edit, message):
    """A model both trained and shipped, a toy to train under the shipped toy's name or in its folders, and the
    shipped toy under another name or folder are refused at load, naming the key."""
    edit(config["models"])
    with pytest.raises(SpecFitError, match=message):
        validate_config(config, schema)


@pytest.mark.parametrize("categories, message", [
    (["qa", "summarization"], r"'toy\.drafter\.categories' names 'summarization', a workload"),
    (["math_reasoning"], r"'toy\.drafter\.categories' names 'math_reasoning', which holds 80 evaluated question\(s\) "
                         r"\(401, 402, 403, 404, 405, 406, …"),
    (["qa", "news"], r"'toy\.drafter\.categories' names 'news', which is not a Spec-Bench category"),
    (["gsm8k"], r"'toy\.drafter\.categories' names 'gsm8k', a workload"),
])
def test_a_drafter_data_selection_naming_an_evaluated_question_or_workload_is_refused(config, schema, categories,
                                                                                      message):
    """The drafter trains on chat (docs/toy.md): a category that holds an evaluated question, a workload's name and a
    name Spec-Bench does not have are refused at load, naming the key."""
    config["toy"]["drafter"]["categories"] = categories
    with pytest.raises(SpecFitError, match=message):
        validate_config(config, schema)


def test_a_category_leaves_the_drafter_data_once_a_workload_evaluates_it(config, schema):
    """Which categories are refused follows the config: translation is chat until a workload evaluates question 161."""
    ok = copy.deepcopy(config)
    ok["toy"]["drafter"]["categories"] = ["translation", "qa", "rag"]
    assert validate_config(ok, schema)["toy"]["drafter"]["categories"] == ["translation", "qa", "rag"]
    config["toy"]["drafter"]["categories"] = ["translation"]
    config["workloads"]["wmt"] = {"question_ids": {"start": 161, "stop": 170}, "limit_tokens": 512}
    with pytest.raises(SpecFitError, match=r"'toy\.drafter\.categories' names 'translation', which holds 10 "
                                           r"evaluated question\(s\) \(161, 162"):
        validate_config(config, schema)


def test_a_toy_of_your_own_trains_under_another_name(config, schema):
    config["models"]["mytoy"] = TRAINED
    validate_config(config, schema)
    assert (config["models"]["mytoy"]["shipped"], config["models"]["toy"]["toy"]) == (False, False)


def test_a_shipped_toy_without_its_manifest_is_refused(config, schema, tmp_path):
    toy = tmp_path / "data/models/toy"
    with pytest.raises(SpecFitError, match=re.escape(f"'models.toy.shipped': the shipped toy's manifest "
                                                     f"{toy}/SHIPPED.json is missing: restore the shipped toy with "
                                                     f"`git checkout -- {toy}`")):
        validate_config(copy.deepcopy(config), schema, tmp_path)
    validate_config(config, schema, None)  # a file check asked for by nobody


@pytest.fixture()
def resident(root, config):
    """config.yaml with config.resident.yaml merged over it, as --configfile merges it."""
    from snakemake.utils import update_config

    update_config(config, yaml.safe_load((root / "config.resident.yaml").read_text()))
    return config


def test_the_resident_overlay_is_valid_and_runs_the_resident_matrix_alone(config, resident, schema):
    validate_config(resident, schema)
    assert resident["devices"]["cpu-m5max-distinct"]["resident"]["gather"] == "distinct"
    # its runs replace the default matrix (Snakemake's merge replaces a list): resident devices only
    assert all(d.startswith("cpu-m5max") for run in resident["runs"] for d in run["devices"])
    runs = decode_runs(resident)
    for gather in ("pair", "distinct"):
        for workload in ("summarization", "gsm8k"):
            assert {r.method for r in runs if (r.device, r.workload) == (f"cpu-m5max-{gather}", workload)} == {
                "ar", "eagle3", "eagle3-tuned", "specfit", "specfit-ca", "specfit-online"}
        shares = {resident["devices"][d]["resident"]["draft_share"] for d in {r.device for r in runs}
                  if resident["devices"][d]["resident"]["gather"] == gather}
        assert shares == {0.034, 0.068, 0.136}  # the assumed drafter cost, at half and double


def _resident_run(config, slots):
    config["runs"].append({"models": ["toy"], "devices": ["cpu-m5max-pair"], "workloads": ["gsm8k"],
                           "methods": ["ar"], "slots": slots})


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["resident"].update(widths=[1, 3, 2, 5, 8]),
     r"'devices\.cpu-m5max-pair\.resident\.widths' must be strictly increasing"),
    (lambda d: d["resident"].update(ms=[8.47, 13.49, 12.0, 20.67, 28.13]),
     r"'devices\.cpu-m5max-pair\.resident\.ms' falls as the width grows"),
    (lambda d: d["resident"].update(widths=[1, 2], ms=[8.0, 9.0]),
     r"'devices\.cpu-m5max-pair\.resident\.widths' has 2 widths"),
    (lambda d: d["resident"].update(ms=[8.47, 0, 15.64, 20.67, 28.13]),
     r"'devices\.cpu-m5max-pair\.resident\.ms' must hold positive costs"),
    (lambda d: d["resident"].update(experts_per_token=200),
     r"'devices\.cpu-m5max-pair\.resident\.experts_per_token' is 200, above the 128 experts"),
    (lambda d: d["resident"].update(gather="union"), r"'devices\.cpu-m5max-pair\.resident\.gather'"),
    (lambda d: d.update(link={"bandwidth_gbps": 1.0}),
     r"'devices\.cpu-m5max-pair\.link' is given to a resident device"),
    (lambda d: d.update(max_inflight=2),  # the schema's default, given explicitly
     r"'devices\.cpu-m5max-pair\.max_inflight' is given to a resident device"),
    (lambda d: d.update(emulate={"name": "A100", "fixed_ms": 1, "token_ms": 0, "expert_ms": 0, "copy_ms": 0,
                                 "draft_ms": 1}),
     r"'devices\.cpu-m5max-pair\.emulate' is given to a resident device"),
    (lambda d: d.update(torch_device="cuda"), r"'devices\.cpu-m5max-pair\.resident' emulates a resident device on a "
                                              r"cuda device"),
])
def test_a_bad_resident_device_is_named_at_load(resident, schema, edit, message):
    edit(resident["devices"]["cpu-m5max-pair"])
    with pytest.raises(SpecFitError, match=message):
        validate_config(resident, schema)


def test_a_resident_device_needs_slots_for_every_expert(resident, schema):
    _resident_run(resident, [12, 32])
    with pytest.raises(SpecFitError, match=r"'runs\.2\.slots' gives resident device 'cpu-m5max-pair' \[12\] slots, "
                                           r"but model 'toy' has 32 experts per layer"):
        validate_config(copy.deepcopy(resident), schema)
    resident["runs"][-1]["slots"] = [32]
    resident["models"]["toy"]["main_slots"]["cpu-m5max-pair"] = 16
    with pytest.raises(SpecFitError, match=r"'models\.toy\.main_slots\.cpu-m5max-pair' is 16, but model 'toy' has 32"):
        validate_config(copy.deepcopy(resident), schema)
    resident["models"]["toy"]["main_slots"]["cpu-m5max-pair"] = 32
    validate_config(resident, schema)


def test_a_tuned_method_tunes_on_questions_its_workload_does_not_evaluate(resident, schema):
    validate_config(resident, schema)
    # the RTX 4090's 40 odd-numbered GSM8K questions: a tree tuned on 12 even-numbered ones, held out there
    assert tune_question_ids(resident, "gsm8k-odd") == list(range(402, 425, 2))
    run = DecodeRun("toy", "cpu-4090", "gsm8k-odd", "eagle3-tuned", 8)
    assert decode_inputs(resident, run)["tune"] == ["data/tune/toy/cpu-4090/gsm8k-odd/eagle3-tuned/slots8.json"]
    # the 40 even-numbered articles: cross-fitted, as the odd-numbered ones trained the toy target
    assert tune_question_ids(resident, "summarization", 1) == list(range(242, 289, 4))
    # GSM8K evaluates all 80: cross-fitted over 2 folds (question i of the run to fold i mod 2), each fold's tree
    # tuned on the first 12 of the other fold's
    assert fold_ids(resident, "gsm8k", 0) == list(range(401, 481, 2))
    assert tune_question_ids(resident, "gsm8k", 0) == list(range(402, 425, 2))
    assert tune_question_ids(resident, "gsm8k", 1) == list(range(401, 424, 2))
    with pytest.raises(SpecFitError, match="cross-fitted over 2 folds: name the fold"):
        tune_question_ids(resident, "gsm8k")
    run = DecodeRun("toy", "cpu-m5max-pair", "gsm8k", "eagle3-tuned", 32)
    folds = [f"data/tune/toy/cpu-m5max-pair/gsm8k/eagle3-tuned/slots32.fold{f}.json" for f in (0, 1)]
    assert decode_inputs(resident, run)["tune"] == folds
    assert set(folds) <= set(report_inputs(resident)["tune"])


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["methods"]["eagle3-tuned"].update(k_max=4),
     r"'methods\.eagle3-tuned\.k_max': the tune rule chooses"),
    (lambda c: c["workloads"]["gsm8k"].update(tune_folds=None),
     r"'workloads\.gsm8k\.tune_question_ids': a tuned method runs on workload 'gsm8k', which has no questions"),
    (lambda c: c["workloads"]["gsm8k"].update(tune_folds=None, max_requests=12,
                                              tune_question_ids={"start": 410, "stop": 415}),
     r"'workloads\.gsm8k\.tune_question_ids' holds questions the workload evaluates \(410, 411, 412\)"),
    (lambda c: c["workloads"]["gsm8k"].update(tune_question_ids={"start": 481, "stop": 490}),
     r"'workloads\.gsm8k\.tune_folds': cross-fitting tunes on the workload's own evaluated questions; drop it or "
     r"'workloads\.gsm8k\.tune_question_ids', not both"),
    (lambda c: c["workloads"]["gsm8k"].update(max_requests=3, tune_folds=4),
     r"'workloads\.gsm8k\.tune_folds' is 4, but the workload evaluates 3 questions: a fold would be empty"),
    (lambda c: c["devices"]["cpu-m5max-pair"].update(coefficients="paper-a100") or
     c["runs"][0]["methods"].append("specfit-dense"),
     r"'methods\.specfit-dense': kind 'specfit-dense' refits b_k on the calibration's probe points, but device "
     r"'cpu-m5max-pair' has no probes \(devices\.cpu-m5max-pair\.coefficients: paper-a100\)"),
    (lambda c: c.setdefault("tune", {}).update(max_depth=[1, 2, 3]),
     r"'tune\.max_depth' reaches 3, short of the paper's tree \(max_depth 5\)"),
    (lambda c: c.setdefault("tune", {}).update(top_k_expand=[1]),
     r"'tune\.top_k_expand' reaches 1, short of the paper's tree \(top_k_expand 2\)"),
    (lambda c: c["methods"].update({"wide": {"kind": "specfit-online", "routes": "learned", "k_max": 17}}) or
     c["runs"][0]["methods"].append("wide"),
     r"'methods\.wide\.k_max' is 17, but device 'cpu-m5max-pair' has intercepts b_0\.\.b_16 only"),
])
def test_a_bad_tuned_method_is_named_at_load(resident, schema, edit, message):
    edit(resident)
    with pytest.raises(SpecFitError, match=message):
        validate_config(resident, schema)


def test_a_targets_expert_count_is_read_as_the_model_loader_reads_it(tmp_path):
    """At config load, a resident run's slots are checked against the target's config.json, under the keys the model
    loader reads (one tuple each side of the torch boundary, held equal here), text_config first."""
    import json

    from specfit.models.loading import EXPERT_COUNT_KEYS as LOADER_KEYS
    from specfit.planning.config import EXPERT_COUNT_KEYS, model_experts

    assert EXPERT_COUNT_KEYS == LOADER_KEYS
    config = {"models": {"real": {"target": "target"}}}
    (tmp_path / "target").mkdir()
    for body, n in (({"n_routed_experts": 64}, 64), ({"text_config": {"num_local_experts": 8}}, 8),
                    ({"hidden_size": 4}, None)):
        (tmp_path / "target" / "config.json").write_text(json.dumps(body))
        assert model_experts(config, "real", tmp_path) == n, body
    assert model_experts(config, "real", None) is None  # no root: not known at load, the engine refuses later
