"""Beyond the paper: learned routes. Exact, learned and simulated noisy routes side by side per cell,
its four goals, the predictor's own table, and a missing predictor metrics.json."""

import json
import math
import re

import pytest
from markupsafe import escape
from report_fakes import DEVICE, decode_tps, fake_root, request_tps, tiny_spec, write_requests
from report_md import assert_no_win_inside_a_tie, build, missing_inputs, ratio_of, rows, tps_text, x_text

from specfit.errors import SpecFitError
from specfit.planning import paths
from specfit.planning.matrix import DecodeRun, report_inputs
from specfit.report.inputs import PREDICTOR_REQUIRED, load_inputs, predictor_metrics
from specfit.report.page import EMULATED, interval_note
from specfit.report.sections.learned_routes import TITLE
from specfit.results.intervals import CPU_SPREAD

METHODS = ("ar", "eagle3", "specfit", "specfit-noisy", "specfit-learned")
SIDE = f"learned-routes/toy/{DEVICE}"
GOALS = f"learned-routes-goals/toy/{DEVICE}"
PREDICTOR = f"route-predictor/toy/{DEVICE}"
# decode tokens per second: with the cache SpecFit well ahead of EAGLE-3 (the learned run copies SpecFit's requests:
# a tie); without it SpecFit behind EAGLE-3 and the learned run far behind SpecFit
SPEEDS = {("ar", 0): 10, ("eagle3", 0): 10, ("specfit", 0): 6, ("specfit-learned", 0): 2,
          ("ar", 4): 10, ("eagle3", 4): 8, ("specfit", 4): 40, ("specfit-noisy", 4): 30}
PREDICTOR_METRICS = {
    "route_accuracy": 0.7123, "recall_per_layer": [0.81, 0.55, 0.77], "root_accuracy": 0.8, "train_accuracy": 0.75,
    "chance_accuracy": 0.125, "train_requests": 42, "validation_requests": 8, "train_nodes": 6828,
    "validation_nodes": 1216, "hidden_size": 128, "num_layers": 3, "num_experts": 32, "top_k": 4, "params": 24672,
    "flop_per_node": 49152, "us_per_pool": 30.25, "pool_nodes_timed": 19, "torch_device": "cpu",
    "training": {"steps": 1500, "seconds": 1.1, "loss": 1.51, "threads": 2}, "sha256": "0" * 64}
SHARES = {4: 1.2345, 0: 7.5}  # the predictor's share of cycle time per slot count: goal 4 missed without the cache


def run_of(method, slots):
    return DecodeRun("toy", DEVICE, "gsm8k", method, slots)


def learned_spec():
    spec = tiny_spec(methods=METHODS)
    spec["runs"] = [{**spec["runs"][0], "methods": [m for m in METHODS if m != "specfit-noisy"]},
                    {**spec["runs"][0], "methods": ["specfit-noisy"], "slots": [4]}]
    return spec


def write_predictor(tree, metrics=PREDICTOR_METRICS):
    path = tree / predictor_metrics("toy")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics))


def set_metrics(tree, written, run, **changes):
    written[run].update(changes)
    (tree / run.file("metrics.json")).write_text(json.dumps(written[run]))


def copy_run(tree, written, run, like):
    """``run`` gets the requests of ``like`` (a ratio of exactly 1, a tie), its metrics.json the TPS they give."""
    rows = [dict(r) for r in written["requests", like]]
    written["requests", run] = rows
    write_requests(tree, run, rows)
    set_metrics(tree, written, run, tps_dec=decode_tps(rows), tps_req=request_tps(rows))


def fake_learned(tree, spec):
    written = fake_root(tree, spec, speeds=SPEEDS)
    copy_run(tree, written, run_of("specfit-learned", 4), run_of("specfit", 4))
    for slots, share in SHARES.items():
        run = run_of("specfit-learned", slots)
        cycles = written[run]["cycles"]
        set_metrics(tree, written, run, route_predictor={"seconds": 0.0123, "nodes": 3 * cycles, "cycles": cycles,
                                                         "share_of_cycle_time_pct": share})
    return written


def built(tree, spec, inputs=None):
    out = tree / "reports" / "all"
    md, tables = build(spec, report_inputs(spec) if inputs is None else inputs, out)
    return md, tables, (out / "index.html").read_text()


def section(md: str) -> str:
    return next(s for s in md.split("\n### ")[1:] if s.startswith(TITLE))


@pytest.fixture()
def learned(tree):
    spec = learned_spec()
    written = fake_learned(tree, spec)
    write_predictor(tree)
    return spec, written, *built(tree, spec)


