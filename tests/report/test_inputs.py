"""What the report reads: exactly the files its rule declares; a file expected but not declared, or declared but
not on disk, is missing; a malformed one is an error that names it as declared."""

import logging
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from report_fakes import DEVICE, fake_root, runs_by, tiny_spec, write_requests
from report_md import build, missing_inputs, rows

from specfit.errors import SpecFitError
from specfit.planning import paths
from specfit.planning.matrix import report_inputs
from specfit.report.quantities import LATER_KEYS, METRICS
from specfit.results import metrics
from specfit.stages import report


def test_a_file_on_disk_but_not_declared_is_not_read(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    runs = runs_by(written)
    inputs = report_inputs(spec)
    undeclared = {
        "metrics": runs["eagle3", 4].file("metrics.json"),
        "requests": runs["specfit", 4].file("requests.parquet"),
        "calibration": paths.calibration("toy", DEVICE, "nocache"),
        "points": paths.calibration_points("toy", DEVICE, "cache"),
        "theory": paths.theory("toy", DEVICE, "gsm8k"),
    }
    for name, path in undeclared.items():
        assert (tree / path).is_file()
        inputs[name].remove(path)
    md, tables = build(spec, inputs, tree / "report")
    assert set(missing_inputs(md)) == set(undeclared.values())
    assert f"theory/toy/{DEVICE}" not in tables
    t = tables[f"counters/toy/{DEVICE}/gsm8k"]
    assert runs["eagle3", 4] not in t.keys and len(t.rows) == 5
    row = rows(tables[f"throughput/toy/{DEVICE}/gsm8k"])[runs["specfit", 4]]
    assert row[2] == f"{written[runs['specfit', 4]]['tps_dec']:.2f} [no interval]"
    t = tables[f"calibration/toy/{DEVICE}"]
    assert t.header[1].startswith("With cache (4 slots)") and not t.header[2].startswith("Without cache")
    assert "calibration.png" not in md  # the only fit's points are not declared: no scatter


def test_the_workflow_folder_is_no_input(tree, caplog):
    """Everything on disk, nothing declared: every section shows its inputs as missing."""
    spec = tiny_spec()
    fake_root(tree, spec)
    with caplog.at_level(logging.WARNING, logger="specfit.stages.report"):
        md, tables = build(spec, {"root": str(tree)}, tree / "report")
    assert "root" in caplog.text
    inputs = report_inputs(spec)  # requests and probe points count as missing only beside their metrics and fits
    assert set(missing_inputs(md)) == {*inputs["metrics"], *inputs["calibration"], *inputs["theory"]}
    assert not [i for i in tables if i.startswith(("throughput/", "counters/", "calibration/"))]
    for section in md.split("\n### ")[1:]:  # each names a missing file once, however many of its rows need it
        assert len(missing_inputs(section)) == len(set(missing_inputs(section))), section[:80]


def test_declared_paths_match_however_written(tree, caplog):
    """./data/... or an absolute path under the workflow root is the same file; one the report does not expect
    is logged."""
    spec = tiny_spec()
    fake_root(tree, spec)
    plain, _ = build(spec, report_inputs(spec), tree / "report")
    inputs = {name: [f"./{p}" if i % 2 else str(tree / p) for i, p in enumerate(files)]
              for name, files in report_inputs(spec).items()}
    inputs["metrics"].append("data/decode/toy/elsewhere/metrics.json")
    with caplog.at_level(logging.WARNING, logger="specfit.stages.report"):
        md, _ = build(spec, inputs, tree / "report")
    assert "data/decode/toy/elsewhere/metrics.json" in caplog.text
    date = re.compile(r"^- \*\*Date \(UTC\)\*\*.*$", re.MULTILINE)
    assert date.sub("", md) == date.sub("", plain)
    assert not missing_inputs(md)


def test_a_run_without_requests_has_no_interval(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    runs = runs_by(written)
    gone = runs["eagle3", 4]
    (tree / gone.file("requests.parquet")).unlink()  # declared, not on disk
    md, tables = build(spec, report_inputs(spec), tree / "report")
    assert missing_inputs(md).count(gone.file("requests.parquet")) >= 1  # listed as a missing input
    row = rows(tables[f"throughput/toy/{DEVICE}/gsm8k"])[gone]
    ar = written[runs["ar", 0]]["tps_dec"]
    assert row[2] == f"{written[gone]['tps_dec']:.2f} [no interval]"
    assert row[4] == f"{written[gone]['tps_dec'] / ar:.2f}× [no interval]"
    assert rows(tables[f"headline/toy/{DEVICE}/gsm8k"])["vs_cached_eagle3_pct"][2].endswith("[no interval]")


def test_requests_that_disagree_with_metrics_are_an_error(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    run = runs_by(written)["specfit", 4]
    rows = [dict(r) for r in written["requests", run]]
    rows[0]["t_request_s"] += 1.0
    write_requests(tree, run, rows)
    with pytest.raises(SpecFitError, match="different runs"):
        report.run(spec, report_inputs(spec), {"report": str(tree / "report")})
    pq.write_table(pa.Table.from_pylist(rows).drop(["t_prefill_s"]), tree / run.file("requests.parquet"))
    with pytest.raises(SpecFitError, match=f"^{re.escape(run.file('requests.parquet'))} lacks columns t_prefill_s"):
        report.run(spec, report_inputs(spec), {"report": str(tree / "report")})


def test_malformed_metrics_is_an_error(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    run = next(r for r in written if not isinstance(r, tuple))
    (tree / run.file("metrics.json")).write_text("{}")
    with pytest.raises(SpecFitError, match=f"^{re.escape(run.file('metrics.json'))} lacks tps_dec"):
        report.run(spec, report_inputs(spec), {"report": str(tree / "report")})
    assert not (tree / "report").exists()


def test_the_keys_read_are_the_keys_written():
    """The metrics.json keys the report shows are ones `specfit.results.metrics.stream_metrics` writes (`metrics.KEYS`,
    in its order)."""
    requests = [{"request_id": 0, "n_output": 5, "t_request_s": 1.0, "t_prefill_s": 0.2, "h2d_transfers": 7}]
    cycles = pa.table({"committed": [2, 2], "accepted": [1, 1], "drafted_levels": [2, 0], "t_draft_s": [0.1, 0.0],
                       "t_select_s": [0.01, 0.0], "t_verify_s": [0.2, 0.2], "t_commit_s": [0.01, 0.01],
                       "h2d_transfers": [3, 4], "selected": [[1, 2], []], "pool_token": [[0, 1, 2], [0]]})
    assert tuple(metrics.stream_metrics(requests, cycles)) == metrics.KEYS
    assert set(METRICS) <= set(metrics.KEYS) and set(LATER_KEYS) <= set(metrics.KEYS)
