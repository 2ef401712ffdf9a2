"""The report stage on a fake workflow folder: its Markdown tables give back the numbers the inputs hold."""

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specfit import report
from specfit.stage import SpecFitError
from specfit.workflow import decode_runs, method_rule

DEVICE = "cpu-a100link"


def tiny_spec(methods=("ar", "eagle3", "specfit"), slots=(0, 4), devices=(DEVICE,)) -> dict:
    all_methods = {
        "ar": {"rule": "ar"},
        "eagle3": {"rule": "eagle3", "k_max": 7, "max_depth": 5, "top_k_expand": 2},
        "specfit": {"rule": "specfit", "k_max": 7, "max_depth": 5, "top_k_expand": 2, "routes": "atlas"},
        "specfit-noisy": {"rule": "specfit", "k_max": 7, "max_depth": 5, "top_k_expand": 2, "routes": "noisy",
                          "accuracy": 0.6},
    }
    return {
        "workloads": {"gsm8k": {"question_ids": {"start": 401, "stop": 402, "step": 1}, "limit_tokens": 512,
                                "max_new_tokens": 16, "max_requests": 2,
                                "subset_label": "toy subset: first 2 GSM8K questions"}},
        "models": {"toy": {"target": "data/models/toy/target", "drafter": "data/models/toy/drafter",
                           "dtype": "float32", "toy": True, "main_slots": {d: 4 for d in devices}}},
        "devices": {d: {"torch_device": "cpu", "max_inflight": 2, "link": {"bandwidth_gbps": 1.5, "latency_us": 50},
                        "label": f"CPU, link emulated ({d})", "coefficients": "fit", "gpu": ""} for d in devices},
        "methods": {m: all_methods[m] for m in methods},
        "runs": [{"models": ["toy"], "devices": list(devices), "workloads": ["gsm8k"], "methods": list(methods),
                  "slots": list(slots)}],
        "calibration": {"question_ids": [401, 402, 403], "cycle_boundaries": [0, 4, 8], "sizes": 8, "repeats": 2},
        "theory": {"beta_multiplier": 2.0},
        "seed": 0,
    }


def fake_metrics(rng, run, spec) -> dict:
    rule = method_rule(spec, run.method)
    lossless = None
    if rule != "ar":
        divergences = [{"request_id": 1, "position": 7, "margin": 0.0123}] if rule == "specfit" and run.slots else []
        lossless = {"reference": f"data/decode/toy/{run.device}/gsm8k/ar/slots0", "n_requests": 2,
                    "n_identical": 2 - len(divergences), "divergences": divergences}
    return {
        "tps_dec": float(rng.uniform(2, 12)), "tps_req": float(rng.uniform(2, 12)),
        "draft_nodes_per_cycle": 0.0 if rule == "ar" else float(rng.uniform(1, 7)),
        "committed_per_cycle": 1.0 if rule == "ar" else float(rng.uniform(1, 5)),
        "cycles": int(rng.integers(10, 200)), "ms_per_cycle": float(rng.uniform(5, 500)),
        "h2d_per_token": float(rng.uniform(1, 400)), "draft_ms_per_cycle": float(rng.uniform(0, 50)),
        "select_ms_median": float(rng.uniform(0, 3)) if rule == "specfit" else None,
        "select_share_pct": float(rng.uniform(0, 2)) if rule == "specfit" else None,
        "lossless": lossless, "link_emulated": True, "timing_label": "emulated link (1.5 GB/s, 50 us)",
        "resumed": False, "n_requests": 2, "n_output_tokens": int(rng.integers(10, 40)),
    }


def fake_root(root: Path, spec: dict, seed: int = 0) -> dict:
    """Writes metrics, calibration and theory files under ``root``; returns what it wrote, by path."""
    rng = np.random.default_rng(seed)
    written = {}
    for run in decode_runs(spec):
        written[run] = fake_metrics(rng, run, spec)
        path = root / run.path / "metrics.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(written[run]))
    for device in spec["devices"]:
        base = root / "data/calibration/toy" / device
        base.mkdir(parents=True, exist_ok=True)
        for mode, slots in (("cache", 4), ("nocache", 0)):
            fit = {"b": rng.uniform(1, 20, 8).tolist(), "beta": float(rng.uniform(0.01, 1)), "source": "fit",
                   "r2": 0.97, "rmse_ms": 1.5, "n_points": 144, "slots": slots, "link_emulated": True,
                   "residuals": {"max_abs_ms": 3.0}}
            (base / f"{mode}.json").write_text(json.dumps(fit))
            written[device, mode] = fit
            y = rng.uniform(10, 100, 16)
            pq.write_table(pa.table({"state": np.arange(16) % 9, "k": np.arange(16) % 8,
                                     "tree": ["prob", "union"] * 8, "F": rng.integers(10, 100, 16),
                                     "y_ms": y, "pred_ms": y + rng.normal(0, 1, 16)}),
                           base / f"{mode}.points.parquet")
        theory = {"cycles": 123, "lambda_star": 0.0456789, "theta": 0.0451234, "gap_pct": 0.81, "bound_pct": 1.52,
                  "s_star_differs_pct": 22.2, "rho_cv": 0.33, "s_star_gain_pct": 0.42, "union_per_reward_beta": 35.5,
                  "union_per_reward_2beta": 31.25, "selected_nodes_beta": 2.5, "selected_nodes_2beta": 2.0,
                  "drafted_levels_mean": 3.1, "stopped_early_pct": 55.5, "dinkelbach_iterations": 3,
                  "recorded_selection_differs_pct": 0.0}
        path = root / "data/theory/toy" / device / "gsm8k.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(theory))
        written[device, "theory"] = theory
    return written


