"""What the report reads: exactly the files its rule declares; a file expected but not declared, or declared but
not on disk, is missing; a malformed one is an error that names it as declared."""

import logging
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from report_fakes import DEVICE, declared, fake_root, runs_by, tiny_spec, write_requests
from report_md import captions, find, md_tables, missing_inputs

from specfit import paths, report
from specfit.errors import SpecFitError


def build(tree, spec, inputs) -> str:
    out = tree / "report"
    report.run(spec, inputs, {"report": str(out)})
    return (out / "report.md").read_text()


def test_a_file_on_disk_but_not_declared_is_not_read(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    runs = runs_by(written)
    inputs = declared(spec)
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
    md = build(tree, spec, inputs)
    assert set(missing_inputs(md)) == set(undeclared.values())
    tables = md_tables(md)
    assert not any(c.startswith("Theory on the pools") for c in captions(tables))
    header, rows = find(tables, f"Counters per verification cycle, toy / {DEVICE}, gsm8k")
    assert ["eagle3", "Yes (4)"] not in [row[:2] for row in rows] and len(rows) == 5
    header, rows = find(tables, f"Throughput, toy / {DEVICE}, gsm8k")
    row = next(row for row in rows if row[:2] == ["specfit", "Yes (4)"])
    assert row[2] == f"{written[runs['specfit', 4]]['tps_dec']:.2f} [no interval]"
    header, rows = find(tables, f"Cost coefficients, toy / {DEVICE}")
    assert header[1].startswith("With cache (4 slots)") and not header[2].startswith("Without cache")
    assert "calibration.png" not in md  # the only fit's points are not declared: no scatter


def test_the_workflow_folder_is_no_input(tree, caplog):
    """Everything on disk, nothing declared: every section shows its inputs as missing."""
    spec = tiny_spec()
    fake_root(tree, spec)
    with caplog.at_level(logging.WARNING, logger="specfit.report"):
        md = build(tree, spec, {"root": str(tree)})
    assert "root" in caplog.text
    inputs = declared(spec)  # requests and probe points count as missing only beside their metrics and fits
    assert set(missing_inputs(md)) == {*inputs["metrics"], *inputs["calibration"], *inputs["theory"]}
    assert not any(c.startswith(("Throughput", "Counters", "Cost coefficients")) for c in captions(md_tables(md)))


def test_declared_paths_match_however_written(tree, caplog):
    """./data/... or an absolute path under the workflow root is the same file; one the report does not expect
    is logged."""
    spec = tiny_spec()
    fake_root(tree, spec)
    plain = build(tree, spec, declared(spec))
    inputs = {name: [f"./{p}" if i % 2 else str(tree / p) for i, p in enumerate(files)]
              for name, files in declared(spec).items()}
    inputs["metrics"].append("data/decode/toy/elsewhere/metrics.json")
    with caplog.at_level(logging.WARNING, logger="specfit.report"):
        md = build(tree, spec, inputs)
    assert "data/decode/toy/elsewhere/metrics.json" in caplog.text
    date = re.compile(r"^- \*\*Date \(UTC\)\*\*.*$", re.M)
    assert date.sub("", md) == date.sub("", plain)
    assert not missing_inputs(md)


def test_a_run_without_requests_has_no_interval(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    runs = runs_by(written)
    gone = runs["eagle3", 4]
    (tree / gone.file("requests.parquet")).unlink()  # declared, not on disk
    md = build(tree, spec, declared(spec))
    assert missing_inputs(md).count(gone.file("requests.parquet")) >= 1  # listed as a missing input
    header, rows = find(md_tables(md), f"Throughput, toy / {DEVICE}, gsm8k")
    row = next(row for row in rows if row[:2] == ["eagle3", "Yes (4)"])
    ar = written[runs["ar", 0]]["tps_dec"]
    assert row[2] == f"{written[gone]['tps_dec']:.2f} [no interval]"
    assert row[4] == f"{written[gone]['tps_dec'] / ar:.2f}× [no interval]"
    header, rows = find(md_tables(md), f"Headline ratios, {DEVICE} vs paper a100, gsm8k")
    assert dict((row[0], row[2]) for row in rows)["SpecFit over cached EAGLE-3 (%)"].endswith("[no interval]")


def test_requests_that_disagree_with_metrics_are_an_error(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    run = runs_by(written)["specfit", 4]
    rows = [dict(r) for r in written["requests", run]]
    rows[0]["t_request_s"] += 1.0
    write_requests(tree, run, rows)
    with pytest.raises(SpecFitError, match="different runs"):
        report.run(spec, declared(spec), {"report": str(tree / "report")})
    pq.write_table(pa.Table.from_pylist(rows).drop(["t_prefill_s"]), tree / run.file("requests.parquet"))
    with pytest.raises(SpecFitError, match=f"^{re.escape(run.file('requests.parquet'))} lacks columns t_prefill_s"):
        report.run(spec, declared(spec), {"report": str(tree / "report")})


def test_malformed_metrics_is_an_error(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    run = next(r for r in written if not isinstance(r, tuple))
    (tree / run.file("metrics.json")).write_text("{}")
    with pytest.raises(SpecFitError, match=f"^{re.escape(run.file('metrics.json'))} lacks tps_dec"):
        report.run(spec, declared(spec), {"report": str(tree / "report")})
    assert not (tree / "report").exists()