def test_exact_learned_and_noisy_side_by_side(learned):
    _spec, written, _md, tables, _html = learned
    t = tables[SIDE]
    assert t.caption == f"Exact vs learned vs simulated noisy routes, toy / {DEVICE} [{EMULATED}]"
    assert t.header == ["Workload", "Cache", "Method", "Routes", "Route accuracy", "Draft nodes per cycle",
                        "Committed per cycle", f"Decode TPS [{EMULATED}]", f"/ specfit (×) [{EMULATED}]",
                        f"Predictor share of cycle time (%) [{EMULATED}]"]
    assert [row[:5] for row in t.rows] == [
        ["gsm8k", "Yes (4)", "specfit", "exact (atlas)", "100% (exact)"],
        ["gsm8k", "Yes (4)", "specfit-learned", "learned", "71.2% (held-out)"],
        ["gsm8k", "Yes (4)", "specfit-noisy", "noisy (simulated)", "60% (configured)"],
        ["gsm8k", "Yes (4)", "eagle3", "none (full draft tree)", "–"],
        ["gsm8k", "No", "specfit", "exact (atlas)", "100% (exact)"],
        ["gsm8k", "No", "specfit-learned", "learned", "71.2% (held-out)"],
        ["gsm8k", "No", "eagle3", "none (full draft tree)", "–"]]  # no noisy run without the cache
    assert t.keys == [run_of(row[2], 4 if row[1] == "Yes (4)" else 0) for row in t.rows]
    for run, row in rows(t).items():
        slots, m = run.slots, written[run]
        assert row[5:8] == [f"{m['draft_nodes_per_cycle']:.2f}", f"{m['committed_per_cycle']:.2f}",
                            tps_text(written, run)]
        atlas = run_of("specfit", slots)
        assert row[8] == ("–" if row[2] in ("specfit", "eagle3") else x_text(ratio_of(written, run, atlas)))
        assert row[9] == (f"{SHARES[slots]:.2f}" if row[2] == "specfit-learned" else "–")
    half = math.exp(1.959964 * CPU_SPREAD)  # the same timings: only the spread between CPU-timed processes
    assert t.rows[1][8] == f"1.00× [{1 / half:.2f}, {half:.2f}] tie" == "1.00× [0.82, 1.22] tie"


def test_goals_per_cell_and_the_verdict(learned):
    _spec, written, md, tables, html = learned
    t = tables[GOALS]
    assert t.caption == f"specfit-learned against their goals per cell, toy / {DEVICE} [{EMULATED}]"
    assert t.header == ["Workload", "Cache", f"specfit-learned / specfit (×) [{EMULATED}]", "≥ 98% of specfit",
                      f"specfit / eagle3 (×) [{EMULATED}]", f"specfit-learned / eagle3 (×) [{EMULATED}]",
                      "Faster than eagle3 where specfit is", f"Predictor share of cycle time (%) [{EMULATED}]",
                      "≤ 5% of a cycle"]
    learned4, learned0 = run_of("specfit-learned", 4), run_of("specfit-learned", 0)
    slower = ratio_of(written, learned0, run_of("specfit", 0))
    atlas_eagle0 = ratio_of(written, run_of("specfit", 0), run_of("eagle3", 0))
    assert slower["verdict"] == "slower" and atlas_eagle0["verdict"] == "slower"
    assert t.keys == [("gsm8k", 4), ("gsm8k", 0)]
    assert t.rows == [
        ["gsm8k", "Yes (4)", "1.00× [0.82, 1.22] tie", "yes (tie within the interval)",
         x_text(ratio_of(written, run_of("specfit", 4), run_of("eagle3", 4))),
         x_text(ratio_of(written, learned4, run_of("eagle3", 4))), "yes", "1.23", "yes"],
        ["gsm8k", "No", x_text(slower), "no", x_text(atlas_eagle0),
         x_text(ratio_of(written, learned0, run_of("eagle3", 0))),
         "not required (exact routes slower than EAGLE-3)", "7.50", "no"]]
    text = section(md)
    assert "The learned routes' goals, toy / cpu-a100link: 2 of 4 met; not met: goals 2 and 4." in text
    assert ("Goal 1, route accuracy ≥ 60%: met. Held-out route accuracy 71.2% over 1,216 draft nodes of 8 held-out "
            "requests (chance 12.5%); per layer: layer 0 81.0%, layer 1 55.0%, layer 2 77.0%; below 60% in layer 1."
            in text)
    assert ("Goal 2, decode TPS ≥ 98% of SpecFit with exact routes (specfit): not met. Met in 1 of 2 cells, 1 of "
            "them by a tie within the interval (a tie counts as met); missed in: gsm8k, cache No." in text)
    assert ("Goal 3, faster than eagle3 wherever specfit is (a tie does not count): met. Met in 1 of 1 cells that "
            "require it (the other 1 do not: there specfit is not faster than eagle3)." in text)
    assert (f"Goal 4, predictor time ≤ 5% of a cycle: not met. Met in 1 of 2 cells; largest share 7.50% "
            f"[{EMULATED}]; missed in: gsm8k, cache No." in text)
    assert interval_note(0) in text
    assert assert_no_win_inside_a_tie(text) == 3 + 6  # learned and noisy over exact routes; the goals table
    titles = re.findall(r"^### (.+)$", md, re.MULTILINE)
    assert titles[titles.index(TITLE) - 1].startswith("Decode throughput with and without the expert cache")
    assert f"<h3>{TITLE}</h3>" in html
    assert f"<caption>{escape(t.caption)}</caption>" in html


