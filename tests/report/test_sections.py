"""The report's sections on a fake workflow folder: its tables give back the numbers the inputs hold."""

import json

import pytest
from report_fakes import DEVICE, decode_tps, fake_root, request_tps, runs_by, tiny_spec, write_requests
from report_md import assert_no_win_inside_a_tie, build, ids, key_of, pct_text, ratio_of, rows, tps_text, x_text

from specfit.planning import paths
from specfit.planning.matrix import report_inputs
from specfit.report.page import EMULATED, interval_note
from specfit.report.quantities import DRAFT_KEYS, METRICS, TOKENS_PER_TRANSFER
from specfit.results.metrics import SPLIT_KEYS

OTHER = "cpu-4090link"


def test_counters_table_gives_back_the_metrics(built):
    _spec, written, _out, tables = built
    t = tables[f"counters/toy/{DEVICE}/gsm8k"]
    assert not [h for h in t.header if h.startswith("Paper")]  # a link-only device: the wall clock, not the paper's ms
    assert all(f"[{EMULATED}]" in h for h in t.header[2:] if METRICS[key_of(h)].timing)
    keys = [key_of(h) for h in t.header[2:]]
    assert keys[keys.index("committed_per_cycle") + 1:][:4] == list(SPLIT_KEYS)  # beside Committed
    assert keys[-2:] == ["draft_ms_per_cycle", "verify_ms_per_cycle"]
    for run, row in rows(t).items():
        assert row[:2] == [run.method, "No" if run.slots == 0 else f"Yes ({run.slots})"]
        for key, cell in zip(keys, row[2:]):
            assert cell == ("–" if run.method == "ar" and key in DRAFT_KEYS
                            else format(written[run][key], METRICS[key].fmt)), (run, key)
    assert len(t.rows) == 6
    # tokens per transfer: output tokens per H2D expert transfer (1 / H2D/token), SpecFit's over EAGLE-3's
    t = tables[f"transfers/toy/{DEVICE}/gsm8k"]
    assert t.header[2:4] == ["H2D/token", TOKENS_PER_TRANSFER]
    runs = runs_by(written)
    for run, row in rows(t).items():
        h2d = written[run]["h2d_per_token"]
        eagle = written[runs["eagle3", run.slots]]["h2d_per_token"]
        assert row[2:4] == [f"{h2d:.1f}", f"{1 / h2d:.4f}"]
        assert row[4] == ("–" if run.method == "eagle3" else f"{100 * (eagle / h2d - 1):.1f}")
    assert len(t.rows) == 6


def test_throughput_and_speedup(built):
    _spec, written, out, tables = built
    t = tables[f"throughput/toy/{DEVICE}/gsm8k"]
    ar = runs_by(written)["ar", 0]
    assert len(t.rows) == 6
    for run, row in rows(t).items():
        m = written[run]
        assert row[2] == tps_text(written, run)
        assert row[3] == f"{m['tps_req']:.2f}"
        ci = ratio_of(written, run, ar)
        assert ci["value"] == pytest.approx(m["tps_dec"] / written[ar]["tps_dec"])  # all requests in common
        assert row[4] == x_text(ci)
    assert rows(t)[ar][4] == "1.00× [0.82, 1.22] tie"
    md = (out / "report.md").read_text()
    # throughput, gains at the same cache (decode and request TPS, with and without cache), paper speedups,
    # headline TPS ratios (four of decode TPS, one of request TPS); no claims on a link-only device (the wall clock)
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
    md, tables = build(spec, report_inputs(spec), tree / "report")
    cells = {key: row[2] for key, row in rows(tables[f"headline/toy/{DEVICE}/gsm8k"]).items()}
    tie = ratio_of(written, runs["specfit", 4], runs["eagle3", 4])
    assert tie["low"] < 1 < tie["high"] and tie["verdict"] == "tie"
    assert cells["vs_cached_eagle3_pct"] == pct_text(tie)
    assert cells["vs_cached_eagle3_pct"].endswith(" tie")
    # 1.5 * exp(±1.96 * CPU_SPREAD): the fake runs are timed by the CPU
    assert cells["vs_vanilla_eagle3_no_cache_pct"] == "50.0 [23.3, 82.5] faster"
    ar = runs["ar", 0]
    assert cells["vs_ar_x"] == x_text(ratio_of(written, runs["specfit", 4], ar))
    assert cells["vanilla_eagle3_vs_ar_x"] == x_text(ratio_of(written, runs["eagle3", 0], ar))
    # the non-throughput headline rows stay plain percentages of the metrics
    fewer = 100 * (1 - written[runs["specfit", 4]]["committed_per_cycle"] / written[runs["eagle3", 4]][
        "committed_per_cycle"])
    assert cells["fewer_committed_pct"] == f"{fewer:.1f}"
    # and no claims confronted on a link-only device (the wall clock)
    assert assert_no_win_inside_a_tie(md) == 6 + 4 + 6 + 5


