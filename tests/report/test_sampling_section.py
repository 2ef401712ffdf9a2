"""The sampling section's pairing of workloads (greedy twin, rejection twin) and each run's stated guarantee."""

import pyarrow as pa
import pyarrow.parquet as pq
from report_fakes import EMULATED_DEVICE, emulated_tree, tiny_spec
from report_md import build, rows

from specfit.planning.matrix import levelled_runs, report_inputs
from specfit.report.sections.sampling import guarantee
from specfit.speculative.sampling import Sampling, twin

QUESTIONS = {"question_ids": [1, 2, 3], "limit_tokens": 512, "max_new_tokens": 128}
SPEC = {"workloads": {
    "gsm8k": dict(QUESTIONS),
    "other": {**QUESTIONS, "question_ids": [4, 5]},
    "gsm8k-t1": {**QUESTIONS, "temperature": 1.0},
    "gsm8k-t1-rejection": {**QUESTIONS, "temperature": 1.0, "sampling": "rejection"},
    "gsm8k-t06": {**QUESTIONS, "temperature": 0.6},
}}


def test_twins_share_questions_limits_and_temperature():
    assert twin(SPEC["workloads"], "gsm8k-t1", 0.0, "coupled") == "gsm8k"
    assert twin(SPEC["workloads"], "gsm8k-t1", 1.0, "rejection") == "gsm8k-t1-rejection"
    assert twin(SPEC["workloads"], "gsm8k-t06", 0.6, "rejection") is None  # no rejection run at 0.6
    assert twin(SPEC["workloads"], "other", 1.0, "coupled") is None  # other questions


def test_each_mode_states_its_guarantee():
    assert guarantee(Sampling()) == "AR's tokens (greedy)"
    assert guarantee(Sampling(temperature=0.8, seed=7)) == "AR's tokens at seed 7 (coupled, T = 0.8)"
    assert "not its tokens" in guarantee(Sampling(temperature=1.0, sampling="rejection"))


def test_the_report_sets_commit_probabilities_against_acceptance_per_level(tree):
    """A sampled workload and its greedy twin: each drafting run's cycles give the per-level table, AR's none."""
    spec = tiny_spec(methods=("ar", "eagle3"), devices=(EMULATED_DEVICE,))
    spec["workloads"]["gsm8k-t1"] = {**spec["workloads"]["gsm8k"], "temperature": 1.0}
    spec["runs"][0]["workloads"].append("gsm8k-t1")
    spec, _ = emulated_tree(tree, spec)
    pool = {"pool_prob": [1.0, 0.6, 0.3, 0.3], "pool_parent": [-1, 0, 0, 1], "pool_level": [0, 1, 1, 2]}
    accepted = {"gsm8k": [1, 3], "gsm8k-t1": []}  # greedy commits 1 and 3; sampled rejects both level-1 nodes
    for r in levelled_runs(spec):
        cycle = {**pool, "selected": [0, 1, 2, 3], "accepted_path": accepted[r.workload]}
        pq.write_table(pa.Table.from_pylist([cycle, cycle]), tree / r.file("cycles.parquet"))
    assert sorted({r.method for r in levelled_runs(spec)}) == ["eagle3"]
    md, tables = build(spec, report_inputs(spec), tree / "reports" / "all")
    got = rows(tables[f"sampling-levels/toy/{EMULATED_DEVICE}"])
    assert len(got) == 4  # gsm8k and gsm8k-t1, each at two slot counts
    by_workload = {row[0]: row for row in got.values()}  # both slot counts read the same cycles
    greedy, sampled = by_workload["gsm8k"], by_workload["gsm8k-t1"]
    assert greedy[1] == "greedy" and sampled[1] == "coupled, T = 1"
    assert greedy[4] == "0.45 / 0.50 (n 4)" and greedy[5] == "0.50 / 1.00 (n 2)"  # (0.6 + 0.3) / 2; 3 of 3 trials
    assert sampled[4] == "0.45 / 0.00 (n 4)" and sampled[5] == "–"  # no committed parent at level 1: no level 2
