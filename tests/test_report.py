"""The report stage on a fake workflow folder: its Markdown tables give back the numbers the inputs hold."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specfit import intervals, report
from specfit.stage import SpecFitError
from specfit.workflow import DecodeRun, decode_runs, method_rule

DEVICE = "cpu-a100link"
N_REQUESTS = 6  # per fake run; the same request ids and output lengths in every run (lossless methods)


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


def fake_requests(rng, lengths, speed: float) -> list[dict]:
    """Rows of requests.parquet: ``speed`` decode tokens per second, ±25% per request."""
    rows = []
    for rid, n_output in enumerate(lengths):
        prefill = float(rng.uniform(0.05, 0.2))
        decode = (n_output - 1) / speed * float(rng.uniform(0.8, 1.25))
        rows.append({"request_id": rid, "question_id": 401 + rid, "output_ids": list(range(n_output)),
                     "n_output": n_output, "t_request_s": prefill + decode, "t_prefill_s": prefill,
                     "h2d_transfers": int(rng.integers(10, 100))})
    return rows


def decode_tps(rows) -> float:
    """As specfit.decode.stream_metrics computes it."""
    return (sum(r["n_output"] for r in rows) - len(rows)) / sum(r["t_request_s"] - r["t_prefill_s"] for r in rows)


def write_requests(root: Path, run, rows) -> None:
    pq.write_table(pa.Table.from_pylist(rows), root / run.path / "requests.parquet")


def fake_metrics(rng, run, spec, rows) -> dict:
    rule = method_rule(spec, run.method)
    lossless = None
    if rule != "ar":
        divergences = [{"request_id": 1, "position": 7, "margin": 0.0123}] if rule == "specfit" and run.slots else []
        lossless = {"reference": f"data/decode/toy/{run.device}/gsm8k/ar/slots0", "n_requests": 2,
                    "n_identical": 2 - len(divergences), "divergences": divergences}
    fresh = int(rng.integers(5, 100))
    return {
        "tps_dec": decode_tps(rows), "tps_req": float(rng.uniform(2, 12)),
        "draft_nodes_per_cycle": 0.0 if rule == "ar" else float(rng.uniform(1, 7)),
        "committed_per_cycle": 1.0 if rule == "ar" else float(rng.uniform(1, 5)),
        "committed_per_cycle_fresh": 1.0 if rule == "ar" else float(rng.uniform(1, 4)),
        "committed_per_cycle_repeated": 1.0 if rule == "ar" else float(rng.uniform(2, 6)),
        "cycles_fresh": fresh, "cycles_repeated": int(rng.integers(0, fresh)),
        "cycles": int(rng.integers(10, 200)), "ms_per_cycle": float(rng.uniform(5, 500)),
        "h2d_per_token": float(rng.uniform(1, 400)), "draft_ms_per_cycle": float(rng.uniform(0, 50)),
        "select_ms_median": float(rng.uniform(0, 3)) if rule == "specfit" else None,
        "select_share_pct": float(rng.uniform(0, 2)) if rule == "specfit" else None,
        "lossless": lossless, "link_emulated": True, "timing_label": "emulated link (1.5 GB/s, 50 us)",
        "resumed": False, "n_requests": len(rows), "n_output_tokens": sum(r["n_output"] for r in rows),
    }


def fake_root(root: Path, spec: dict, seed: int = 0) -> dict:
    """Writes metrics (with requests.parquet beside), calibration and theory files under ``root``; returns what it
    wrote, by path (a run's requests under ("requests", run))."""
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(8, 40, N_REQUESTS)]
    written = {}
    for run in decode_runs(spec):
        rows = fake_requests(rng, lengths, speed=float(rng.uniform(2, 12)))
        written[run] = fake_metrics(rng, run, spec, rows)
        written["requests", run] = rows
        path = root / run.path / "metrics.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(written[run]))
        write_requests(root, run, rows)
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


def runs_by(written) -> dict:
    """(method, slots) -> DecodeRun, on the one device of the fixture."""
    return {(r.method, r.slots): r for r in written if isinstance(r, DecodeRun) and r.device == DEVICE}


def tps_text(written, run) -> str:
    """A decode TPS cell as the report must print it, from the intervals module on the run's requests."""
    ci = intervals.tps_interval(written["requests", run], seed=0)
    return f"{written[run]['tps_dec']:.2f} [{ci['low']:.2f}, {ci['high']:.2f}]"


def ratio_of(written, num, den) -> dict:
    return intervals.ratio_interval(written["requests", num], written["requests", den], seed=0)


def x_text(ci) -> str:
    return f"{ci['value']:.2f}× [{ci['low']:.2f}, {ci['high']:.2f}] {ci['verdict']}"


def pct_text(ci) -> str:
    pct = [100 * (ci[k] - 1) for k in ("value", "low", "high")]
    return f"{pct[0]:.1f} [{pct[1]:.1f}, {pct[2]:.1f}] {ci['verdict']}"