def test_theory_calibration_and_lossless(built):
    _spec, written, out, tables = built
    t = tables[f"theory/toy/{DEVICE}"]
    assert t.header == ["Quantity", "gsm8k", "paper"]  # the first device stands for the A100
    cells = {key: row[1:] for key, row in rows(t).items()}
    assert cells["cycles"] == ["123", "4407"]
    assert cells["gap_pct"] == ["0.81", "0.95"]
    assert cells["union_per_reward_beta"] == ["35.5 / 31.2", "305.7 / 298.0"]
    assert cells["selected_nodes_beta"] == ["2.50 / 2.00", "5.09 / 4.54"]

    t = tables[f"calibration/toy/{DEVICE}"]
    assert f"[{EMULATED}]" in t.header[1]
    cells = {key: row[1:] for key, row in rows(t).items()}
    for k in range(8):
        assert cells[f"b_{k}"][:2] == [f"{written[DEVICE, m]['b'][k]:.3f}" for m in ("cache", "nocache")]
    assert cells["beta"] == [f"{written[DEVICE, 'cache']['beta']:.4f}", f"{written[DEVICE, 'nocache']['beta']:.4f}",
                             "0.2107", "0.4080"]
    assert len(t.rows) == 8 + 5  # the paper model's table stays as it was

    t = tables[f"calibration-cache-aware/toy/{DEVICE}"]
    assert t.caption.endswith(f"[{EMULATED}]")
    assert t.header[1:] == [f"With cache (4 slots) [{EMULATED}]", f"Without cache (0 slots) [{EMULATED}]"]
    cells = {key: row[1:] for key, row in rows(t).items()}
    ca = {m: written[DEVICE, m]["cache_aware"] for m in ("cache", "nocache")}
    for k in range(8):
        assert cells[f"b_{k}"] == [f"{ca[m]['b'][k]:.3f}" for m in ("cache", "nocache")]
    assert cells["beta_miss"] == [f"{ca[m]['beta_miss']:.4f}" for m in ("cache", "nocache")]
    assert cells["beta_hit"] == [f"{ca['cache']['beta_hit']:.4f}", "0.0000 (not identified: no hits)"]
    assert cells["r2_means"] == ["0.9500", "0.9000"]
    assert cells["r2_paper"] == ["0.9700", "0.9700"]
    assert cells["r2"] == ["0.9000", "0.8500"]
    assert cells["rmse_means_ms"] == ["0.75", "0.75"]
    assert cells["rmse_paper"] == ["1.50", "1.50"]
    assert cells["n_points"] == ["144 / 288", "144 / 288"]
    assert cells["drafting"] == ["0.600 / 0.450 / 0.090"] * 2
    assert cells["goal"] == ["met (R² 0.950)", "–"]
    assert (f"Goal of the cache-aware cost, toy / {DEVICE}: the cache-aware model explains the with-cache probe "
            "times with R² ≥ 0.9 on the probe means (the points of the paper model's R²): met (R² 0.950; "
            "b + β F: 0.970).") in (
        out / "report.md").read_text()

    t = tables[f"lossless/toy/{DEVICE}"]
    by_run = {(run.method, run.slots): row for run, row in rows(t).items()}
    fit, eagle = by_run["specfit", 4], by_run["eagle3", 0]
    assert fit[3:6] == ["AR's tokens (greedy)", "float32", "batched"] and eagle[4:6] == ["float32", "exact"]
    assert fit[11:] == ["identical: 1 of 2 requests", "request 1 (position 7, margin 0.0123)",
                        "diverges: 1 of 2 requests differ from the reference"]
    assert "lossless" not in fit[13]  # a run with a divergence is never shown as lossless
    assert eagle[11:] == ["identical: 2 of 2 requests", "none", "lossless: all 2 requests identical, every committed "
                          "row bit-identical to AR's step"]
    assert by_run["ar", 0][10] == "(this run is the reference)"
    assert fit[10] == f"data/decode/toy/{DEVICE}/gsm8k/ar/slots0/requests.parquet"
    assert tables[f"divergences/toy/{DEVICE}"].rows == [["gsm8k", "specfit", "Yes (4)", "1", "7", "–", "–",
                                                         "0.0123"]]


