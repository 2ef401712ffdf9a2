"""Beyond the paper: specfit-ca beside AR, EAGLE-3 and the paper's SpecFit per cell (workload × slots), against
the cache-aware cost's goal, and where the time went in the cells that miss it."""

import json
import re

import pytest
from markupsafe import escape
from report_fakes import DEVICE, decode_tps, fake_root, request_tps, tiny_spec, write_requests
from report_md import assert_no_win_inside_a_tie, build, ids, ratio_of, rows, tps_text, x_text

from specfit.planning.matrix import DecodeRun, report_inputs
from specfit.report.page import EMULATED, Estimate, interval_note
from specfit.report.quantities import LATER_KEYS
from specfit.report.scope import Roles
from specfit.report.sections.specfit_ca import TITLE, why
from specfit.report.verdict import Verdict

METHODS = ("ar", "eagle3", "specfit", "specfit-ca")
GOAL = f"specfit-ca/toy/{DEVICE}"
WHY = f"specfit-ca-why/toy/{DEVICE}"
# decode tokens per second (each request ±25%): specfit-ca far ahead with the cache, far behind AR without it
SPEEDS = {("ar", 0): 10, ("eagle3", 0): 6, ("specfit", 0): 6, ("specfit-ca", 0): 2,
          ("ar", 4): 10, ("eagle3", 4): 8, ("specfit", 4): 9, ("specfit-ca", 4): 40,
          ("ar", 2): 8, ("eagle3", 2): 20, ("specfit", 2): 9, ("specfit-ca", 2): 60}


def run_of(method, slots):
    return DecodeRun("toy", DEVICE, "gsm8k", method, slots)


def built(tree, spec):
    out = tree / "reports" / "all"
    md, tables = build(spec, report_inputs(spec), out)
    return md, tables, (out / "index.html").read_text()


def copy_run(tree, written, run, like):
    """``run`` gets the requests of ``like`` (a ratio of exactly 1, a tie), its metrics.json the TPS they give."""
    rows = [dict(r) for r in written["requests", like]]
    written["requests", run] = rows
    written[run].update(tps_dec=decode_tps(rows), tps_req=request_tps(rows))
    write_requests(tree, run, rows)
    (tree / run.file("metrics.json")).write_text(json.dumps(written[run]))


def section(md: str, title: str) -> str:
    return next(s for s in md.split("\n### ")[1:] if s.startswith(title))


def best_of(written, slots):
    return max((run_of(m, slots) for m in ("ar", "eagle3")), key=lambda r: written[r]["tps_dec"])


@pytest.fixture()
def ca(tree):
    spec = tiny_spec(methods=METHODS, slots=(0, 4, 2))
    written = fake_root(tree, spec, speeds=SPEEDS)
    return spec, written, *built(tree, spec)


def test_roles_name_specfit_ca():
    assert Roles.of(tiny_spec(methods=METHODS)).specfit_ca == "specfit-ca"
    assert Roles.of(tiny_spec()).specfit_ca is None


def test_cells_ratios_verdicts_and_the_goal(ca):
    _spec, written, md, tables, html = ca
    t = tables[GOAL]
    assert t.header == ["Workload", "Cache"] + [f"{m} Decode TPS [{EMULATED}]" for m in METHODS] + [
        "Best of ar, eagle3", f"specfit-ca / best (×) [{EMULATED}]", f"specfit-ca / specfit (×) [{EMULATED}]",
        "Goal met"]
    assert t.keys == [("gsm8k", 4), ("gsm8k", 2), ("gsm8k", 0)]
    assert [row[:2] for row in t.rows] == [["gsm8k", "Yes (4)"], ["gsm8k", "Yes (2)"], ["gsm8k", "No"]]
    for row, slots in zip(t.rows, (4, 2, 0)):
        assert row[2:6] == [tps_text(written, run_of(m, slots)) for m in METHODS]
        best = best_of(written, slots)
        assert row[6] == best.method
        first = ratio_of(written, run_of("specfit-ca", slots), best)
        second = ratio_of(written, run_of("specfit-ca", slots), run_of("specfit", slots))
        assert row[7:9] == [x_text(first), x_text(second) + ("" if slots else " (not counted: no cache)")]
        met = first["verdict"] in ("tie", "faster") and (slots == 0 or second["verdict"] == "faster")
        assert row[9] == ("yes" if met else "no")
    assert best_of(written, 2).method == "eagle3" and best_of(written, 4).method == "ar"
    assert [row[9] for row in t.rows] == ["yes", "yes", "no"]
    text = section(md, TITLE)
    assert "Goal met in 2 of 3 cells." in text
    assert "Without the cache (slots 0) only the first part counts" in text
    assert interval_note(0) in text
    assert assert_no_win_inside_a_tie(text) == 6 + 1  # the table's, and the missed cell's sentence
    # right after the throughput section, in the Markdown and in the HTML
    titles = re.findall(r"^### (.+)$", md, re.MULTILINE)
    assert titles[titles.index(TITLE) - 1].startswith("Decode throughput with and without the expert cache")
    assert f"<h3>{TITLE}</h3>" in html
    assert f"<caption>{escape(t.caption)}</caption>" in html
    assert f"<caption>{escape(tables[WHY].caption)}</caption>" in html
    assert escape("Goal met in 2 of 3 cells.") in html


