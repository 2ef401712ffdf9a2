"""The report's figures as a reader sees them, on a synthetic run of twenty methods on the emulated A100 (twice the
default config's ten): every figure drawn without a warning, no text or legend off its canvas, no two texts on top
of each other (the `figures` fixture checks each as it is saved); the throughput figures hold every method in its
group with its value, the claims figure every claim that is a ratio in the table's order; the page embeds every
figure file with alt text naming what it shows, and the Markdown twin links the same. The checks themselves are
checked on figures drawn wrong."""

import itertools
import json
import re
import warnings

import pytest
from figure_checks import assert_embedded, layout_problems
from matplotlib.figure import Figure
from report_fakes import EMULATED_DEVICE, emulated_tree, tiny_spec
from report_md import build, rows

from specfit.planning import paths
from specfit.planning.matrix import DecodeRun, report_inputs

# ten more methods beside tiny_spec's ten and the tuned EAGLE-3: other trees, routes and accuracies of the same kinds
MORE = {
    "eagle3-d3": {"kind": "eagle3", "k_max": 7, "max_depth": 3, "top_k_expand": 2},
    "eagle3-wide": {"kind": "eagle3", "k_max": 7, "max_depth": 5, "top_k_expand": 3},
    "specfit-k5": {"kind": "specfit", "k_max": 5, "max_depth": 5, "top_k_expand": 2, "routes": "atlas"},
    "specfit-noisy-80": {"kind": "specfit", "k_max": 7, "max_depth": 5, "top_k_expand": 2, "routes": "noisy",
                         "accuracy": 0.8},
    "specfit-ca-k5": {"kind": "specfit-ca", "k_max": 5, "max_depth": 5, "top_k_expand": 2, "routes": "atlas"},
    "specfit-learned-k5": {"kind": "specfit", "k_max": 5, "max_depth": 5, "top_k_expand": 2, "routes": "learned"},
    "specfit-prefetch-k5": {"kind": "specfit-prefetch", "k_max": 5, "max_depth": 5, "top_k_expand": 2,
                            "routes": "learned"},
    "eagle3-prefetch-atlas": {"kind": "eagle3-prefetch", "k_max": 7, "max_depth": 5, "top_k_expand": 2,
                              "routes": "atlas"},
    "specfit-deep": {"kind": "specfit", "k_max": 7, "max_depth": 6, "top_k_expand": 2, "routes": "atlas"},
}
TEN = ("ar", "eagle3", "specfit", "specfit-noisy", "specfit-ca", "specfit-learned", "specfit-ca-learned",
       "specfit-prefetch", "specfit-prefetch-atlas", "eagle3-prefetch")
TREE = {"max_depth": 3, "top_k_expand": 2, "k_max": 6}


def twenty_methods_spec() -> dict:
    """Summarization (Figure 4's sweep, the claims on its ends) and GSM8K (the noisy-route claim), every method with
    and without the cache, EAGLE-3 and SpecFit at two more slot counts."""
    spec = tiny_spec(methods=TEN, devices=(EMULATED_DEVICE,), workload="summarization")
    spec["methods"] |= {"eagle3-tuned": {"kind": "eagle3-tuned"}, **MORE}
    spec["workloads"]["gsm8k"] = dict(spec["workloads"]["summarization"])
    methods = list(spec["methods"])
    assert len(methods) == 20
    spec["runs"] = [{"models": ["toy"], "devices": [EMULATED_DEVICE], "workloads": ["summarization", "gsm8k"],
                     "methods": methods, "slots": [0, 4]},
                    {"models": ["toy"], "devices": [EMULATED_DEVICE], "workloads": ["summarization"],
                     "methods": ["eagle3", "specfit"], "slots": [2, 3]}]
    return spec


@pytest.fixture()
def twenty(tree):
    spec, written = emulated_tree(tree, twenty_methods_spec())
    for w, slots in itertools.product(spec["workloads"], (0, 4)):
        path = tree / paths.tune("toy", EMULATED_DEVICE, w, "eagle3-tuned", slots)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"chosen": TREE, "trees": [{**TREE, "tps_dec": 1.0}], "question_ids": [403]}))
    out = tree / "reports" / "all"
    _md, tables = build(spec, report_inputs(spec), out)
    return spec, written, out, tables