def test_cache_aware_goal_not_met_and_presets(tree):
    """The second device's fit misses the R² goal; a device on the paper's presets has no cache-aware fit."""
    spec = tiny_spec(devices=(DEVICE, OTHER))
    written = fake_root(tree, spec)
    preset = {**written[OTHER, "nocache"], "source": "paper-rtx4090", "cache_aware": None,
              "drafting": None, "r2": None, "rmse_ms": None, "n_points": 0}
    (tree / paths.calibration("toy", OTHER, "nocache")).write_text(json.dumps(preset))
    md, tables = build(spec, report_inputs(spec), tree / "reports" / "all")
    cells = {key: row[1:] for key, row in rows(tables[f"calibration-cache-aware/toy/{OTHER}"]).items()}
    assert cells["goal"] == ["not met (R² 0.750)", "–"]
    assert cells["beta_miss"][1] == "–"
    assert cells["drafting"][1] == "–"
    assert f"toy / {OTHER}: the cache-aware model explains the with-cache probe times with R² ≥ 0.9" in md
    assert "not met (R² 0.750; b + β F: 0.970)." in md


def test_theory_under_the_cache_aware_cost_beside_the_papers(tree):
    """specfit-ca's Table 5 (beyond the paper) follows SpecFit's in the theory section, with the rows it adds; a
    device whose file is absent lists it as missing and shows SpecFit's table alone."""
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-ca"), devices=(DEVICE, OTHER))
    written = fake_root(tree, spec)
    (tree / f"data/theory/toy/{OTHER}/gsm8k.specfit-ca.json").unlink()
    md, tables = build(spec, report_inputs(spec), tree / "reports" / "all")
    t = tables[f"theory-cache-aware/toy/{DEVICE}"]
    assert t.caption.startswith("Beyond the paper: theory on the pools specfit-ca recorded with the cache (4 slots)")
    assert t.header == ["Quantity", "gsm8k"]
    cells = {key: row[1] for key, row in rows(t).items()}
    ca = written[DEVICE, "theory_ca"]
    assert (cells["cycles"], cells["gap_pct"], cells["bound_pct"]) == ("98", "2.41", "3.75")
    assert cells["misses_per_reward_beta"] == "4.2 / 3.5"
    assert cells["cycles_without_residency"] == "11"
    assert cells["union_per_reward_beta"] == f"{ca['union_per_reward_beta']:.1f} / 31.2"
    theory = section(md, "Selection theory on the recorded pools (Table 5)")
    assert theory.index(tables[f"theory/toy/{DEVICE}"].caption) < theory.index(t.caption)
    assert "Beyond the paper: the quantities of Table 5 under the cost specfit-ca selects with" in theory
    assert rows(tables[f"theory/toy/{DEVICE}"])["cycles"][1] == "123"  # the paper model's file, SpecFit's pools
    assert f"data/theory/toy/{OTHER}/gsm8k.specfit-ca.json" in md
    assert f"theory-cache-aware/toy/{OTHER}" not in tables and f"theory/toy/{OTHER}" in tables


