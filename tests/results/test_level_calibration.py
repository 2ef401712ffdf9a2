"""Commit probabilities against acceptance per level (`level_calibration`), on cycles written by hand, and the runs
whose cycles the report reads for it (`levelled_runs`)."""

from pathlib import Path

import pytest

from specfit.planning.config import SCHEMA, load_config
from specfit.planning.matrix import levelled_runs, report_inputs
from specfit.results.acceptance import level_calibration

ROOT = Path(__file__).resolve().parents[2]

# A pool: root 0; level 1: nodes 1 (p 0.6) and 2 (p 0.3); level 2: node 3 under 1 (path p 0.3), node 4 under 2.
POOL = {"pool_prob": [1.0, 0.6, 0.3, 0.3, 0.15], "pool_parent": [-1, 0, 0, 1, 2], "pool_level": [0, 1, 1, 2, 2]}


def test_each_level_counts_the_verified_nodes_whose_parent_was_committed():
    cycles = [
        {**POOL, "selected": [0, 1, 2, 3, 4], "accepted_path": [1, 3]},  # 1 then 3 committed; 4's parent was not
        {**POOL, "selected": [0, 1, 3], "accepted_path": []},  # 1 rejected: 3 is no trial
    ]
    levels = level_calibration(cycles)
    assert sorted(levels) == [1, 2]
    n, predicted, committed = levels[1]
    assert n == 3  # nodes 1 and 2 of the first cycle, node 1 of the second
    assert predicted == pytest.approx((0.6 + 0.3 + 0.6) / 3)
    assert committed == pytest.approx(1 / 3)
    assert levels[2] == (1, pytest.approx(0.5), 1.0)  # node 3 of the first cycle: 0.3 / 0.6, committed


def test_no_cycles_no_levels_and_no_trial_under_a_parent_of_probability_zero():
    assert level_calibration([]) == {}
    cycle = {"pool_prob": [1.0, 0.0, 0.0], "pool_parent": [-1, 0, 1], "pool_level": [0, 1, 2], "selected": [0, 1, 2],
             "accepted_path": [1, 2]}  # node 1 predicted impossible, committed all the same: node 2 has no conditional
    assert level_calibration([cycle]) == {1: (1, 0.0, 1.0)}


def test_the_report_reads_the_cycles_of_sampled_runs_and_their_greedy_twins_only():
    default = load_config(ROOT / "config.yaml", ROOT / SCHEMA, check_files=False)
    assert levelled_runs(default) == [] and report_inputs(default)["cycles"] == []
    config = load_config(ROOT / "config.yaml", ROOT / SCHEMA, ROOT / "config.sampling.yaml", check_files=False)
    runs = levelled_runs(config)
    assert {r.workload for r in runs} == {"summarization", "gsm8k", "summarization-t1", "gsm8k-t1",
                                          "summarization-t1-rejection", "gsm8k-t1-rejection"}
    assert all(r.method != "ar" for r in runs) and any(r.method == "eagle3" for r in runs)
    assert report_inputs(config)["cycles"] == [r.file("cycles.parquet") for r in runs]
