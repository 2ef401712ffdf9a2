"""The sampling section's pairing of workloads (greedy twin, rejection twin) and each run's stated guarantee."""

from specfit.report.sections.sampling import guarantee, twin
from specfit.speculative.sampling import Sampling

QUESTIONS = {"question_ids": [1, 2, 3], "limit_tokens": 512, "max_new_tokens": 128}
SPEC = {"workloads": {
    "gsm8k": dict(QUESTIONS),
    "other": {**QUESTIONS, "question_ids": [4, 5]},
    "gsm8k-t1": {**QUESTIONS, "temperature": 1.0},
    "gsm8k-t1-rejection": {**QUESTIONS, "temperature": 1.0, "sampling": "rejection"},
    "gsm8k-t06": {**QUESTIONS, "temperature": 0.6},
}}


def test_twins_share_questions_limits_and_temperature():
    assert twin(SPEC, "gsm8k-t1", 0.0, "coupled") == "gsm8k"
    assert twin(SPEC, "gsm8k-t1", 1.0, "rejection") == "gsm8k-t1-rejection"
    assert twin(SPEC, "gsm8k-t06", 0.6, "rejection") is None  # no rejection run at 0.6
    assert twin(SPEC, "other", 1.0, "coupled") is None  # other questions


def test_each_mode_states_its_guarantee():
    assert guarantee(Sampling()) == "AR's tokens (greedy)"
    assert guarantee(Sampling(temperature=0.8, seed=7)) == "AR's tokens at seed 7 (coupled, T = 0.8)"
    assert "not its tokens" in guarantee(Sampling(temperature=1.0, sampling="rejection"))