def section(md: str, title: str) -> str:
    return next(s for s in md.split("\n### ")[1:] if s.startswith(title))


def test_sweep_noisy_second_device_and_missing_inputs(tree):
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"), slots=(0, 2, 4), devices=(DEVICE, OTHER))
    written = fake_root(tree, spec)
    runs = runs_by(written)
    # declared, but not on disk: missing
    (tree / f"data/decode/toy/{OTHER}/gsm8k/eagle3/slots2/metrics.json").unlink()
    (tree / f"data/theory/toy/{OTHER}/gsm8k.json").unlink()
    md, tables = build(spec, report_inputs(spec), tree / "report")
    assert f"data/decode/toy/{OTHER}/gsm8k/eagle3/slots2/metrics.json" in md
    assert f"data/theory/toy/{OTHER}/gsm8k.json" in md
    t = tables[f"sweep/toy/{DEVICE}/gsm8k"]
    assert t.caption.endswith(f"(0 = no cache) [{EMULATED}]")
    assert t.keys == [4, 2, 0]
    for slots, row in rows(t).items():
        eagle, fit = runs["eagle3", slots], runs["specfit", slots]
        assert row[1:4] == [tps_text(written, eagle), tps_text(written, fit), pct_text(ratio_of(written, fit, eagle))]
    assert ids(tables, "noisy-routes") == [f"noisy-routes/toy/{DEVICE}/gsm8k", f"noisy-routes/toy/{OTHER}/gsm8k"]
    for run, row in rows(tables[f"noisy-routes/toy/{DEVICE}/gsm8k"]).items():
        assert row[3:5] == [tps_text(written, run), x_text(ratio_of(written, run, runs["ar", 0]))]
    t = tables["devices/toy/gsm8k"]
    assert {(run.device, run.workload) for run in t.keys} == {(DEVICE, "gsm8k"), (OTHER, "gsm8k")}
    for run, row in rows(t).items():
        assert row[:3] == [run.device, run.workload, run.method]
        if run.device == DEVICE:
            assert row[4:6] == [tps_text(written, run), x_text(ratio_of(written, run, runs["ar", 0]))]
    assert assert_no_win_inside_a_tie(md) > 40
    assert tables[f"headline/toy/{OTHER}/gsm8k"].caption.endswith(f"[{EMULATED}]")


def test_method_defaults_come_from_the_method_config(tree):
    """A SpecFit entry without ``routes`` has exact routes (the theory pool), a noisy one without ``accuracy``
    shows the default accuracy."""
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"))
    del spec["methods"]["specfit"]["routes"], spec["methods"]["specfit-noisy"]["accuracy"]
    fake_root(tree, spec)
    md, tables = build(spec, report_inputs(spec), tree / "report")
    assert f"theory/toy/{DEVICE}" in tables
    t = tables[f"noisy-routes/toy/{DEVICE}/gsm8k"]
    assert [row[1] for row in t.rows] == ["exact (atlas)", "noisy, accuracy 0.6"] * 2
    # the paper's 2.27× / 2.26× beside, with a word that these are not its 40 questions
    assert [row[-1] for row in t.rows] == ["–", "–", "2.27×", "2.26×"]  # at the main slots only
    assert [run.slots for run in t.keys] == [0, 0, 4, 4]
    assert "gsm8k does not run the paper's 40 odd-numbered GSM8K questions" in md
