"""The report's figures beyond the counters, each checked against values computed here from the fake inputs: the
gains including prefill (TPS_req), verification's share of the time saved per cycle, Figure 4 per slot count with
the paper's figures beside, tokens per transfer; and the paper's workloads under the paper config's names
(gsm8k-odd standing for gsm8k on the RTX 4090, the noisy-route runs' 40 questions on the A100)."""

import pytest
from report_fakes import DEVICE, declared, fake_root, runs_by, tiny_spec
from report_md import assert_no_win_inside_a_tie, captions, find, md_tables, pct_text, ratio_of, tps_text, x_text

from specfit import intervals, report
from specfit.paper import paper_results
from specfit.report.page import EMULATED
from specfit.workflow import DecodeRun

OTHER = "cpu-4090link"
PAPER = paper_results()


def build(tree, spec):
    written = fake_root(tree, spec)
    out = tree / "report"
    report.run(spec, declared(spec), {"report": str(out)})
    md = (out / "report.md").read_text()
    return written, md, md_tables(md)


def whole(rows):
    """TPS_req = Σ n_output / Σ t_request as the intervals module's decode TPS: one more token, no prefill."""
    return [dict(r, n_output=r["n_output"] + 1, t_prefill_s=0.0) for r in rows]


def request_ratio(written, num, den):
    ci = intervals.ratio_interval(whole(written["requests", num]), whole(written["requests", den]), seed=0)
    tps = [sum(r["n_output"] for r in written["requests", run]) / sum(r["t_request_s"] for r in written["requests", run])
           for run in (num, den)]
    assert ci["value"] == pytest.approx(tps[0] / tps[1])  # the same request ids in both runs
    assert tps == pytest.approx([written[num]["tps_req"], written[den]["tps_req"]])
    return ci


def cells_of(rows):
    return {row[0]: row[1:] for row in rows}


def share(written, eagle, fit, key):
    saved = written[eagle]["ms_per_cycle"] - written[fit]["ms_per_cycle"]
    return "n/a" if saved <= 0 else f"{100 * (written[eagle][key] - written[fit][key]) / saved:.1f}"


