"""Beyond the paper: the prefetching methods per cell (workload × slots) beside their selves without
prefetch, specfit-ca, EAGLE-3 and AR, against its goal, and what their prefetches did."""

import json

import pytest
from report_fakes import DEVICE, decode_tps, fake_root, request_tps, tiny_spec, write_requests
from report_md import build, ids, ratio_of, rows, tps_text, x_text

from specfit.planning.matrix import DecodeRun, report_inputs
from specfit.report.page import EMULATED
from specfit.report.sections.prefetch import RATIOS, ROLES, TITLE

METHODS = ("ar", "eagle3", "specfit", "specfit-ca", "specfit-ca-learned", "specfit-prefetch", "specfit-prefetch-atlas",
           "eagle3-prefetch")
BY_ROLE = {"prefetch": "specfit-prefetch", "self": "specfit-ca-learned", "oracle": "specfit-prefetch-atlas",
           "specfit-ca": "specfit-ca", "eagle3-prefetch": "eagle3-prefetch", "eagle3": "eagle3", "ar": "ar"}
PREFETCHING = ("specfit-prefetch", "specfit-prefetch-atlas", "eagle3-prefetch")
GOAL, TIME = f"prefetch/toy/{DEVICE}", f"prefetch-time/toy/{DEVICE}"
# decode tokens per second (each request ±25%): with the cache specfit-prefetch far ahead of every rival
SPEEDS = {("ar", 4): 10, ("eagle3", 4): 12, ("specfit-ca", 4): 14, ("specfit-ca-learned", 4): 13,
          ("specfit-prefetch", 4): 60, ("specfit-prefetch-atlas", 4): 70, ("eagle3-prefetch", 4): 11,
          ("ar", 0): 10, ("eagle3", 0): 6, ("specfit-ca", 0): 7, ("specfit-ca-learned", 0): 7,
          ("specfit-prefetch", 0): 7, ("specfit-prefetch-atlas", 0): 7, ("eagle3-prefetch", 0): 6}


def run_of(method, slots):
    return DecodeRun("toy", DEVICE, "gsm8k", method, slots)


def counters(tree, written, run, issued, used, evicted, hidden_ms, stall_s):
    """A prefetching run's metrics.json gets the engine's prefetch counters and an emulated device's copy stall."""
    written[run].update(prefetch={"issued": issued, "used": used, "evicted_unused": evicted, "idle": 0,
                                  "hidden_ms": hidden_ms}, device={"copy_stall_s": stall_s},
                        drafted_levels_per_cycle=2.5)
    (tree / run.file("metrics.json")).write_text(json.dumps(written[run]))


def report(tree, spec, written):
    out = tree / "reports" / "all"
    return build(spec, report_inputs(spec), out)


@pytest.fixture()
def pre(tree):
    spec = tiny_spec(methods=METHODS, slots=(0, 4))
    written = fake_root(tree, spec, speeds=SPEEDS)
    for slots in (0, 4):
        for n, method in enumerate(PREFETCHING):
            counters(tree, written, run_of(method, slots), issued=40 * slots + n, used=30 * slots, evicted=slots,
                     hidden_ms=12.5 * slots, stall_s=0.25 + n)
    return spec, written, *report(tree, spec, written)