def test_where_the_time_went_in_a_missed_cell(ca):
    _spec, written, md, tables, _html = ca
    t = tables[f"where-the-time-went/toy/{DEVICE}/gsm8k/0"]
    assert t.header == ["Method"] + [f"{h} [{EMULATED}]" for h in (
        "ms/cycle", "Draft ms/cycle", "Host ms/cycle (mean)", "Verify ms/cycle", "Commit ms/cycle")] + [
        "Committed per cycle", f"ms per committed token [{EMULATED}]", "H2D/token", "Cycles that drafted nothing (%)"]
    assert t.keys == [run_of(m, 0) for m in METHODS]
    for run, row in rows(t).items():
        m = written[run]
        ar = run.method == "ar"
        assert row[1:] == [f"{m['ms_per_cycle']:.2f}", "–" if ar else f"{m['draft_ms_per_cycle']:.2f}",
                           f"{m['select_ms_per_cycle']:.2f}", f"{m['verify_ms_per_cycle']:.2f}",
                           f"{m['commit_ms_per_cycle']:.2f}", f"{m['committed_per_cycle']:.2f}",
                           f"{m['ms_per_cycle'] / m['committed_per_cycle']:.2f}", f"{m['h2d_per_token']:.1f}",
                           "–" if ar else f"{100 * m['cycles_without_draft'] / m['cycles']:.1f}"]
    assert ids(tables, "where-the-time-went") == [t.id]
    assert tables[WHY].header == ["Workload", "Cache", "Against", f"Why (from the numbers above) [{EMULATED}]"]
    ca_run, ar = run_of("specfit-ca", 0), run_of("ar", 0)
    e = ratio_of(written, ca_run, ar)
    estimate = Estimate(e["value"], e["low"], e["high"], Verdict(e["verdict"]))
    assert tables[WHY].rows == [["gsm8k", "No", "ar", why("specfit-ca", written[ca_run], "ar", written[ar], True,
                                                           estimate)]]
    sentence = tables[WHY].rows[0][3]
    m, r = written[ca_run], written[ar]
    assert sentence.startswith(f"specfit-ca / ar: {x_text(e)}; its cycle takes {m['ms_per_cycle']:.2f} ms against "
                               f"{r['ms_per_cycle']:.2f} ms")
    assert f"it commits {m['committed_per_cycle']:.2f} tokens per cycle against 1.00" in sentence
    assert f"{100 * m['cycles_without_draft'] / m['cycles']:.0f}% of its cycles drafted nothing" in sentence
    assert "Where the time went, in the cells that miss the goal" in section(md, TITLE)


def test_the_sentence_says_why_from_the_numbers():
    ca = {"ms_per_cycle": 9.3, "draft_ms_per_cycle": 1.5, "select_ms_per_cycle": 0.3, "verify_ms_per_cycle": 7.3,
          "commit_ms_per_cycle": 0.2, "committed_per_cycle": 1.4, "h2d_per_token": 35.2, "cycles": 100,
          "cycles_without_draft": 41}
    ar = {"ms_per_cycle": 5.3, "draft_ms_per_cycle": 0.0, "select_ms_per_cycle": 0.0, "verify_ms_per_cycle": 5.2,
          "commit_ms_per_cycle": 0.05, "committed_per_cycle": 1.0, "h2d_per_token": 20.1, "cycles": 140,
          "cycles_without_draft": 140}
    e = Estimate(0.80, 0.72, 0.88, Verdict.SLOWER)
    assert why("specfit-ca", ca, "ar", ar, True, e) == (
        "specfit-ca / ar: 0.80× [0.72, 0.88] slower; its cycle takes 9.30 ms against 5.30 ms (verify is 2.10 "
        "ms/cycle slower than ar's forward, drafting adds 1.50 ms/cycle, selection is 0.30 ms/cycle slower than "
        "ar's selection, commit is 0.15 ms/cycle slower than ar's commit); it commits 1.40 tokens per cycle against "
        "1.00, 6.64 ms per committed token against 5.30: at its cycle time it would need 1.75 tokens per cycle, or "
        "at its tokens a cycle of 7.42 ms, to match; it copies 35.2 experts per token against 20.1 (more); 41% of "
        "its cycles drafted nothing.")
    # against the paper's SpecFit: a drafting rival's drafting and empty cycles, parts below 2% of its cycle left out
    fit = {**ca, "ms_per_cycle": 9.0, "draft_ms_per_cycle": 1.49, "verify_ms_per_cycle": 7.0,
           "committed_per_cycle": 1.5, "h2d_per_token": 35.0, "cycles_without_draft": 2}
    tie = Estimate(0.97, 0.90, 1.04, Verdict.TIE)
    assert why("specfit-ca", ca, "specfit", fit, False, tie) == (
        "specfit-ca / specfit: 0.97× [0.90, 1.04] tie; its cycle takes 9.30 ms against 9.00 ms (verify is 0.30 "
        "ms/cycle slower than specfit's verify); it commits 1.40 tokens per cycle against 1.50, 6.64 ms per committed "
        "token against 6.00: at its cycle time it would need 1.55 tokens per cycle, or at its tokens a cycle of "
        "8.40 ms, to match; 41% of its cycles drafted nothing (specfit: 2%).")