@pytest.mark.parametrize("seed", [0, 3])
def test_summarization_headline_has_prefill_gain_verification_share_and_tokens_per_transfer(tree, seed):
    spec = tiny_spec(workload="summarization")
    written = fake_root(tree, spec, seed=seed)
    out = tree / "report"
    report.run(spec, declared(spec), {"report": str(out)})
    md = (out / "report.md").read_text()
    tables = md_tables(md)
    runs = runs_by(written)
    fit, eagle = runs["specfit", 4], runs["eagle3", 4]
    _, rows = find(tables, f"Headline ratios, {DEVICE} vs paper a100, summarization")
    cells = cells_of(rows)
    # gains including prefill: TPS_req with its paired bootstrap interval, the paper's 19.9% beside
    assert cells["SpecFit over cached EAGLE-3, prefill included: Request TPS (%)"] == [
        "19.9", pct_text(request_ratio(written, fit, eagle))]
    # verification's share of the time saved per cycle: the drop in verify ms over the drop in ms/cycle
    assert cells["Verification's share of the time SpecFit saves per cycle vs cached EAGLE-3 (%)"] == [
        "78.3", share(written, eagle, fit, "verify_ms_per_cycle")]
    # tokens per transfer: output tokens per H2D transfer, 1 / H2D/token
    advantage = 100 * (written[eagle]["h2d_per_token"] / written[fit]["h2d_per_token"] - 1)
    assert cells["SpecFit more tokens per transfer than cached EAGLE-3 (%)"] == ["28.3", f"{advantage:.1f}"]
    assert cells["SpecFit drafting time per cycle cut vs cached EAGLE-3 (%)"][0] == "44.9"

    # the same figures in the throughput and counters sections, with the paper beside
    header, rows = find(tables, f"Gains at the same cache, toy / {DEVICE}, summarization")
    assert f"[{EMULATED}]" in header[1] and f"[{EMULATED}]" in header[2]
    assert header[3:] == ["Paper a100, Decode TPS (%)", "Paper a100, prefill included (%)"]
    gains = cells_of(rows)
    assert gains["Yes (4)"] == [pct_text(ratio_of(written, fit, eagle)), pct_text(request_ratio(written, fit, eagle)),
                                "21.6", "19.9"]
    nocache = runs["specfit", 0], runs["eagle3", 0]
    assert gains["No"] == [pct_text(ratio_of(written, *nocache)), pct_text(request_ratio(written, *nocache)),
                           "31.6", "–"]

    header, rows = find(tables, f"Time saved per cycle, specfit vs eagle3 with the cache (4 slots), toy / {DEVICE}, "
                                "summarization")
    assert header[-2:] == ["Paper a100 cut (%)", "Paper a100 share of the time saved (%)"]
    saved = cells_of(rows)
    e, s = written[eagle], written[fit]
    total = e["ms_per_cycle"] - s["ms_per_cycle"]
    for label, key, paper_cut, paper_share in (("Whole cycle (ms/cycle)", "ms_per_cycle", "28.5", "–"),
                                               ("Drafting", "draft_ms_per_cycle", "44.9", "–"),
                                               ("Verification (target forward)", "verify_ms_per_cycle", "–", "78.3")):
        assert saved[label] == [f"{e[key]:.2f}", f"{s[key]:.2f}", f"{e[key] - s[key]:.2f}",
                                f"{100 * (1 - s[key] / e[key]):.1f}", share(written, eagle, fit, key),
                                paper_cut, paper_share]
    rest = [m["ms_per_cycle"] - m["draft_ms_per_cycle"] - m["verify_ms_per_cycle"] for m in (e, s)]
    assert saved["Rest (selection, commit, synchronization)"][:3] == [f"{rest[0]:.2f}", f"{rest[1]:.2f}",
                                                                      f"{rest[0] - rest[1]:.2f}"]
    if total > 0:  # the parts add up to the whole
        parts = [float(saved[label][4]) for label in saved if label != "Whole cycle (ms/cycle)"]
        assert sum(parts) == pytest.approx(100.0, abs=0.2)
    assert_no_win_inside_a_tie(md)


def test_figure_4_per_slot_count_with_the_paper_beside(tree):
    spec = tiny_spec(workload="summarization", slots=(0, 2, 3, 4))
    written, md, tables = build(tree, spec)
    runs = runs_by(written)
    sweep = PAPER["slot_sweep"]
    header, rows = find(tables, f"Slot sweep, toy / {DEVICE}, summarization")
    assert header[4:] == ["Paper slots (A100, by rank)", "Paper EAGLE-3 Decode TPS", "Paper SpecFit Decode TPS",
                          "Paper gain (%)"]
    assert [row[0] for row in rows] == ["4", "3", "2", "0"]
    for j, row in enumerate(rows):
        eagle, fit = runs["eagle3", int(row[0])], runs["specfit", int(row[0])]
        assert row[1:4] == [tps_text(written, eagle), tps_text(written, fit), pct_text(ratio_of(written, fit, eagle))]
        assert row[4:] == [str(sweep["slots"][j]), f"{sweep['decode_tps']['eagle3'][j]:.2f}",
                           f"{sweep['decode_tps']['specfit'][j]:.2f}", f"{sweep['specfit_gain_pct'][j]:.1f}"]
    header, rows = find(tables, f"Cycle time and transfers per slot count, toy / {DEVICE}, summarization")
    assert f"[{EMULATED}]" in header[1] and "Tokens/transfer" in header[6]
    paper_cells = []
    for row in rows:
        e, s = written[runs["eagle3", int(row[0])]], written[runs["specfit", int(row[0])]]
        assert row[1:9] == [f"{e['ms_per_cycle']:.1f}", f"{s['ms_per_cycle']:.1f}",
                             f"{100 * (1 - s['ms_per_cycle'] / e['ms_per_cycle']):.1f}",
                             f"{e['h2d_per_token']:.1f}", f"{s['h2d_per_token']:.1f}",
                             f"{1 / e['h2d_per_token']:.4f}", f"{1 / s['h2d_per_token']:.4f}",
                             f"{100 * (e['h2d_per_token'] / s['h2d_per_token'] - 1):.1f}"]
        paper_cells.append(row[9:])
    # the paper's Figure 4b: ms/cycle, H2D/token, its cycles 28.5 / 30.1 / 32.7% shorter and its stated
    # token-per-transfer advantages 28.3 / 42.7 / 49.5%; at 0 slots computed, 486.5 / 347.7 - 1
    assert paper_cells == [["48", "371.7", "265.8", "28.5", "73.4", "57.2", "28.3"],
                           ["24", "409.3", "286.3", "30.1", "200.3", "140.4", "42.7"],
                           ["12", "471.8", "317.5", "32.7", "340.0", "227.4", "49.5"],
                           ["0", "600.9", "373.6", "37.8", "486.5", "347.7", "39.9"]]


