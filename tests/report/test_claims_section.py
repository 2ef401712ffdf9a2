"""The paper's claims confronted (sections/claims.py) and the emulated device's proportions
(sections/proportions.py)."""

import json

from report_fakes import declared, fake_root, tiny_spec
from report_md import build, ratio_of, rows, x_text

from specfit.paper import paper_results
from specfit.paper_device import paper_proportions
from specfit.report.verdict import Verdict, confronted

DEVICE = "cpu-a100"
EMULATE = {"name": "A100", "fixed_ms": 9.83, "token_ms": 0.1889, "expert_ms": 0.6356, "copy_ms": 0.6075,
           "draft_ms": 1.359}


def test_confronted():
    assert confronted(Verdict.FASTER, Verdict.FASTER) == Verdict.CONFIRMED
    assert confronted(Verdict.FASTER, Verdict.SLOWER) == Verdict.REFUTED
    assert confronted(Verdict.FASTER, Verdict.TIE) == Verdict.TIE
    assert confronted(Verdict.TIE, Verdict.TIE) == Verdict.CONFIRMED  # the paper claims no difference, none found
    assert confronted(Verdict.TIE, Verdict.SLOWER) == Verdict.REFUTED
    assert confronted(Verdict.SLOWER, None) == Verdict.NOT_JUDGED


def emulated_tree(tree):
    spec = tiny_spec(devices=(DEVICE,))
    spec["devices"][DEVICE].update(link=None, emulate=EMULATE, label="CPU emulating the A100")
    written = fake_root(tree, spec)
    for run in [r for r in written if not isinstance(r, tuple) and hasattr(r, "file")]:
        path = tree / run.file("metrics.json")
        m = json.loads(path.read_text())
        m.update(drafted_levels_per_cycle=0.0 if run.method == "ar" else 4.0, h2d_per_cycle=3.0, experts_per_token=16,
                 timing_label="emulated A100 (expert execution + link), CPU compute overlapped",
                 device={"target": {"forwards": 100, "overruns": 1 if run.slots == 0 else 0},
                         "drafter": {"forwards": 0 if run.method == "ar" else 400, "overruns": 0}})
        path.write_text(json.dumps(m))
        written[run] = m
    return spec, written


def test_claims_and_proportions_on_an_emulated_device(tree):
    spec, written = emulated_tree(tree)
    runs = {(r.method, r.slots): r for r in written if hasattr(r, "file")}
    md, tables = build(spec, declared(spec), tree / "reports" / "all")
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
    assert props["execution_share"][1] == f"{100 * 16 * 0.6356 / m['ar', 4]['ms_per_cycle']:.1f}%"
    assert props["copy_share"][3] == "–"  # shown beside the paper's, no goal
    checks = rows(tables[f"device-checks/toy/{DEVICE}"])
    assert checks["r2"][1:] == ["0.970", "met"]
    # one overrun in each run without the cache (AR, EAGLE-3, SpecFit) over 6 runs of 100 target forwards
    assert checks["overruns-target"][1:] == ["0.50% (3 of 600)", "met"]
    assert checks["overruns-drafter"][1] == "0.00% (0 of 1600)"
    assert "emulated A100 (expert execution + link), CPU compute overlapped" in md


def test_no_proportions_on_a_link_only_device(tree):
    spec = tiny_spec()
    fake_root(tree, spec)
    _, tables = build(spec, declared(spec), tree / "reports" / "all")
    assert not [t for t in tables if t.startswith("proportions/")] and "claims/toy/cpu-a100link" in tables