RATIO_CELL = re.compile(r"(-?\d+\.\d+)(×?) \[(-?\d+\.\d+), (-?\d+\.\d+)\] (faster|slower|tie)")


def assert_no_win_inside_a_tie(md: str) -> int:
    """Every ratio cell's verdict agrees with its printed interval (1× or 0%); returns how many there are."""
    cells = RATIO_CELL.findall(md)
    for value, x, low, high, verdict in cells:
        one = 1.0 if x else 0.0
        low, high = float(low), float(high)
        assert low <= float(value) <= high
        if verdict == "faster":
            assert low >= one, (value, low, high)
        elif verdict == "slower":
            assert high <= one, (value, low, high)
        else:
            assert low <= one <= high, (value, low, high)
    for section in md.split("\n### ")[1:]:  # every section that shows an interval says how it is computed
        if RATIO_CELL.search(section):
            assert report.interval_note(0) in section, section[:80]
    return len(cells)


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
    keys = [key_of(h) for h in header[2:]]
    assert keys[keys.index("committed_per_cycle") + 1:][:4] == list(report.SPLIT_KEYS)  # beside Committed
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
    runs = runs_by(written)
    ar = runs["ar", 0]
    assert len(rows) == 6
    for row in rows:
        run = runs[row[0], 0 if row[1] == "No" else 4]
        m = written[run]
        assert row[2] == tps_text(written, run)
        assert row[3] == f"{m['tps_req']:.2f}"
        ci = ratio_of(written, run, ar)
        assert ci["value"] == pytest.approx(m["tps_dec"] / written[ar]["tps_dec"])  # all requests in common
        assert row[4] == x_text(ci)
    assert next(row[4] for row in rows if row[:2] == ["ar", "No"]) == "1.00× [1.00, 1.00] tie"
    md = (out / "report.md").read_text()
    assert assert_no_win_inside_a_tie(md) == 6 + 6 + 4  # throughput, paper speedups, headline TPS ratios
    assert report.interval_note(0) in md and "2000 resamples, seed 0" in md and "paired" in md
    assert md.count(report.interval_note(0)) == 3  # the top, the throughput and the paper sections


def test_a_ratio_whose_interval_holds_one_is_a_tie(tmp_path):
    spec = tiny_spec()
    written = fake_root(tmp_path, spec)
    runs = runs_by(written)

    def replace(run, rows):
        written["requests", run], written[run]["tps_dec"] = rows, decode_tps(rows)
        write_requests(tmp_path, run, rows)
        (tmp_path / run.path / "metrics.json").write_text(json.dumps(written[run]))

    def scaled(rows, factors):
        return [dict(r, t_request_s=r["t_prefill_s"] + (r["t_request_s"] - r["t_prefill_s"]) * f)
                for r, f in zip(rows, factors)]

    eagle = written["requests", runs["eagle3", 4]]
    replace(runs["specfit", 4], scaled(eagle, [0.75, 1.25] * 3))  # faster on half the prompts, slower on half
    replace(runs["specfit", 0], scaled(written["requests", runs["eagle3", 0]], [2 / 3] * 6))  # 1.5× on every prompt
    out = tmp_path / "report"
    report.run(spec, {"root": str(tmp_path)}, {"report": str(out)})
    md = (out / "report.md").read_text()
    tables = md_tables(md)
    header, rows = find(tables, f"Headline ratios, {DEVICE} vs paper a100, gsm8k")
    cells = {row[0]: row[2] for row in rows}
    tie = ratio_of(written, runs["specfit", 4], runs["eagle3", 4])
    assert tie["low"] < 1 < tie["high"] and tie["verdict"] == "tie"
    assert cells["SpecFit over cached EAGLE-3 (%)"] == pct_text(tie)
    assert cells["SpecFit over cached EAGLE-3 (%)"].endswith(" tie")
    assert cells["SpecFit over vanilla EAGLE-3, no cache (%)"] == "50.0 [50.0, 50.0] faster"
    ar = runs["ar", 0]
    assert cells["SpecFit (cache) over AR without cache (×)"] == x_text(ratio_of(written, runs["specfit", 4], ar))
    assert cells["Vanilla EAGLE-3 over AR without cache (×)"] == x_text(ratio_of(written, runs["eagle3", 0], ar))
    # the non-throughput headline rows stay plain percentages of the metrics
    fewer = 100 * (1 - written[runs["specfit", 4]]["committed_per_cycle"] / written[runs["eagle3", 4]][
        "committed_per_cycle"])
    assert cells["SpecFit commits fewer tokens per cycle than cached EAGLE-3 (%)"] == f"{fewer:.1f}"
    assert assert_no_win_inside_a_tie(md) == 6 + 6 + 4