def test_gsm8k_odd_stands_for_gsm8k_on_the_rtx4090(tree):
    """The paper config: the A100 runs gsm8k, the RTX 4090 gsm8k-odd (``paper: gsm8k``)."""
    spec = tiny_spec(devices=(DEVICE, OTHER))
    spec["workloads"]["gsm8k-odd"] = dict(spec["workloads"]["gsm8k"], question_ids={"start": 401, "stop": 403,
                                                                                    "step": 2}, paper="gsm8k")
    block = spec["runs"][0]
    spec["runs"] = [dict(block, devices=[DEVICE]), dict(block, devices=[OTHER], workloads=["gsm8k-odd"])]
    written, md, tables = build(tree, spec)
    other = {(r.method, r.slots): r for r in written if isinstance(r, DecodeRun) and r.device == OTHER}
    runs = runs_by(written)

    # Table 4 beside this run's RTX 4090 stand-in
    header, rows = find(tables, f"{OTHER} vs paper rtx4090, gsm8k-odd (paper: gsm8k)")
    table4 = PAPER["decode_tps"]["rtx4090"]["gsm8k"]
    for row in rows:
        run = other[row[0], 4 if row[1] == "Yes" else 0]
        assert row[2] == f"{table4[row[0]]['cache' if row[1] == 'Yes' else 'no_cache']:.2f}"
        assert row[3] == tps_text(written, run)
        assert row[5] == x_text(ratio_of(written, run, other["ar", 0]))
    _, rows = find(tables, f"Headline ratios, {OTHER} vs paper rtx4090, gsm8k-odd (paper: gsm8k)")
    cells = cells_of(rows)
    assert cells["SpecFit over cached EAGLE-3 (%)"] == ["10.8", pct_text(ratio_of(written, other["specfit", 4],
                                                                                   other["eagle3", 4]))]
    assert cells["SpecFit cycle shorter than cached EAGLE-3 (%)"][0] == "16.5"  # the text's figure
    assert cells["SpecFit more tokens per transfer than cached EAGLE-3 (%)"][0] == f"{100 * (150.0 / 128.3 - 1):.1f}"
    find(tables, f"Headline ratios, {DEVICE} vs paper a100, gsm8k")
    assert f"Workloads are mapped by their config key `paper`: gsm8k-odd on {OTHER} for the paper's gsm8k." in md

    # the devices side by side: one table for the paper's gsm8k, each device's stand-in named
    header, rows = find(tables, f"gsm8k on every device ({DEVICE}: gsm8k, {OTHER}: gsm8k-odd)")
    assert header[:2] == ["Device", "Workload"]
    assert {(row[0], row[1]) for row in rows} == {(DEVICE, "gsm8k"), (OTHER, "gsm8k-odd")} and len(rows) == 12
    for row in rows:
        run = (runs if row[0] == DEVICE else other)[row[2], 0 if row[3] == "No" else 4]
        ar = (runs if row[0] == DEVICE else other)["ar", 0]
        assert row[4:6] == [tps_text(written, run), x_text(ratio_of(written, run, ar))]

    # without the key, gsm8k-odd is none of the paper's workloads: Table 4 and the side by side are gone
    del spec["workloads"]["gsm8k-odd"]["paper"]
    out = tree / "report-nokey"
    report.run(spec, declared(spec), {"report": str(out)})
    md = (out / "report.md").read_text()
    assert not any(c.startswith(f"{OTHER} vs paper") for c in captions(md_tables(md)))
    assert "No workload runs on more than one device." in md


