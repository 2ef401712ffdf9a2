"""Beyond the paper: the resident section (every expert in memory) on fake runs of two resident devices that differ
in their gather alone: its table, its claims with their verdicts, and the gather table's ratios."""

import json

import pytest
from report_fakes import decode_tps, fake_root, request_tps, tiny_spec, write_requests
from report_md import build, ratio_of, rows, x_text

from specfit.planning import paths
from specfit.planning.matrix import DecodeRun, report_inputs
from specfit.report.sections.resident import TITLE
from specfit.report.verdict import Verdict

PAIR, DISTINCT = "cpu-m5max-pair", "cpu-m5max-distinct"
METHODS = ("ar", "eagle3", "eagle3-tuned", "specfit", "specfit-ca")
M5MAX = {"name": "M5 Max", "widths": [1, 2, 3, 5, 8], "ms": [8.47, 13.49, 15.64, 20.67, 28.13], "moe_layers": 23,
         "experts": 128, "experts_per_token": 6, "draft_share": 0.068}
TREE = {"max_depth": 3, "top_k_expand": 2, "k_max": 6}
# decode tokens per second (each request ±25%): SpecFit far ahead of AR and of the tuned EAGLE-3 on the distinct
# gather; on the pair gather far behind AR (the claim "never slower" is refuted there)
SPEEDS = {PAIR: {"ar": 10, "eagle3": 8, "eagle3-tuned": 11, "specfit": 3, "specfit-ca": 9},
          DISTINCT: {"ar": 10, "eagle3": 12, "eagle3-tuned": 14, "specfit": 60, "specfit-ca": 40}}


def resident_spec() -> dict:
    spec = tiny_spec(methods=METHODS[:2] + METHODS[3:], slots=(32,), devices=(PAIR, DISTINCT))
    spec["methods"]["eagle3-tuned"] = {"kind": "eagle3-tuned"}
    spec["runs"][0]["methods"] = list(METHODS)
    for device, gather in ((PAIR, "pair"), (DISTINCT, "distinct")):
        entry = spec["devices"][device]
        entry.update(link=None, resident={**M5MAX, "gather": gather}, label=f"resident ({gather})")
    spec["models"]["toy"]["main_slots"] = {PAIR: 32, DISTINCT: 32}
    return spec


@pytest.fixture()
def resident(tree):
    spec = resident_spec()
    written = fake_root(tree, spec, speeds={})
    for run in [r for r in written if isinstance(r, DecodeRun)]:  # the speeds above, by device
        rng_rows = written["requests", run]
        speed = SPEEDS[run.device][run.method]
        for row in rng_rows:
            decode = row["t_request_s"] - row["t_prefill_s"]
            row["t_request_s"] = row["t_prefill_s"] + decode * (written[run]["tps_dec"] / speed)
        written[run].update(tps_dec=decode_tps(rng_rows), tps_req=request_tps(rng_rows),
                            verify_widths={"1": 3, "2": 1} if run.method != "ar" else {"1": 4})
        write_requests(tree, run, rng_rows)
        (tree / run.file("metrics.json")).write_text(json.dumps(written[run]))
    for device in (PAIR, DISTINCT):
        path = tree / paths.tune("toy", device, "gsm8k", "eagle3-tuned", 32)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"chosen": TREE, "trees": [{**TREE, "tps_dec": 1.0}], "question_ids": [403]}))
    md, tables = build(spec, report_inputs(spec), tree / "reports" / "all")
    return spec, written, md, tables


def run_of(device, method):
    return DecodeRun("toy", device, "gsm8k", method, 32)


def test_the_section_lists_every_run_with_its_tree_and_widths(resident):
    spec, written, md, tables = resident
    assert TITLE in md
    table = tables["resident/toy"]
    by_run = rows(table)
    assert set(by_run) == {run_of(d, m) for d in (PAIR, DISTINCT) for m in METHODS}
    header = table.header
    tuned = by_run[run_of(PAIR, "eagle3-tuned")]
    # the fake grid holds the chosen tree alone: at its edge in both
    assert tuned[header.index("Tree")] == ("depth 3, width 2, k 6 (tuned on 1 questions; the grid's largest depth and "
                                          "width)")
    assert by_run[run_of(PAIR, "eagle3")][header.index("Tree")] == "depth 5, width 2, k 7"
    assert by_run[run_of(PAIR, "ar")][header.index("Cycles by verify width (%)")] == "1: 100"
    assert by_run[run_of(PAIR, "specfit")][header.index("Cycles by verify width (%)")] == "1: 75, 2: 25"
    width = written[run_of(PAIR, "specfit")]["draft_nodes_per_cycle"] + 1
    assert by_run[run_of(PAIR, "specfit")][header.index("Verify width, mean")] == f"{width:.2f}"
    gather = tables["resident-gather/toy"]
    pair_row = rows(gather)[run_of(PAIR, "specfit"), run_of(DISTINCT, "specfit")]
    assert pair_row[-1] == x_text(ratio_of(written, run_of(DISTINCT, "specfit"), run_of(PAIR, "specfit")))


