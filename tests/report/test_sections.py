"""The report's sections on a fake workflow folder: its Markdown tables give back the numbers the inputs hold."""

import json
import re

import pytest
from report_fakes import DEVICE, declared, decode_tps, fake_root, request_tps, runs_by, tiny_spec, write_requests
from report_md import assert_no_win_inside_a_tie, find, key_of, md_tables, pct_text, ratio_of, tps_text, x_text

from specfit import paths, report
from specfit.report.inputs import DRAFT_KEYS, METRICS, SPLIT_KEYS, TOKENS_PER_TRANSFER
from specfit.report.page import EMULATED, interval_note


def test_counters_table_gives_back_the_metrics(built):
    spec, written, out, tables = built
    header, rows = find(tables, f"Counters per verification cycle, toy / {DEVICE}, gsm8k")
    assert header[:2] == ["Method", "Cache"]
    assert all(f"[{EMULATED}]" in h for h in header[2:] if METRICS[key_of(h)].timing)
    keys = [key_of(h) for h in header[2:]]
    assert keys[keys.index("committed_per_cycle") + 1:][:4] == list(SPLIT_KEYS)  # beside Committed
    assert keys[-2:] == ["draft_ms_per_cycle", "verify_ms_per_cycle"]
    seen = set()
    for row in rows:
        method, cache = row[0], row[1]
        slots = 0 if cache == "No" else int(re.fullmatch(r"Yes \((\d+)\)", cache).group(1))
        run = next(r for r in written if not isinstance(r, tuple) and (r.method, r.slots) == (method, slots))
        seen.add(run)
        for h, cell in zip(header[2:], row[2:]):
            key = key_of(h)
            if method == "ar" and key in DRAFT_KEYS:
                assert cell == "–"
            else:
                assert cell == format(written[run][key], METRICS[key].fmt), (run, key)
    assert len(seen) == 6
    # tokens per transfer: output tokens per H2D expert transfer (1 / H2D/token), SpecFit's over EAGLE-3's
    header, rows = find(tables, f"Tokens per transfer, toy / {DEVICE}, gsm8k")
    assert header == ["Method", "Cache", "H2D/token", TOKENS_PER_TRANSFER,
                      "Tokens per transfer over eagle3 at the same cache (%)"]
    runs = runs_by(written)
    for row in rows:
        run = runs[row[0], 0 if row[1] == "No" else 4]
        h2d = written[run]["h2d_per_token"]
        eagle = written[runs["eagle3", run.slots]]["h2d_per_token"]
        assert row[2:4] == [f"{h2d:.1f}", f"{1 / h2d:.4f}"]
        assert row[4] == ("–" if row[0] == "eagle3" else f"{100 * (eagle / h2d - 1):.1f}")
    assert len(rows) == 6


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
    # throughput, gains at the same cache (decode and request TPS, with and without cache), paper speedups,
    # headline TPS ratios (four of decode TPS, one of request TPS)
    assert assert_no_win_inside_a_tie(md) == 6 + 4 + 6 + 5
    assert interval_note(0) in md and "2000 resamples, seed 0" in md and "paired" in md
    assert md.count(interval_note(0)) == 3  # the top, the throughput and the paper sections


