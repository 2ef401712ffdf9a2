"""The whole workflow on tests/smoke.yaml: every stage for real, then incremental reruns.

Runs `snakemake --cores 1 reports/all` in a copy of the workflow (so the repository's own data/ is untouched)
and checks the report's tables against the metrics.json files, the lossless check on every run, and that
Snakemake schedules exactly what an edit affects.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from report.figure_checks import assert_embedded, checking
from report.report_md import find, key_of, md_tables
from specfit import report
from specfit.planning import paths, specs
from specfit.planning.config import load_config
from specfit.planning.matrix import decode_runs, reference_run, report_inputs
from specfit.report.quantities import DRAFT_KEYS, METRICS

pytestmark = pytest.mark.slow


def snakemake(workdir: Path, *args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args, "--configfile", "smoke.yaml"],
        cwd=workdir, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def scheduled(workdir: Path, *configfiles: str) -> dict[str, int]:
    """Jobs a dry run would schedule, by rule."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "reports/all", "--configfile", "smoke.yaml", *configfiles],
        cwd=workdir, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stats = re.search(r"Job stats:\n(.*?)\n\n", proc.stdout, re.S)
    if stats is None:
        assert "Nothing to be done" in proc.stdout, proc.stdout[-2000:]
        return {}
    rows = [line.split() for line in stats.group(1).splitlines()[2:]]
    return {rule: int(n) for rule, n in rows if rule != "total"}


@pytest.fixture(scope="module")
def workflow(workflow_copy, tmp_path_factory):
    workdir = workflow_copy(tmp_path_factory.mktemp("workflow"))
    snakemake(workdir, "--cores", "1", "reports/all")
    return workdir, load_config(workdir / "config.yaml", workdir / "workflow/schemas/config.schema.yaml",
                                workdir / "smoke.yaml")  # merged as snakemake's --configfile merges them


def test_every_run_is_lossless_against_ar(workflow):
    workdir, config = workflow
    for run in decode_runs(config):
        metrics = json.loads((workdir / run.path / "metrics.json").read_text())
        assert metrics["n_requests"] == 2 and metrics["link_emulated"] is True
        device = config["devices"][run.device]
        if device["emulate"] is None and device.get("resident") is None:
            assert "emulated link" in metrics["timing_label"] and metrics["device"] is None
        else:  # the emulated A100 or resident device: the virtual clock moved by the modelled forwards and host work
            assert metrics["timing_label"] == ("emulated A100, virtual clock" if device["emulate"] else
                                               "emulated M5 Max (resident, distinct gather), virtual clock")
            device = metrics["device"]
            target = device["target"]
            assert target["forwards"] > 0 and target["modelled_s"] > 0
            modelled = sum(device[k]["modelled_s"] for k in ("target", "prefill", "drafter", "drafter_prefill"))
            assert modelled + device["host_s"] >= metrics["ms_per_cycle"] * metrics["cycles"] / 1e3 - 1e-9
            assert (metrics["device"]["drafter"]["forwards"] > 0) == (run.method != "ar")
        if reference_run(config, run) is None:
            assert metrics["lossless"] is None  # the reference itself (AR at its device's fewest slots)
        else:
            check = metrics["lossless"]
            assert check["n_requests"] == check["n_identical"] == 2, (run, check)


def test_report_tables_match_the_metrics(workflow):
    workdir, config = workflow
    out = workdir / "reports/all"
    assert (out / "index.html").is_file()
    tables = md_tables((out / "report.md").read_text())
    checked = 0
    for workload in sorted({run.workload for run in decode_runs(config) if run.device == "cpu-a100link"}):
        header, rows = find(tables, f"Counters per verification cycle, smoke / cpu-a100link, {workload}")
        for row in rows:
            slots = 0 if row[1] == "No" else int(re.fullmatch(r"Yes \((\d+)\)", row[1]).group(1))
            metrics = json.loads((workdir / f"data/decode/smoke/cpu-a100link/{workload}/{row[0]}/slots{slots}"
                                  / "metrics.json").read_text())
            for h, cell in zip(header[2:], row[2:]):
                key = key_of(h)
                expected = "–" if metrics[key] is None or (row[0] == "ar" and key in DRAFT_KEYS) else \
                    format(metrics[key], METRICS[key].fmt)
                assert cell == expected, (workload, row[0], slots, key)
                checked += 1
    assert checked > 0
    # the prefetching methods' section on the emulated A100, whose runs the smoke config holds
    md = (out / "report.md").read_text()
    assert "\n### Beyond the paper: prefetch while drafting\n" in md
    # the resident device: its section, with the tree the tune job chose for the tuned EAGLE-3
    # gsm8k is cross-fitted over two folds (config.yaml's tune_folds): each of the smoke's 2 questions is decoded
    # with the tree tuned on the other
    folds = [json.loads((workdir / paths.tune("smoke", "cpu-resident", "gsm8k", "eagle3-tuned", 8, fold)).read_text())
             for fold in (0, 1)]
    assert [f["decodes"] for f in folds] == [f["question_ids"] for f in reversed(folds)] and \
        sorted(q for f in folds for q in f["decodes"]) == [401, 402]
    header, rows = find(tables, "Every expert resident, smoke")
    tuned = next(r for r in rows if r[header.index("Method")] == "eagle3-tuned")
    for fold, f in enumerate(folds):
        chosen = f["chosen"]
        assert (f"fold {fold} (1 questions): depth {chosen['max_depth']}, width {chosen['top_k_expand']}, "
                f"k {chosen['k_max']} (tuned on 1 questions") in tuned[header.index("Tree")]
    assert "\n### Beyond the paper: every expert resident\n" in md
    for part, record in paths.TOY_RECORDS.items():  # the rule declares the trained toy's folders: their weights' sha256
        sha256 = json.loads((workdir / paths.toy_model("smoke", part) / record).read_text())["sha256"]
        assert f"**Weights of smoke {part}**: sha256 {sha256}; trained on " in md