def test_the_predictor_table(learned):
    _spec, written, md, tables, _html = learned
    t = tables[PREDICTOR]
    assert t.caption == f"The route predictor of toy ({predictor_metrics('toy')}), and its cost at Qwen3-30B-A3B's size"
    assert t.header == ["Quantity", "toy (hidden 128, 3 MoE layers, 32 experts, top-4)",
                      "At Qwen3-30B-A3B's size (hidden 2048, 48 MoE layers, 128 experts)",
                      "Paper's estimate (section 4.6)"]
    by = {key: row[1:] for key, row in rows(t).items()}
    assert by["route_accuracy"] == ["71.2%", "–", "60% (simulated predictor)"]
    assert by["recall_per_layer"] == ["0: 81.0%, 1: 55.0%, 2: 77.0%", "–", "–"]
    # Qwen3-30B-A3B: (2 · 2048 + 1) · 48 · 128 parameters, 2 · 4096 · 48 · 128 FLOP; the paper's 12.6M, 25 MFLOP
    assert by["params"] == ["24,672 (0.025M)", "25,171,968 (25.2M)", "12.6M"]
    assert by["flop_per_node"] == ["49,152 (0.0492 MFLOP)", "50,331,648 (50.3 MFLOP)", "25 MFLOP"]
    assert rows(t)["us_per_pool"] == ["µs per pool of 19 nodes (on cpu: compute only, no link)", "30.2", "–", "–"]
    per_cycle = sorted(1e3 * 0.0123 / written[run_of("specfit-learned", s)]["cycles"] for s in (0, 4))
    assert rows(t)["ms_per_cycle"] == [f"Predictor ms per decode cycle in the {DEVICE} runs [{EMULATED}]",
                                       f"{per_cycle[0]:.3f} – {per_cycle[1]:.3f}", "–", "0.1–0.2 (added ms per cycle)"]
    assert by["training"][0].startswith("1500 steps, 1.1 s on cpu (2 threads), final loss 1.510; 42 requests")
    text = section(md)
    assert "2.0× the paper's estimate of a linear head from the hidden state alone (12.6M parameters" in text
    assert "Its µs per pool is plain cpu compute, timed apart from any link" in text
    assert not missing_inputs(text)


@pytest.mark.parametrize("declare", [True, False])
def test_a_missing_predictor_metrics_file_is_named(tree, declare):
    spec = learned_spec()
    fake_learned(tree, spec)  # no predictor written
    inputs = report_inputs(spec)
    assert inputs["predictor"] == [paths.predictor("toy")]
    if not declare:  # on disk but not declared: not read
        write_predictor(tree)
        inputs["predictor"] = []
    md, tables, _ = built(tree, spec, inputs)
    text = section(md)
    assert missing_inputs(text) == ["data/predictor/toy/metrics.json"]
    assert "Goal 1, route accuracy ≥ 60%: not judged. data/predictor/toy/metrics.json is missing." in text
    assert "not judged: goal 1" in text
    assert [row[4] for run, row in rows(tables[SIDE]).items() if run.method == "specfit-learned"] == ["–", "–"]
    assert PREDICTOR not in tables


def test_an_older_learned_run_without_predictor_time_is_not_judged(tree):
    spec = learned_spec()
    written = fake_learned(tree, spec)
    write_predictor(tree)
    run = run_of("specfit-learned", 0)
    written[run].pop("route_predictor")
    set_metrics(tree, written, run)
    md, tables, _ = built(tree, spec)
    assert rows(tables[GOALS])["gsm8k", 0][7:] == ["–", "not judged (its metrics.json has no route_predictor)"]
    assert ("Goal 4, predictor time ≤ 5% of a cycle: not judged. Met in 1 of 2 cells; largest share 1.23% "
            f"[{EMULATED}]; not judged in: gsm8k, cache No (its metrics.json has no route_predictor)." in md)


def test_predictor_metrics_are_read_from_the_declared_folder_and_checked(tree):
    spec = learned_spec()
    fake_learned(tree, spec)
    write_predictor(tree)
    assert load_inputs(spec, report_inputs(spec)).predictor == {"toy": PREDICTOR_METRICS}
    write_predictor(tree, {k: v for k, v in PREDICTOR_METRICS.items() if k != "us_per_pool"})
    with pytest.raises(SpecFitError, match="lacks us_per_pool"):
        load_inputs(spec, report_inputs(spec))
    assert "us_per_pool" in PREDICTOR_REQUIRED


def test_without_a_learned_method_there_is_no_section(tree):
    spec = tiny_spec(methods=("ar", "eagle3", "specfit", "specfit-noisy"))
    fake_root(tree, spec)
    assert report_inputs(spec)["predictor"] == []
    md, _, html = built(tree, spec)
    assert TITLE not in md and TITLE not in html and predictor_metrics("toy") not in md