def test_a_ratio_whose_interval_holds_one_is_a_tie(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    runs = runs_by(written)

    def replace(run, rows):
        written["requests", run], written[run]["tps_dec"] = rows, decode_tps(rows)
        written[run]["tps_req"] = request_tps(rows)
        write_requests(tree, run, rows)
        (tree / run.file("metrics.json")).write_text(json.dumps(written[run]))

    def scaled(rows, factors):
        return [dict(r, t_request_s=r["t_prefill_s"] + (r["t_request_s"] - r["t_prefill_s"]) * f)
                for r, f in zip(rows, factors)]

    eagle = written["requests", runs["eagle3", 4]]
    replace(runs["specfit", 4], scaled(eagle, [0.75, 1.25] * 3))  # faster on half the prompts, slower on half
    replace(runs["specfit", 0], scaled(written["requests", runs["eagle3", 0]], [2 / 3] * 6))  # 1.5× on every prompt
    out = tree / "report"
    report.run(spec, declared(spec), {"report": str(out)})
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
    assert assert_no_win_inside_a_tie(md) == 6 + 4 + 6 + 5


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
    assert f"[{EMULATED}]" in header[1]
    cells = {row[0]: row[1:] for row in rows}
    for k in range(8):
        assert cells[f"b_{k} (ms)"][:2] == [f"{written[DEVICE, m]['b'][k]:.3f}" for m in ("cache", "nocache")]
    assert cells["β (ms per expert)"] == [f"{written[DEVICE, 'cache']['beta']:.4f}",
                                          f"{written[DEVICE, 'nocache']['beta']:.4f}", "0.2107", "0.4080"]

    header, rows = find(tables, f"Cache-aware cost T(S) = b_|S| + β_miss M(S) + β_hit H(S) beside b_|S| + β F(S), "
                                f"toy / {DEVICE} [{EMULATED}]")
    assert header == ["Quantity", f"With cache (4 slots) [{EMULATED}]", f"Without cache (0 slots) [{EMULATED}]"]
    cells = {row[0]: row[1:] for row in rows}
    ca = {m: written[DEVICE, m]["cache_aware"] for m in ("cache", "nocache")}
    for k in range(8):
        assert cells[f"b_{k} (ms)"] == [f"{ca[m]['b'][k]:.3f}" for m in ("cache", "nocache")]
    assert cells["β_miss (ms per copied expert)"] == [f"{ca[m]['beta_miss']:.4f}" for m in ("cache", "nocache")]
    assert cells["β_hit (ms per resident expert)"] == [f"{ca['cache']['beta_hit']:.4f}",
                                                        "0.0000 (not identified: no hits)"]
    assert cells["R², cache-aware, on the probe means"] == ["0.9500", "0.9000"]
    assert cells["R², b + β F, on the probe means"] == ["0.9700", "0.9700"]
    assert cells["R², cache-aware, per repeat (fitted)"] == ["0.9000", "0.8500"]
    assert cells["RMSE (ms), cache-aware, on the probe means"] == ["0.75", "0.75"]
    assert cells["RMSE (ms), b + β F, on the probe means"] == ["1.50", "1.50"]
    assert cells["Points (probes / repeats)"] == ["144 / 288", "144 / 288"]
    assert cells["Drafting cost D(d): start / further level / selection (ms)"] == ["0.600 / 0.450 / 0.090"] * 2
    assert cells["Goal: R² ≥ 0.9 with the cache"] == ["met (R² 0.950)", "–"]
    assert (f"Goal of issue 12, toy / {DEVICE}: the cache-aware model explains the with-cache probe times with "
            "R² ≥ 0.9 on the probe means (the points of the paper model's R²): met (R² 0.950; b + β F: 0.970).") in (
        out / "report.md").read_text()
    assert len(find(tables, "Cost coefficients, toy")[1]) == 8 + 5  # the paper model's table stays as it was

    header, rows = find(tables, "Lossless check per run")
    by_run = {(row[1], row[2]): dict(zip(header, row)) for row in rows}
    fit, eagle = by_run["specfit", "Yes (4)"], by_run["eagle3", "No"]
    assert fit["Identical to the reference"] == "identical: 1 of 2 requests"
    assert fit["Not identical (first divergence, top-2 margin)"] == "request 1 (position 7, margin 0.0123)"
    assert fit["Verdict"] == "diverges: 1 of 2 requests differ from the reference"
    assert "lossless" not in fit["Verdict"]  # a run with a divergence is never shown as lossless
    assert eagle["Identical to the reference"] == "identical: 2 of 2 requests"
    assert eagle["Not identical (first divergence, top-2 margin)"] == "none"
    assert eagle["Verdict"] == "lossless: all 2 requests identical"
    assert by_run["ar", "No"]["Reference"] == "(this run is the reference)"
    assert fit["Reference"] == f"data/decode/toy/{DEVICE}/gsm8k/ar/slots0/requests.parquet"
    header, rows = find(tables, "Every divergence")
    assert rows == [["gsm8k", "specfit", "Yes (4)", "1", "7", "–", "–", "0.0123"]]


def test_cache_aware_goal_not_met_and_presets(tree):
    """The second device's fit misses the R² goal; a device on the paper's presets has no cache-aware fit."""
    spec = tiny_spec(devices=(DEVICE, "cpu-4090link"))
    written = fake_root(tree, spec)
    preset = {**written["cpu-4090link", "nocache"], "source": "paper-rtx4090", "cache_aware": None,
              "drafting": None, "r2": None, "rmse_ms": None, "n_points": 0}
    (tree / paths.calibration("toy", "cpu-4090link", "nocache")).write_text(json.dumps(preset))
    out = tree / "reports" / "all"
    report.run(spec, declared(spec), {"report": str(out)})
    md = (out / "report.md").read_text()
    caption = "Cache-aware cost T(S) = b_|S| + β_miss M(S) + β_hit H(S) beside b_|S| + β F(S), toy / cpu-4090link"
    header, rows = find(md_tables(md), caption)
    cells = {row[0]: row[1:] for row in rows}
    assert cells["Goal: R² ≥ 0.9 with the cache"] == ["not met (R² 0.750)", "–"]
    assert cells["β_miss (ms per copied expert)"][1] == "–"
    assert cells["Drafting cost D(d): start / further level / selection (ms)"][1] == "–"
    assert "toy / cpu-4090link: the cache-aware model explains the with-cache probe times with R² ≥ 0.9" in md
    assert "not met (R² 0.750; b + β F: 0.970)." in md


def test_theory_under_the_cache_aware_cost_beside_the_papers(tree):
    """specfit-ca's Table 5 (beyond the paper) follows SpecFit's in the theory section, with the rows it adds; a
    device whose file is absent lists it as missing and shows SpecFit's table alone."""
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-ca"), devices=(DEVICE, "cpu-4090link"))
    written = fake_root(tree, spec)
    (tree / "data/theory/toy/cpu-4090link/gsm8k.specfit-ca.json").unlink()
    out = tree / "reports" / "all"
    report.run(spec, declared(spec), {"report": str(out)})
    md = (out / "report.md").read_text()
    tables = md_tables(md)
    caption = (f"Beyond the paper: theory on the pools specfit-ca recorded with the cache (4 slots) under the "
               f"cache-aware cost T(S) = b_|S| + D(d) + β_miss M(S) + β_hit H(S), toy / {DEVICE}")
    header, rows = find(tables, caption)
    assert header == ["Quantity", "gsm8k"]
    cells = {row[0]: row[1] for row in rows}
    ca = written[DEVICE, "theory_ca"]
    assert (cells["Cycles"], cells["λ* − Θ (% of λ*)"], cells["Bound of Equation 7 (% of λ*)"]) == ("98", "2.41",
                                                                                                       "3.75")
    assert cells["Mean M(Ŝ)/R̂(Ŝ) at β / 2β (experts copied)"] == "4.2 / 3.5"
    assert cells["Cycles priced with nothing resident (no residency recorded)"] == "11"
    assert cells["Mean F(Ŝ)/R̂(Ŝ) at β / 2β"] == f"{ca['union_per_reward_beta']:.1f} / 31.2"
    theory = section(md, "Selection theory on the recorded pools (Table 5)")
    assert theory.index("Theory on the pools SpecFit recorded") < theory.index(caption)
    assert "Beyond the paper: the quantities of Table 5 under the cost specfit-ca selects with" in theory
    header, rows = find(tables, f"Theory on the pools SpecFit recorded with the cache (4 slots), toy / {DEVICE}")
    assert {row[0]: row[1] for row in rows}["Cycles"] == "123"  # the paper model's file, SpecFit's pools
    assert "data/theory/toy/cpu-4090link/gsm8k.specfit-ca.json" in md
    assert not any(c.startswith("Beyond the paper: theory") and c.endswith("cpu-4090link") for c, _, _ in tables)
    find(tables, "Theory on the pools SpecFit recorded with the cache (4 slots), toy / cpu-4090link")


def section(md: str, title: str) -> str:
    return next(s for s in md.split("\n### ")[1:] if s.startswith(title))


def test_sweep_noisy_second_device_and_missing_inputs(tree):
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"), slots=(0, 2, 4),
                     devices=(DEVICE, "cpu-4090link"))
    written = fake_root(tree, spec)
    runs = runs_by(written)
    # declared, but not on disk: missing
    (tree / "data/decode/toy/cpu-4090link/gsm8k/eagle3/slots2/metrics.json").unlink()
    (tree / "data/theory/toy/cpu-4090link/gsm8k.json").unlink()
    out = tree / "report"
    report.run(spec, declared(spec), {"report": str(out)})
    md = (out / "report.md").read_text()
    tables = md_tables(md)
    assert "data/decode/toy/cpu-4090link/gsm8k/eagle3/slots2/metrics.json" in md
    assert "data/theory/toy/cpu-4090link/gsm8k.json" in md
    header, rows = find(tables, f"Slot sweep, toy / {DEVICE}, gsm8k (toy subset: first 2 GSM8K questions) "
                                f"(0 = no cache) [{EMULATED}]")
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
    assert {row[0] for row in rows} == {DEVICE, "cpu-4090link"} and {row[1] for row in rows} == {"gsm8k"}
    for row in rows:
        if row[0] == DEVICE:
            run = runs[row[2], 0 if row[3] == "No" else 4]
            assert row[4:6] == [tps_text(written, run), x_text(ratio_of(written, run, runs["ar", 0]))]
    assert assert_no_win_inside_a_tie(md) > 40
    find(tables, f"Headline ratios, cpu-4090link vs paper rtx4090, gsm8k [{EMULATED}]")


def test_method_defaults_come_from_the_method_config(tree):
    """A SpecFit entry without ``routes`` has exact routes (the theory pool), a noisy one without ``accuracy``
    shows the default accuracy."""
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"))
    del spec["methods"]["specfit"]["routes"], spec["methods"]["specfit-noisy"]["accuracy"]
    fake_root(tree, spec)
    out = tree / "report"
    report.run(spec, declared(spec), {"report": str(out)})
    tables = md_tables((out / "report.md").read_text())
    find(tables, "Theory on the pools")
    header, rows = find(tables, f"Exact vs noisy routes, toy / {DEVICE}")
    assert {row[1] for row in rows} == {"exact (atlas)", "noisy, accuracy 0.6"}
    # the paper's 2.27× / 2.26× beside, with a word that these are not its 40 questions
    assert [row[-1] for row in rows] == ["–", "–", "2.27×", "2.26×"]  # at the main slots only
    assert [row[2] for row in rows] == ["No", "No", "Yes (4)", "Yes (4)"]
    assert ("gsm8k does not run the paper's 40 odd-numbered GSM8K questions"
            in (tree / "report" / "report.md").read_text())