def test_noisy_routes_on_the_papers_40_questions_beside_a_full_gsm8k(tree):
    """On the A100, gsm8k (all six runs) and gsm8k-odd (AR, SpecFit exact and noisy) both stand for gsm8k: the
    paper's Tables 3 and 5 sit beside gsm8k, its route-prediction figures beside gsm8k-odd."""
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"))
    spec["workloads"]["gsm8k-odd"] = dict(spec["workloads"]["gsm8k"], question_ids={"start": 401, "stop": 479,
                                                                                    "step": 2},
                                          max_requests=None, subset_label="", paper="gsm8k")
    block = spec["runs"][0]
    spec["runs"] = [dict(block, methods=["ar", "eagle3", "specfit"]),
                    dict(block, workloads=["gsm8k-odd"], methods=["ar"], slots=[0]),
                    dict(block, workloads=["gsm8k-odd"], methods=["specfit", "specfit-noisy"], slots=[4])]
    written, md, tables = build(tree, spec)
    odd = {(r.method, r.slots): r for r in written if isinstance(r, DecodeRun) and r.workload == "gsm8k-odd"}
    assert [c for c in captions(tables) if " vs paper " in c] == [
        f"{DEVICE} vs paper a100, gsm8k [{EMULATED}]", f"Headline ratios, {DEVICE} vs paper a100, gsm8k [{EMULATED}]"]
    header, _ = find(tables, "Theory on the pools")
    assert header == ["Quantity", "gsm8k", "paper", "gsm8k-odd"]  # Table 5 (80 questions) beside gsm8k only
    assert len([c for c in captions(tables) if c.startswith("Exact vs noisy routes")]) == 1
    header, rows = find(tables, f"Exact vs noisy routes, toy / {DEVICE}, gsm8k-odd")
    assert header[-1] == "Paper speedup (A100, 40 odd-numbered GSM8K questions; noisy: 60% accuracy)"
    by_kind = {row[1]: row for row in rows}
    for kind, method, paper_x in (("exact (atlas)", "specfit", "2.27×"), ("noisy, accuracy 0.6", "specfit-noisy",
                                                                          "2.26×")):
        run = odd[method, 4]
        assert by_kind[kind][3:] == [tps_text(written, run), x_text(ratio_of(written, run, odd["ar", 0])), paper_x]
    assert "does not run the paper's" not in md  # these are its 40 questions
    # the gsm8k-odd runs have no EAGLE-3: their section tables show what they hold
    header, rows = find(tables, f"Throughput, toy / {DEVICE}, gsm8k-odd")
    assert {row[0] for row in rows} == {"ar", "specfit", "specfit-noisy"}


def test_theory_rows_for_the_length_limit(built):
    spec, written, out, tables = built
    _, rows = find(tables, "Theory on the pools")
    cells = cells_of(rows)
    assert cells["Cycles stopped before the deepest level they could draft (%)"] == ["55.5", "33.7"]
    assert cells["Cycles whose depth the length limit capped"] == ["7", "–"]
    assert cells["Cycles that drafted nothing (root only)"] == ["2", "–"]