def test_cells_ratios_and_the_goal(pre):
    _spec, written, md, tables = pre
    t = tables[GOAL]
    assert t.keys == [("gsm8k", 4), ("gsm8k", 0)]
    assert t.header[:2] == ["Workload", "Cache"]
    assert t.header[2:2 + len(ROLES)] == [f"{BY_ROLE[r]} Decode TPS [{EMULATED}]" for r in ROLES]
    assert t.header[-3:] == ["Best of ar, eagle3, eagle3-prefetch", f"specfit-prefetch / best (×) [{EMULATED}]",
                             "Goal met"]
    for (_, slots), row in rows(t).items():
        assert row[2:2 + len(ROLES)] == [tps_text(written, run_of(BY_ROLE[r], slots)) for r in ROLES]
        ratios = row[2 + len(ROLES):2 + len(ROLES) + len(RATIOS)]
        assert ratios == [x_text(ratio_of(written, run_of(BY_ROLE[a], slots), run_of(BY_ROLE[b], slots)))
                          for a, b, _ in RATIOS.values()]
        best = max(("ar", "eagle3", "eagle3-prefetch"), key=lambda m: written[run_of(m, slots)]["tps_dec"])
        assert row[-3] == best
        assert row[-2] == x_text(ratio_of(written, run_of("specfit-prefetch", slots), run_of(best, slots)))
    assert rows(t)["gsm8k", 4][-1] == "yes"
    assert rows(t)["gsm8k", 0][-1] == "not required (no cache to prefetch into)"
    text = md.split(f"### {TITLE}")[1].split("\n### ")[0]
    assert "Met in 1 of 1 cells with the cache." in text
    assert "Table 5 under the prefetching cost is in the theory section, on the pools of specfit-prefetch-atlas" in text


def test_a_tie_with_its_self_misses_the_goal(tree):
    spec = tiny_spec(methods=METHODS, slots=(0, 4))
    speeds = {**SPEEDS, ("specfit-prefetch", 4): 13}
    written = fake_root(tree, spec, speeds=speeds)
    same = [dict(r) for r in written["requests", run_of("specfit-ca-learned", 4)]]  # a ratio of exactly 1: a tie
    run = run_of("specfit-prefetch", 4)
    written["requests", run] = same
    written[run].update(tps_dec=decode_tps(same), tps_req=request_tps(same))
    write_requests(tree, run, same)
    (tree / run.file("metrics.json")).write_text(json.dumps(written[run]))
    _md, tables = report(tree, spec, written)
    row = rows(tables[GOAL])["gsm8k", 4]
    assert "1.00× [" in row[2 + len(ROLES)] and row[2 + len(ROLES)].endswith(" tie")  # prefetch alone: a tie
    assert row[-1] == "no"


def test_where_the_time_went_and_what_the_prefetches_did(pre):
    _spec, written, _md, tables = pre
    t = tables[TIME]
    assert "Precision (used / prefetched)" in t.header and f"Copy stall ms/cycle [{EMULATED}]" in t.header
    assert set(t.keys) == {run_of(BY_ROLE[r], s) for r in ROLES if r != "ar" for s in (0, 4)}
    col = {h: j for j, h in enumerate(t.header)}
    for run, row in rows(t).items():
        m = written[run]
        assert row[col["Method"]] == run.method
        assert row[col[f"ms/cycle [{EMULATED}]"]] == f"{m['ms_per_cycle']:.2f}"
        if run.method in PREFETCHING:
            p, cycles = m["prefetch"], m["cycles"]
            assert row[col["Prefetched per cycle"]] == f"{p['issued'] / cycles:.2f}"
            assert row[col["Precision (used / prefetched)"]] == (f"{p['used'] / p['issued']:.3f}" if p["issued"]
                                                                 else "–")
            assert row[col[f"Copy ms hidden per cycle [{EMULATED}]"]] == f"{p['hidden_ms'] / cycles:.2f}"
            assert row[col[f"Copy stall ms/cycle [{EMULATED}]"]] == f"{1e3 * m['device']['copy_stall_s'] / cycles:.2f}"
        else:  # no prefetch counters and no emulated device in its metrics.json
            assert row[col["Prefetched per cycle"]] == "–" and row[col[f"Copy stall ms/cycle [{EMULATED}]"]] == "–"


def test_no_section_without_a_prefetching_method(built):
    _spec, _written, _out, tables = built
    assert ids(tables, "prefetch") == [] and ids(tables, "prefetch-time") == []


def test_learned_routes_section_keeps_to_the_papers_specfit(pre):
    _spec, _written, _md, tables = pre
    assert ids(tables, "learned-routes") == []  # no specfit with learned routes here: the prefetching ones are not it