def md_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Markdown tables as (bold caption line above, header, rows)."""
    tables = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("**") and line.endswith("**") and i + 2 < len(lines) and lines[i + 2].startswith("|"):
            block = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                block.append([c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)[1:-1]])
            tables.append((line.strip("*"), block[0], block[2:]))
    return tables


def find(tables, prefix: str):
    hits = [(header, rows) for caption, header, rows in tables if caption.startswith(prefix)]
    assert len(hits) == 1, (prefix, [caption for caption, _, _ in tables])
    return hits[0]


def key_of(header: str) -> str:
    label = header.replace(f" [{report.EMULATED}]", "")
    return next(k for k, q in report.METRICS.items() if q.label == label)


@pytest.fixture()
def built(tmp_path):
    spec = tiny_spec()
    written = fake_root(tmp_path, spec)
    out = tmp_path / "reports" / "all"
    report.run(spec, {"root": str(tmp_path)}, {"report": str(out)})
    return spec, written, out, md_tables((out / "report.md").read_text())


def test_counters_table_gives_back_the_metrics(built):
    spec, written, out, tables = built
    header, rows = find(tables, f"Counters per verification cycle, toy / {DEVICE}, gsm8k")
    assert header[:2] == ["Method", "Cache"]
    assert all(f"[{report.EMULATED}]" in h for h in header[2:] if report.METRICS[key_of(h)].timing)
    seen = set()
    for row in rows:
        method, cache = row[0], row[1]
        slots = 0 if cache == "No" else int(re.fullmatch(r"Yes \((\d+)\)", cache).group(1))
        run = next(r for r in written if not isinstance(r, tuple) and (r.method, r.slots) == (method, slots))
        seen.add(run)
        for h, cell in zip(header[2:], row[2:]):
            key = key_of(h)
            if method == "ar" and key in report.DRAFT_KEYS:
                assert cell == "–"
            else:
                assert cell == format(written[run][key], report.METRICS[key].fmt), (run, key)
    assert len(seen) == 6


def test_throughput_and_speedup(built):
    spec, written, out, tables = built
    header, rows = find(tables, f"Throughput, toy / {DEVICE}, gsm8k (toy subset: first 2 GSM8K questions)")
    ar = next(m for r, m in written.items() if not isinstance(r, tuple) and (r.method, r.slots) == ("ar", 0))
    for row in rows:
        slots = 0 if row[1] == "No" else 4
        m = next(v for r, v in written.items() if not isinstance(r, tuple) and (r.method, r.slots) == (row[0], slots))
        assert row[2] == f"{m['tps_dec']:.2f}"
        assert row[3] == f"{m['tps_req']:.2f}"
        assert row[4] == f"{m['tps_dec'] / ar['tps_dec']:.2f}×"


def test_theory_calibration_and_lossless(built):
    spec, written, out, tables = built
    header, rows = find(tables, "Theory on the pools")
    assert header == ["Quantity", "gsm8k", "paper"]  # the first device stands for the A100
    cells = {row[0]: row[1:] for row in rows}
    assert cells["Cycles"] == ["123", "4407"]
    assert cells["λ* − Θ (% of λ*)"] == ["0.81", "0.95"]
    assert cells["Mean F(Ŝ)/R̂(Ŝ) at β / 2β"] == ["35.5 / 31.2", "305.7 / 298.0"]
    assert cells["Mean selected nodes at β / 2β"] == ["2.50 / 2.00", "5.09 / 4.54"]

    header, rows = find(tables, f"Cost coefficients, toy / {DEVICE}")
    assert f"[{report.EMULATED}]" in header[1]
    cells = {row[0]: row[1:] for row in rows}
    for k in range(8):
        assert cells[f"b_{k} (ms)"][:2] == [f"{written[DEVICE, m]['b'][k]:.3f}" for m in ("cache", "nocache")]
    assert cells["β (ms per expert)"] == [f"{written[DEVICE, 'cache']['beta']:.4f}",
                                          f"{written[DEVICE, 'nocache']['beta']:.4f}", "0.2107", "0.4080"]

    header, rows = find(tables, "Lossless check per run")
    by_run = {(row[1], row[2]): row for row in rows}
    assert by_run["specfit", "Yes (4)"][header.index("Identical requests")] == "1/2"
    assert by_run["eagle3", "No"][header.index("Identical requests")] == "2/2"
    assert "reference" in by_run["ar", "No"][header.index("Reference")]
    header, rows = find(tables, "Every divergence")
    assert rows == [["gsm8k", "specfit", "Yes (4)", "1", "7", "0.0123"]]


def test_html_links_are_relative_and_exist(built):
    spec, written, out, tables = built
    html = (out / "index.html").read_text()
    sources = re.findall(r'<img src="([^"]+)"', html)
    assert len(sources) >= 2  # throughput bars and the calibration scatter
    for src in sources:
        assert not src.startswith(("/", "file:", "http")), src
        assert (out / src).is_file()
    assert report.EMULATED in html
    assert "toy subset: first 2 GSM8K questions" in html
    assert report.config_hash(spec) in html
    md = (out / "report.md").read_text()
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", md):
        assert (out / link).is_file()
    assert not list(out.parent.glob(".tmp-*"))


def test_paper_side_by_side_compares_ratios(built):
    spec, written, out, tables = built
    header, rows = find(tables, f"Headline ratios, {DEVICE} vs paper a100, gsm8k")
    cells = {row[0]: row[1:] for row in rows}
    run = {(r.method, r.slots): m for r, m in written.items() if not isinstance(r, tuple)}
    gain = 100 * (run["specfit", 4]["tps_dec"] / run["eagle3", 4]["tps_dec"] - 1)
    assert cells["SpecFit over cached EAGLE-3 (%)"] == ["7.0", f"{gain:.1f}"]
    assert cells["SpecFit (cache) over AR without cache (×)"][0] == "2.29"  # as the text says; 10.79 / 4.70 = 2.30
    assert cells["Vanilla EAGLE-3 over AR without cache (×)"][0] == "1.33"  # not stated for GSM8K: computed
    assert "miniature" in (out / "report.md").read_text()


def test_sweep_noisy_second_device_and_missing_inputs(tmp_path):
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"), slots=(0, 2, 4),
                     devices=(DEVICE, "cpu-4090link"))
    fake_root(tmp_path, spec)
    gone = tmp_path / "data/decode/toy/cpu-4090link/gsm8k/eagle3/slots2/metrics.json"
    gone.unlink()
    (tmp_path / "data/theory/toy/cpu-4090link/gsm8k.json").unlink()
    out = tmp_path / "report"
    report.run(spec, {"root": str(tmp_path)}, {"report": str(out)})
    md = (out / "report.md").read_text()
    tables = md_tables(md)
    assert "data/decode/toy/cpu-4090link/gsm8k/eagle3/slots2/metrics.json" in md
    assert "data/theory/toy/cpu-4090link/gsm8k.json" in md
    header, rows = find(tables, f"Slot sweep, toy / {DEVICE}, gsm8k (toy subset: first 2 GSM8K questions) "
                                f"(0 = no cache) [{report.EMULATED}]")
    assert [row[0] for row in rows] == ["4", "2", "0"]
    assert len([c for c, _, _ in tables if c.startswith("Exact vs noisy routes")]) == 2  # one per device
    header, rows = find(tables, "gsm8k on every device")
    assert {row[0] for row in rows} == {DEVICE, "cpu-4090link"}
    find(tables, f"Headline ratios, cpu-4090link vs paper rtx4090, gsm8k [{report.EMULATED}]")


def test_malformed_metrics_is_an_error(tmp_path):
    spec = tiny_spec()
    written = fake_root(tmp_path, spec)
    run = next(r for r in written if not isinstance(r, tuple))
    path = tmp_path / run.path / "metrics.json"
    path.write_text(json.dumps({k: v for k, v in written[run].items() if k != "tps_dec"}))
    with pytest.raises(SpecFitError, match="tps_dec"):
        report.run(spec, {"root": str(tmp_path)}, {"report": str(tmp_path / "report")})
    assert not (tmp_path / "report").exists()


def test_provenance_marks_a_dirty_tree(tmp_path):
    assert report.git_commit(tmp_path) == "unknown"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("a")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = report.git_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    (tmp_path / "a.txt").write_text("b")
    assert report.git_commit(tmp_path) == f"{head} (dirty tree)"