def test_twenty_methods_each_in_its_group_with_its_value(twenty, figures):
    spec, written, out, tables = twenty
    names = ["toy", EMULATED_DEVICE, *spec["workloads"]]
    alts = assert_embedded(out, names)
    assert {src.removeprefix("figures/").removesuffix(".png") for src in alts} == set(figures) == {
        f"toy-{EMULATED_DEVICE}-{x}" for x in ("summarization-tps", "gsm8k-tps", "summarization-sweep", "claims",
                                               "calibration")}
    assert alts[f"figures/toy-{EMULATED_DEVICE}-gsm8k-tps.png"].startswith(
        "Decode TPS of each method with 95% bootstrap intervals, with expert cache (4 slots) and without expert cache")
    baselines = ["ar", "eagle3", "eagle3-tuned", "eagle3-d3", "eagle3-wide"]  # no routes read
    paper = ["specfit", "specfit-noisy", "specfit-noisy-80"]  # exact and simulated routes, as the paper runs SpecFit
    beyond = [m for m in spec["methods"] if m not in baselines + paper]
    for w in spec["workloads"]:
        texts = figures[f"toy-{EMULATED_DEVICE}-{w}-tps"]
        shown = [t for t in texts if t in spec["methods"]]
        assert shown == baselines + paper + beyond  # the rows, top down, once: the panels share them
        assert {"Baselines", "SpecFit as in the paper", "Beyond the paper", "the paper's a100 decode TPS",
                "With expert cache (4 slots)", "Without expert cache"} <= set(texts)
        values = [t for t in texts if re.fullmatch(r"\d+\.\d\d", t)]  # tick labels print no trailing zero
        expected = [f"{written[DecodeRun('toy', EMULATED_DEVICE, w, m, slots)]['tps_dec']:.2f}"
                    for slots in (4, 0) for m in baselines + paper + beyond]
        assert sorted(values) == sorted(expected)  # a value beside each bar of both panels


def test_the_claims_figure_holds_each_ratio_claim_in_the_tables_order(twenty, figures):
    _spec, _written, out, tables = twenty
    claims = rows(tables[f"claims/toy/{EMULATED_DEVICE}"])
    texts = [" ".join(t.split()) for t in figures[f"toy-{EMULATED_DEVICE}-claims"]]
    ratio_claims = [(key, row) for key, row in claims.items() if not key.startswith(("table5/", "specfit-tuned-"))]
    # 5 ratios per workload, the noisy routes, the sweep; Table 5's and the tuned tree's (with and without the cache)
    assert len(ratio_claims) == 12 and len(claims) == 18
    labels = [t for t in texts if any(t == row[1] or t.startswith("SpecFit's gain over EAGLE-3 grows as the cache")
                                      for _, row in ratio_claims) or t in ("summarization", "gsm8k")]
    expected = []
    for key, row in ratio_claims:
        if row[0] not in expected:
            expected.append(row[0])  # the workload's heading
        expected.append(row[1] if not key.startswith("gain-grows/") else
                        "SpecFit's gain over EAGLE-3 grows as the cache shrinks: the gain without a cache over the "
                        "gain at 4 slots")
    assert labels == expected
    assert {str(row[4]) for row in claims.values()} <= set(texts) | {"confirmed"}  # each verdict's colour named
    assert "the paper's ratio (a100)" in texts
    caption = (out / "report.md").read_text()
    assert ("the claims without a ratio of the paper's (Table 5's gap against its bound, the premise against the tuned "
            "tree, the thesis against a dense cost) are in the table") in caption


def test_the_checks_find_what_a_reader_would_stumble_on():
    """The figure of old: ten methods' legend in one row across a small canvas, labels on top of each other, and a
    layout engine that cannot fit its labels (its warning)."""
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    for j in range(10):
        ax.bar(j, 1.0, label=f"method-{j}")
    ax.legend(ncol=10, loc="upper center")
    ax.text(0.5, 0.5, "8.71")
    ax.text(0.5, 0.5, "8.75")
    problems = layout_problems(fig)
    assert "a legend leaves the canvas" in problems
    assert {"text 'method-0' leaves the canvas", "texts '8.71' and '8.75' overlap"} <= set(problems)
    crowded = Figure(figsize=(1.0, 1.0), layout="tight")
    crowded.subplots().set_ylabel("a label far too large for its canvas", fontsize=40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what layout_problems records
        assert any(p.startswith("warning while drawing") for p in layout_problems(crowded))
