"""The paper's claims confronted (sections/claims.py) and the emulated device's proportions
(sections/proportions.py)."""

import json

from report_fakes import EMULATED_DEVICE as DEVICE
from report_fakes import emulated_tree, fake_root, tiny_spec
from report_md import build, ratio_of, ratio_of_ratios, rows, x_text

from specfit.engine.paper_gpus import paper_proportions
from specfit.paper import paper_results
from specfit.planning.matrix import report_inputs
from specfit.report.verdict import Verdict, confronted
from specfit.results import intervals
from specfit.results.acceptance import direction


def test_confronted():
    assert confronted(Verdict.FASTER, Verdict.FASTER) == Verdict.CONFIRMED
    assert confronted(Verdict.FASTER, Verdict.SLOWER) == Verdict.REFUTED
    assert confronted(Verdict.FASTER, Verdict.TIE) == Verdict.TIE
    assert confronted(Verdict.TIE, Verdict.TIE) == Verdict.CONFIRMED  # the paper claims no difference, none found
    assert confronted(Verdict.TIE, Verdict.SLOWER) == Verdict.REFUTED
    assert confronted(Verdict.SLOWER, None) == Verdict.NOT_JUDGED


def test_claims_and_proportions_on_an_emulated_device(tree):
    spec, written = emulated_tree(tree)
    runs = {(r.method, r.slots): r for r in written if hasattr(r, "file")}
    md, tables = build(spec, report_inputs(spec), tree / "reports" / "all")
    claims = rows(tables[f"claims/toy/{DEVICE}"])
    paper = paper_results()["decode_tps"]["a100"]["gsm8k"]
    # vanilla EAGLE-3 against AR without the cache: GSM8K's 6.26 / 4.70 in the paper, faster
    row = claims["vanilla-eagle3/gsm8k"]
    assert row[2] == f"{paper['eagle3']['no_cache'] / paper['ar']['no_cache']:.2f}× (faster)"
    ci = ratio_of(written, runs["eagle3", 0], runs["ar", 0])
    assert row[3] == x_text(ci)
    assert row[4] == str(confronted(Verdict.FASTER, Verdict(ci["verdict"])))
    ci = ratio_of(written, runs["specfit", 4], runs["ar", 4])
    assert claims["specfit-ar-cache/gsm8k"][4] == str(confronted(Verdict.FASTER, Verdict(ci["verdict"])))
    assert claims["table5/gsm8k"][3] == "0.81% ≤ 1.52%" and claims["table5/gsm8k"][4] == "confirmed"

    props = rows(tables[f"proportions/toy/{DEVICE}/gsm8k"])
    m = {k: written[runs[k]] for k in (("ar", 4), ("ar", 0), ("eagle3", 4), ("eagle3", 0))}
    ratio = m["ar", 0]["ms_per_cycle"] / m["ar", 4]["ms_per_cycle"]
    ref = paper_proportions(paper_results(), "gsm8k")["ar_nocache_over_cache"]
    assert props["ar_nocache_over_cache"][1:] == [f"{ratio:.2f}", f"{ref:.2f}",
                                                  "met" if abs(ratio / ref - 1) <= 0.15 else "not met"]
    level = m["eagle3", 4]["draft_ms_per_cycle"] / 4.0 / m["ar", 4]["ms_per_cycle"]
    assert props["level_share"][1] == f"{100 * level:.1f}%"
    assert props["execution_share"][1] == f"{100 * 16 * 4.786 / m['ar', 4]['ms_per_cycle']:.1f}%"
    assert props["copy_share"][3] == "–"  # shown beside the paper's, no goal
    # acceptance beside the paper's: EAGLE-3's committed per cycle with its goal, Table 5's rows with their direction
    acc = rows(tables[f"acceptance/toy/{DEVICE}/gsm8k"])
    e3 = written[runs["eagle3", 4]]["committed_per_cycle"]
    assert acc["e3_committed"][1:] == [f"{e3:.2f}", "4.35", direction(e3, 4.35),
                                       "met" if abs(e3 / 4.35 - 1) <= 0.15 else "not met"]
    theory = json.loads((tree / f"data/theory/toy/{DEVICE}/gsm8k.json").read_text())
    assert acc["selected_nodes"][1:] == [f"{theory['selected_nodes_beta']:.2f}", "5.09",
                                         direction(theory["selected_nodes_beta"], 5.09), "–"]
    assert acc["stopped_early_pct"][2] == "33.7" and acc["rho_cv"][2] == "0.25"
    checks = rows(tables[f"device-checks/toy/{DEVICE}"])
    assert list(checks) == ["r2"]  # nothing overruns a virtual clock; one workload, so no order between two
    # the paper's own milliseconds: its cells beside the runs that stand for them
    counters, cells = tables[f"counters/toy/{DEVICE}/gsm8k"], paper_results()["counters"]["a100"]["gsm8k"]
    assert counters.header[-2:] == ["Paper a100 ms/cycle", "Paper a100 committed"]
    for run, row in rows(counters).items():
        cell = cells[run.method]["no_cache" if run.slots == 0 else "cache"]
        assert row[-2:] == [f"{cell['ms_per_cycle']:.1f}", f"{cell['committed']:.2f}"]
    throughput = rows(tables[f"throughput/toy/{DEVICE}/gsm8k"])
    assert throughput[runs["specfit", 4]][-1] == f"{paper['specfit']['cache']:.2f}"
    assert checks["r2"][1:] == ["0.970", "met"]
    assert "emulated A100, virtual clock" in md