def test_a_resident_devices_own_sections_say_so(resident):
    """Its throughput and counters sections name the regime: no cache to be without, nothing copied."""
    _spec, _written, md, _tables = resident
    assert md.count("### Decode throughput, every expert resident") == 2
    assert md.count("### Verification counters, every expert resident (nothing is copied)") == 2
    assert "with and without the expert cache" not in md and "Verification and transfer counters" not in md


def test_the_claims_follow_the_intervals(resident):
    _spec, written, _md, tables = resident
    claims = rows(tables["resident-claims/toy"])
    header = tables["resident-claims/toy"].header
    verdict, this = header.index("Verdict"), next(i for i, h in enumerate(header) if h.startswith("This run"))
    # SpecFit at 3 tok/s against AR's 10 on the pair gather: slower in one cell, so "never slower" is refuted
    never = claims["specfit-never-slower-than-ar"]
    assert never[verdict] == str(Verdict.REFUTED)
    assert never[this].startswith("worst pair gather, drafter 0.068, gsm8k: ")
    e = ratio_of(written, run_of(PAIR, "specfit"), run_of(PAIR, "ar"))
    assert x_text(e) in never[this]
    # against the tuned tree: slower on the pair gather, faster on the distinct one: refuted
    assert claims["specfit-faster-than-eagle3-tuned"][verdict] == str(Verdict.REFUTED)
    # with a batched gather SpecFit is 6x AR: confirmed
    assert claims["batched-gather-specfit-over-ar"][verdict] == str(Verdict.CONFIRMED)


def test_a_claim_over_cells_reads_every_cells_interval():
    """Never slower: one slower cell refutes it, ties do not; always faster: all faster confirms, one slower refutes,
    a tie leaves it a tie; without any interval neither is judged."""
    from specfit.report.page import Estimate
    from specfit.report.sections.resident import always_faster, never_slower

    def e(v):
        return Estimate(1.0, 0.9, 1.1, v)

    faster, tie, slower = e(Verdict.FASTER), e(Verdict.TIE), e(Verdict.SLOWER)
    assert never_slower([faster, tie]) == Verdict.CONFIRMED and never_slower([faster, slower]) == Verdict.REFUTED
    assert always_faster([faster, faster]) == Verdict.CONFIRMED and always_faster([faster, tie]) == Verdict.TIE
    assert always_faster([faster, tie, slower]) == Verdict.REFUTED
    assert never_slower([None]) == always_faster([None]) == Verdict.NOT_JUDGED


def test_the_claims_figure_shows_every_cell_under_its_claim(resident, figures):
    """Across the resident devices: each claim in the table's order, each cell's ratio under it, the tuned EAGLE-3
    among them; and the tuned EAGLE-3 in each device's throughput figure like any method."""
    _spec, _written, md, tables = resident
    texts = [" ".join(t.split()) for t in figures["toy-resident-claims"]]
    claims = tables["resident-claims/toy"]
    cells = {"distinct": "distinct gather, drafter 0.068, gsm8k", "pair": "pair gather, drafter 0.068, gsm8k"}
    expected = []
    for key, row in rows(claims).items():
        expected += [row[0], *([cells["distinct"]] if key.startswith("batched-gather") else cells.values())]
    assert [t for t in texts if t in expected] == expected
    assert "SpecFit is faster than EAGLE-3 at the best fixed tree (tuned)" in expected
    assert {"confirmed", "refuted", "the thread's projection"} <= set(texts)
    assert "![Claims with experts resident, toy, across devices: each cell's ratio" in md
    for device in (PAIR, DISTINCT):
        assert [t for t in figures[f"toy-{device}-gsm8k-tps"] if t in METHODS] == ["ar", "eagle3", "eagle3-tuned",
                                                                                   "specfit", "specfit-ca"]