def test_report_figures_read_well(workflow, monkeypatch, tmp_path):
    """The report drawn again from the smoke DAG's outputs, every figure checked as it is saved (no layout warning,
    nothing off the canvas, no two texts overlapping: `report.figure_checks`): the throughput figures of each device,
    the tuned EAGLE-3 among the resident device's methods, the claims on the emulated A100 and across the resident
    devices, each embedded in the page with alt text naming what it shows."""
    workdir, config = workflow
    figures = checking(monkeypatch)
    monkeypatch.chdir(workdir)  # the report rule runs in the workflow root
    out = tmp_path / "report"
    report.write(specs.report(config), report_inputs(config), out)
    assert_embedded(out, ["smoke", *config["devices"], *config["workloads"]])
    assert {"smoke-cpu-a100link-summarization-tps", "smoke-cpu-a100link-gsm8k-tps", "smoke-cpu-a100-gsm8k-tps",
            "smoke-cpu-resident-gsm8k-tps", "smoke-cpu-a100-claims", "smoke-resident-claims"} <= set(figures)
    assert not [name for name in figures if name.startswith("smoke-cpu-a100link-claims")]  # the CPU's own regime
    methods = [m for m in figures["smoke-cpu-resident-gsm8k-tps"] if m in config["methods"]]
    assert methods == ["ar", "eagle3-tuned", "specfit"]
    claims = [" ".join(t.split()) for t in figures["smoke-resident-claims"]]
    assert "SpecFit is faster than EAGLE-3 at the best fixed tree (tuned)" in claims
    a100 = [m for m in figures["smoke-cpu-a100-gsm8k-tps"] if m in config["methods"]]
    assert a100 == ["ar", "eagle3", "specfit-dense", "specfit", "specfit-ca-learned", "specfit-prefetch",
                    "specfit-prefetch-atlas", "eagle3-prefetch"]


def test_theory_and_calibration_outputs(workflow):
    workdir, config = workflow
    for workload in ("summarization", "gsm8k"):
        table = json.loads((workdir / f"data/theory/smoke/cpu-a100link/{workload}.json").read_text())
        assert table["recorded_selection_differs_pct"] == 0.0  # the selector reproduces every recorded choice
        assert 0.0 <= table["gap_pct"] <= table["bound_pct"] + 1e-9
    # beyond the paper: specfit-ca's pools under its cache-aware cost, with the residency each cycle recorded
    # and the exact-route specfit-prefetch's under the same cost, with the copies in flight each cycle recorded
    for path in ("cpu-a100link/gsm8k.specfit-ca", "cpu-a100/gsm8k.specfit-prefetch-atlas"):
        table = json.loads((workdir / f"data/theory/smoke/{path}.json").read_text())
        assert table["cost"] == "cache_aware" and table["recorded_selection_differs_pct"] == 0.0, path
        assert 0.0 <= table["gap_pct"] <= table["bound_pct"] + 1e-9
    for mode in ("cache", "nocache"):
        fit = json.loads((workdir / f"data/calibration/smoke/cpu-a100link/{mode}.json").read_text())
        assert len(fit["b"]) == 8 and fit["beta"] >= 0 and fit["r2"] is not None
        assert fit["n_points"] == 2 * 8 * 2  # 2 states (cycles 0 and 2 of question 401) x 8 sizes x 2 trees


def test_incremental_reruns(workflow, tmp_path):
    workdir, _ = workflow
    assert scheduled(workdir) == {}  # after a full run, nothing to do
    (workdir / "k6.yaml").write_text("methods: {specfit: {k_max: 6}}\n")
    # one method's parameter: its atlases and runs, the theory over them and the report; nothing else
    jobs = scheduled(workdir, "k6.yaml")
    assert set(jobs) == {"atlas", "decode", "theory", "report"}, jobs
    # specfit at slots 0/2/4 x workloads on the link, 0/4 on gsm8k on the emulated A100, 8 on the resident device;
    # not specfit-noisy
    assert jobs["decode"] == 8 and jobs["atlas"] == 7  # and specfit on the resident device
    runs = yaml.safe_load((workdir / "smoke.yaml").read_text())["runs"]
    runs.append({"models": ["smoke"], "devices": ["cpu-a100link"], "workloads": ["summarization"],
                 "methods": ["eagle3"], "slots": [1]})
    (workdir / "slots1.yaml").write_text(yaml.safe_dump({"runs": runs}))
    assert scheduled(workdir, "slots1.yaml") == {"decode": 1, "report": 1}  # a new cache size: only its run
