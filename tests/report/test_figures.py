"""The report's figures beyond the counters, each checked against values computed here from the fake inputs: the
gains including prefill (TPS_req), verification's share of the time saved per cycle, Figure 4 per slot count with
the paper's figures beside, tokens per transfer; and the paper's workloads under the paper config's names
(gsm8k-odd standing for gsm8k on the RTX 4090, the noisy-route runs' 40 questions on the A100)."""

import pytest
from report_fakes import DEVICE, fake_root, runs_by, tiny_spec
from report_md import assert_no_win_inside_a_tie, build, ids, pct_text, ratio_of, rows, tps_text, x_text

from specfit.paper import paper_results
from specfit.planning.matrix import DecodeRun, report_inputs
from specfit.report.page import EMULATED
from specfit.results import intervals

OTHER = "cpu-4090link"
PAPER = paper_results()


def built(tree, spec):
    written = fake_root(tree, spec)
    return written, *build(spec, report_inputs(spec), tree / "report")


def whole(rows):
    """TPS_req = Σ n_output / Σ t_request as the intervals module's decode TPS: one more token, no prefill."""
    return [dict(r, n_output=r["n_output"] + 1, t_prefill_s=0.0) for r in rows]


def request_ratio(written, num, den):
    ci = intervals.ratio_interval(whole(written["requests", num]), whole(written["requests", den]), seed=0,
                                 spread=intervals.process_spread(written[num], written[den]))
    tps = [sum(r["n_output"] for r in written["requests", run])
           / sum(r["t_request_s"] for r in written["requests", run]) for run in (num, den)]
    assert ci["value"] == pytest.approx(tps[0] / tps[1])  # the same request ids in both runs
    assert tps == pytest.approx([written[num]["tps_req"], written[den]["tps_req"]])
    return ci


def cells_of(table):
    return {key: row[1:] for key, row in rows(table).items()}


def share(written, eagle, fit, key):
    saved = written[eagle]["ms_per_cycle"] - written[fit]["ms_per_cycle"]
    return "n/a" if saved <= 0 else f"{100 * (written[eagle][key] - written[fit][key]) / saved:.1f}"


@pytest.mark.parametrize("seed", [0, 3])
def test_summarization_headline_has_prefill_gain_verification_share_and_tokens_per_transfer(tree, seed):
    spec = tiny_spec(workload="summarization")
    written = fake_root(tree, spec, seed=seed)
    md, tables = build(spec, report_inputs(spec), tree / "report")
    runs = runs_by(written)
    fit, eagle = runs["specfit", 4], runs["eagle3", 4]
    cells = cells_of(tables[f"headline/toy/{DEVICE}/summarization"])
    # gains including prefill: TPS_req with its paired bootstrap interval, the paper's 19.9% beside
    assert cells["incl_prefill_pct"] == ["19.9", pct_text(request_ratio(written, fit, eagle))]
    # verification's share of the time saved per cycle: the drop in verify ms over the drop in ms/cycle
    assert cells["verification_share_of_saving_pct"] == ["78.3", share(written, eagle, fit, "verify_ms_per_cycle")]
    # tokens per transfer: output tokens per H2D transfer, 1 / H2D/token
    advantage = 100 * (written[eagle]["h2d_per_token"] / written[fit]["h2d_per_token"] - 1)
    assert cells["tokens_per_transfer_advantage_pct"] == ["28.3", f"{advantage:.1f}"]
    assert cells["drafting_time_cut_pct"][0] == "44.9"

    # the same figures in the throughput and counters sections, with the paper beside
    t = tables[f"gains/toy/{DEVICE}/summarization"]
    assert f"[{EMULATED}]" in t.header[1] and f"[{EMULATED}]" in t.header[2]
    assert t.header[3:] == ["Paper a100, Decode TPS (%)", "Paper a100, prefill included (%)"]
    gains = cells_of(t)
    assert gains[4] == [pct_text(ratio_of(written, fit, eagle)), pct_text(request_ratio(written, fit, eagle)),
                        "21.6", "19.9"]
    nocache = runs["specfit", 0], runs["eagle3", 0]
    assert gains[0] == [pct_text(ratio_of(written, *nocache)), pct_text(request_ratio(written, *nocache)), "31.6", "–"]

    t = tables[f"time-saved/toy/{DEVICE}/summarization"]
    assert t.header[-2:] == ["Paper a100 cut (%)", "Paper a100 share of the time saved (%)"]
    saved = cells_of(t)
    e, s = written[eagle], written[fit]
    total = e["ms_per_cycle"] - s["ms_per_cycle"]
    for key, paper_cut, paper_share in (("ms_per_cycle", "28.5", "–"), ("draft_ms_per_cycle", "44.9", "–"),
                                        ("verify_ms_per_cycle", "–", "78.3")):
        assert saved[key] == [f"{e[key]:.2f}", f"{s[key]:.2f}", f"{e[key] - s[key]:.2f}",
                              f"{100 * (1 - s[key] / e[key]):.1f}", share(written, eagle, fit, key),
                              paper_cut, paper_share]
    rest = [m["ms_per_cycle"] - m["draft_ms_per_cycle"] - m["verify_ms_per_cycle"] for m in (e, s)]
    assert saved["rest"][:3] == [f"{rest[0]:.2f}", f"{rest[1]:.2f}", f"{rest[0] - rest[1]:.2f}"]
    if total > 0:  # the parts add up to the whole
        parts = [float(saved[key][4]) for key in saved if key != "ms_per_cycle"]
        assert sum(parts) == pytest.approx(100.0, abs=0.2)
    assert_no_win_inside_a_tie(md)