def test_no_proportions_and_no_claims_on_a_link_only_device(tree):
    spec = tiny_spec()
    fake_root(tree, spec)
    _, tables = build(spec, report_inputs(spec), tree / "reports" / "all")
    assert not [t for t in tables if t.startswith("proportions/")]
    assert "claims/toy/cpu-a100link" not in tables  # the wall clock: no verdicts


def sweep_tree(tree, speeds):
    """Summarization on the emulated A100 at 4, 2 and 0 slots (the sweep claim's ends: 4, the main slots, and 0)."""
    spec, written = emulated_tree(tree, tiny_spec(slots=(0, 2, 4), devices=(DEVICE,), workload="summarization"),
                                  speeds)
    return spec, written, {(r.method, r.slots): r for r in written if hasattr(r, "file")}


def test_the_sweep_claim_is_judged_on_the_gain_at_its_ends(tree):
    """The gain without a cache over the gain at the main slots decides, with its own paired interval (four decode
    jobs: the spread of two ratios), whatever the gains do in between; the paper's is 1.316 / 1.216 (faster)."""
    speeds = {("specfit", 4): 6.0, ("eagle3", 4): 5.0, ("specfit", 2): 9.0, ("eagle3", 2): 4.0,
              ("specfit", 0): 4.2, ("eagle3", 0): 3.0}  # 1.2x, 2.25x (not monotone), 1.4x
    spec, written, runs = sweep_tree(tree, speeds)
    _, tables = build(spec, report_inputs(spec), tree / "reports" / "all")
    row = rows(tables[f"claims/toy/{DEVICE}"])["gain-grows/summarization"]
    ends = [written["requests", runs[k]] for k in (("specfit", 0), ("eagle3", 0), ("specfit", 4), ("eagle3", 4))]
    ci = ratio_of_ratios(*ends, seed=0, spread=2 ** 0.5 * intervals.VIRTUAL_SPREAD)  # four jobs on a virtual clock
    assert row[2].endswith("; 0 over 48: 1.08×")
    assert row[3].endswith(f"; 0 over 4: {x_text(ci)}")
    assert row[3].startswith(f"4: {x_text(ratio_of(written, runs['specfit', 4], runs['eagle3', 4]))}, 2: ")
    assert ci["low"] > 1.0 and row[4] == "confirmed"