def test_ties_count_against_the_best_not_against_specfit(tree):
    spec = tiny_spec(methods=METHODS)
    written = fake_root(tree, spec, speeds={**SPEEDS, ("specfit", 4): 40})
    copy_run(tree, written, run_of("specfit-ca", 0), best_of(written, 0))  # no cache: a tie with the best
    copy_run(tree, written, run_of("specfit-ca", 4), run_of("specfit", 4))  # cache: faster than both, tie w/ SpecFit
    md, tables, _ = built(tree, spec)
    cells = {slots: row for (_, slots), row in rows(tables[GOAL]).items()}
    assert cells[0][7] == "1.00× [0.82, 1.22] tie" and cells[0][9] == "yes"
    assert cells[4][7].endswith("faster") and cells[4][8] == "1.00× [0.82, 1.22] tie"
    assert cells[4][9] == "no"
    assert "Goal met in 1 of 2 cells." in md
    why_rows = tables[WHY].rows
    assert [row[:3] for row in why_rows] == [["gsm8k", "Yes (4)", "specfit"]]
    assert why_rows[0][3].startswith("specfit-ca / specfit: 1.00× [0.82, 1.22] tie;")
    assert ids(tables, "where-the-time-went") == [f"where-the-time-went/toy/{DEVICE}/gsm8k/4"]


def test_a_cell_without_requests_is_not_judged_and_older_metrics_show_dashes(tree):
    spec = tiny_spec(methods=METHODS)
    fake_root(tree, spec, speeds=SPEEDS)
    (tree / run_of("specfit-ca", 4).file("requests.parquet")).unlink()
    for method in METHODS:  # metrics.json written before select / commit ms and empty cycles were recorded
        path = tree / run_of(method, 0).file("metrics.json")
        m = json.loads(path.read_text())
        for key in (*LATER_KEYS, "pool_nodes_per_cycle"):
            m.pop(key, None)
        path.write_text(json.dumps(m))
    md, tables, _ = built(tree, spec)
    cells = {slots: row for (_, slots), row in rows(tables[GOAL]).items()}
    assert cells[4][5].endswith("[no interval]")
    assert cells[4][9] == "not judged (no interval: a requests.parquet is missing)"
    assert cells[0][9] == "no"
    text = section(md, TITLE)
    assert "Goal met in 0 of 2 cells. 1 not judged: gsm8k, cache Yes (4): no interval" in text
    assert f"`{run_of('specfit-ca', 4).file('requests.parquet')}`" in text
    for row in tables[f"where-the-time-went/toy/{DEVICE}/gsm8k/0"].rows:
        assert row[3] == "–" and row[5] == "–" and row[9] == "–", row
    assert "absent from metrics.json written before they were recorded" in text


def test_without_specfit_ca_the_report_is_unchanged(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    md, _tables, html = built(tree, spec)
    assert TITLE not in md and "specfit-ca" not in md and TITLE not in html
    titles = re.findall(r"^### (.+)$", md, re.MULTILINE)
    for run in written:  # the new metrics.json keys leave every other section as it was
        if isinstance(run, DecodeRun):
            path = tree / run.file("metrics.json")
            m = json.loads(path.read_text())
            path.write_text(json.dumps({k: v for k, v in m.items() if k not in LATER_KEYS}))
    again, _, _ = built(tree, spec)

    def undated(text):
        return re.sub(r"^- \*\*Date \(UTC\)\*\*: .*$", "", text, flags=re.MULTILINE)

    assert undated(again) == undated(md)
    assert re.findall(r"^### (.+)$", again, re.MULTILINE) == titles
    # throughput, then the counters right after it, as before (no claims on a link-only device: the wall clock)
    assert titles[0].startswith("Decode throughput") and "The paper's claims, confronted" not in titles
    assert titles[1].startswith("Verification and transfer counters")


def test_no_section_on_a_device_where_specfit_ca_does_not_run(tree):
    spec = tiny_spec(methods=METHODS)
    spec["runs"][0]["methods"] = ["ar", "eagle3", "specfit"]
    fake_root(tree, spec)
    md, _, _ = built(tree, spec)
    assert TITLE not in md