def test_a_run_without_requests_has_no_interval(tmp_path):
    spec = tiny_spec()
    written = fake_root(tmp_path, spec)
    runs = runs_by(written)
    gone = runs["eagle3", 4]
    (tmp_path / gone.path / "requests.parquet").unlink()
    out = tmp_path / "report"
    report.run(spec, {"root": str(tmp_path)}, {"report": str(out)})
    md = (out / "report.md").read_text()
    assert f"{gone.path}/requests.parquet" in md  # listed as a missing input
    header, rows = find(md_tables(md), f"Throughput, toy / {DEVICE}, gsm8k")
    row = next(row for row in rows if row[:2] == ["eagle3", "Yes (4)"])
    ar = written[runs["ar", 0]]["tps_dec"]
    assert row[2] == f"{written[gone]['tps_dec']:.2f} [no interval]"
    assert row[4] == f"{written[gone]['tps_dec'] / ar:.2f}× [no interval]"
    header, rows = find(md_tables(md), f"Headline ratios, {DEVICE} vs paper a100, gsm8k")
    assert dict((row[0], row[2]) for row in rows)["SpecFit over cached EAGLE-3 (%)"].endswith("[no interval]")


def test_requests_that_disagree_with_metrics_are_an_error(tmp_path):
    spec = tiny_spec()
    written = fake_root(tmp_path, spec)
    run = runs_by(written)["specfit", 4]
    rows = [dict(r) for r in written["requests", run]]
    rows[0]["t_request_s"] += 1.0
    write_requests(tmp_path, run, rows)
    with pytest.raises(SpecFitError, match="different runs"):
        report.run(spec, {"root": str(tmp_path)}, {"report": str(tmp_path / "report")})
    pq.write_table(pa.Table.from_pylist(rows).drop(["t_prefill_s"]), tmp_path / run.path / "requests.parquet")
    with pytest.raises(SpecFitError, match="t_prefill_s"):
        report.run(spec, {"root": str(tmp_path)}, {"report": str(tmp_path / "report")})


def test_the_report_runs_without_pandas(tmp_path):
    spec = tiny_spec()
    fake_root(tmp_path, spec)
    code = ("import importlib.abc, json, sys\n"
            "class NoPandas(importlib.abc.MetaPathFinder):  # as if pandas were not installed\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.partition('.')[0] == 'pandas':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, NoPandas())\n"
            "from specfit import report\n"
            "report.run(json.loads(sys.argv[1]), {'root': sys.argv[2]}, {'report': sys.argv[3]})\n")
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec), str(tmp_path), str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.md").is_file() and (out / "figures").is_dir()
    header, rows = find(md_tables((out / "report.md").read_text()), f"Cost coefficients, toy / {DEVICE}")
    assert rows  # the calibration section read its points parquet without pandas


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
    runs = runs_by(written)
    ci = ratio_of(written, runs["specfit", 4], runs["eagle3", 4])
    gain = 100 * (written[runs["specfit", 4]]["tps_dec"] / written[runs["eagle3", 4]]["tps_dec"] - 1)
    assert cells["SpecFit over cached EAGLE-3 (%)"] == ["7.0", pct_text(ci)]
    assert pct_text(ci).startswith(f"{gain:.1f} [")
    header, rows = find(tables, f"{DEVICE} vs paper a100, gsm8k")
    for row in rows:
        run = runs[row[0], 4 if row[1] == "Yes" else 0]
        assert row[3] == tps_text(written, run)
        assert row[5] == x_text(ratio_of(written, run, runs["ar", 0]))
    assert cells["SpecFit (cache) over AR without cache (×)"][0] == "2.29"  # as the text says; 10.79 / 4.70 = 2.30
    assert cells["Vanilla EAGLE-3 over AR without cache (×)"][0] == "1.33"  # not stated for GSM8K: computed
    assert "miniature" in (out / "report.md").read_text()


def test_sweep_noisy_second_device_and_missing_inputs(tmp_path):
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"), slots=(0, 2, 4),
                     devices=(DEVICE, "cpu-4090link"))
    written = fake_root(tmp_path, spec)
    runs = runs_by(written)
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
    for row in rows:
        eagle, fit = runs["eagle3", int(row[0])], runs["specfit", int(row[0])]
        assert row[1:4] == [tps_text(written, eagle), tps_text(written, fit), pct_text(ratio_of(written, fit, eagle))]
    assert len([c for c, _, _ in tables if c.startswith("Exact vs noisy routes")]) == 2  # one per device
    header, rows = find(tables, f"Exact vs noisy routes, toy / {DEVICE}")
    for row in rows:
        run = runs[row[0], 0 if row[2] == "No" else int(row[2][5:-1])]
        assert row[3:5] == [tps_text(written, run), x_text(ratio_of(written, run, runs["ar", 0]))]
    header, rows = find(tables, "gsm8k on every device")
    assert {row[0] for row in rows} == {DEVICE, "cpu-4090link"}
    for row in rows:
        if row[0] == DEVICE:
            run = runs[row[1], 0 if row[2] == "No" else 4]
            assert row[3:5] == [tps_text(written, run), x_text(ratio_of(written, run, runs["ar", 0]))]
    assert assert_no_win_inside_a_tie(md) > 40
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