def test_figure_4_per_slot_count_with_the_paper_beside(tree):
    spec = tiny_spec(workload="summarization", slots=(0, 2, 3, 4))
    written, _md, tables = built(tree, spec)
    runs = runs_by(written)
    sweep = PAPER["slot_sweep"]
    t = tables[f"sweep/toy/{DEVICE}/summarization"]
    assert t.header[4:] == ["Paper slots (A100, by rank)", "Paper EAGLE-3 Decode TPS", "Paper SpecFit Decode TPS",
                            "Paper gain (%)"]
    assert t.keys == [4, 3, 2, 0]
    for j, (slots, row) in enumerate(rows(t).items()):
        eagle, fit = runs["eagle3", slots], runs["specfit", slots]
        assert row[1:4] == [tps_text(written, eagle), tps_text(written, fit), pct_text(ratio_of(written, fit, eagle))]
        assert row[4:] == [str(sweep["slots"][j]), f"{sweep['decode_tps']['eagle3'][j]:.2f}",
                           f"{sweep['decode_tps']['specfit'][j]:.2f}", f"{sweep['specfit_gain_pct'][j]:.1f}"]
    t = tables[f"sweep-cost/toy/{DEVICE}/summarization"]
    assert f"[{EMULATED}]" in t.header[1] and "Tokens/transfer" in t.header[6]
    paper_cells = []
    for slots, row in rows(t).items():
        e, s = written[runs["eagle3", slots]], written[runs["specfit", slots]]
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
    written, md, tables = built(tree, spec)
    other = {(r.method, r.slots): r for r in written if isinstance(r, DecodeRun) and r.device == OTHER}
    runs = runs_by(written)

    # Table 4 beside this run's RTX 4090 stand-in
    t = tables[f"paper/toy/{OTHER}/gsm8k-odd"]
    assert t.caption == f"{OTHER} vs paper rtx4090, gsm8k-odd (paper: gsm8k) [{EMULATED}]"
    table4 = PAPER["decode_tps"]["rtx4090"]["gsm8k"]
    for (rule, mode), row in rows(t).items():
        run = other[rule, 4 if mode == "cache" else 0]
        assert row[2] == f"{table4[rule]['cache' if mode == 'cache' else 'no_cache']:.2f}"
        assert row[3] == tps_text(written, run)
        assert row[5] == x_text(ratio_of(written, run, other["ar", 0]))
    cells = cells_of(tables[f"headline/toy/{OTHER}/gsm8k-odd"])
    assert cells["vs_cached_eagle3_pct"] == ["10.8", pct_text(ratio_of(written, other["specfit", 4],
                                                                        other["eagle3", 4]))]
    assert cells["shorter_cycle_pct"][0] == "16.5"  # the text's figure
    assert cells["tokens_per_transfer_advantage_pct"][0] == f"{100 * (150.0 / 128.3 - 1):.1f}"
    assert f"headline/toy/{DEVICE}/gsm8k" in tables
    assert f"Workloads are mapped by their config key `paper`: gsm8k-odd on {OTHER} for the paper's gsm8k." in md

    # the devices side by side: one table for the paper's gsm8k, each device's stand-in named
    t = tables["devices/toy/gsm8k"]
    assert t.caption.startswith(f"gsm8k on every device ({DEVICE}: gsm8k, {OTHER}: gsm8k-odd)")
    assert {(run.device, run.workload) for run in t.keys} == {(DEVICE, "gsm8k"), (OTHER, "gsm8k-odd")}
    assert len(t.rows) == 12
    for run, row in rows(t).items():
        assert row[:4] == [run.device, run.workload, run.method, "No" if run.slots == 0 else "Yes (4)"]
        ar = (runs if run.device == DEVICE else other)["ar", 0]
        assert row[4:6] == [tps_text(written, run), x_text(ratio_of(written, run, ar))]

    # without the key, gsm8k-odd is none of the paper's workloads: Table 4 and the side by side are gone
    del spec["workloads"]["gsm8k-odd"]["paper"]
    md, tables = build(spec, report_inputs(spec), tree / "report-nokey")
    assert not ids(tables, "devices") and f"paper/toy/{OTHER}/gsm8k-odd" not in tables
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
    written, md, tables = built(tree, spec)
    odd = {(r.method, r.slots): r for r in written if isinstance(r, DecodeRun) and r.workload == "gsm8k-odd"}
    assert ids(tables, "paper") + ids(tables, "headline") == [f"paper/toy/{DEVICE}/gsm8k",
                                                             f"headline/toy/{DEVICE}/gsm8k"]
    # Table 5 (80 questions) beside gsm8k only
    assert tables[f"theory/toy/{DEVICE}"].header == ["Quantity", "gsm8k", "paper", "gsm8k-odd"]
    assert ids(tables, "noisy-routes") == [f"noisy-routes/toy/{DEVICE}/gsm8k-odd"]
    t = tables[f"noisy-routes/toy/{DEVICE}/gsm8k-odd"]
    assert t.header[-1] == "Paper speedup (A100, 40 odd-numbered GSM8K questions; noisy: 60% accuracy)"
    by_kind = {row[1]: row for row in t.rows}
    for kind, method, paper_x in (("exact (atlas)", "specfit", "2.27×"), ("noisy, accuracy 0.6", "specfit-noisy",
                                                                          "2.26×")):
        run = odd[method, 4]
        assert by_kind[kind][3:] == [tps_text(written, run), x_text(ratio_of(written, run, odd["ar", 0])), paper_x]
    assert "does not run the paper's" not in md  # these are its 40 questions
    # the gsm8k-odd runs have no EAGLE-3: their section tables show what they hold
    assert {run.method for run in tables[f"throughput/toy/{DEVICE}/gsm8k-odd"].keys} == {"ar", "specfit",
                                                                                        "specfit-noisy"}


def test_theory_rows_for_the_length_limit(built):
    _spec, _written, _out, tables = built
    cells = cells_of(tables[f"theory/toy/{DEVICE}"])
    assert cells["stopped_early_pct"] == ["55.5", "33.7"]
    assert cells["length_limited_cycles"] == ["7", "–"]
    assert cells["empty_pool_cycles"] == ["2", "–"]
