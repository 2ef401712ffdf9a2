"""`python -m specfit.bench proportions`: the paper's side of the table, and the toy's summary of a run."""

import numpy as np
import pytest

from specfit.bench.proportions import paper_counters, summary
from specfit.paper import paper_results


def test_paper_proportions_from_tables_2_and_3():
    p = paper_counters(paper_results())
    assert p["committed"] == {"summarization": 2.54, "gsm8k": 4.35}
    # expert copies per cycle of EAGLE-3 without the cache over AR's per token: 486.5 * 2.54 / 400.7
    assert p["union"]["summarization"] == pytest.approx(3.084, abs=1e-3)
    assert p["union"]["gsm8k"] == pytest.approx(345.7 * 4.35 / 398.2)


def test_summary_of_a_run():
    prompt = [9, 9, 9]
    output = [1, 2, 1, 2, 1, 2, 1, 2, 1]  # a loop: from output 3 on, every 4-gram came before
    cycles = [
        {"request_id": 0, "prefix_len": 3, "committed": 4, "drafted_levels": 3, "selected": [1, 2, 3],
         "t_draft_s": 0.003, "t_select_s": 0.0, "t_verify_s": 0.010, "t_commit_s": 0.001},
        {"request_id": 0, "prefix_len": 7, "committed": 4, "drafted_levels": 1, "selected": [1],
         "t_draft_s": 0.001, "t_select_s": 0.0, "t_verify_s": 0.006, "t_commit_s": 0.001},
    ]
    run = {"requests": [{"request_id": 0, "output_ids": output, "prompt_ids": prompt}], "cycles": cycles}
    s = summary(run)
    assert s["committed"] == 4.0
    assert s["level_ms"] == pytest.approx(1e3 * 0.004 / 4)  # draft time over drafted levels
    assert s["cycle_ms"] == pytest.approx(1e3 * (0.014 + 0.008) / 2)
    assert s["fresh_share"] == 0.5  # the second cycle starts on output 5, inside the loop
    assert s["committed_fresh"] == 4.0
    assert np.array_equal(s["selected"], [3, 1])


def test_expert_union_counts_each_expert_once_per_layer():
    import torch

    from specfit.bench.proportions import expert_union

    routes = torch.tensor([[[0, 1], [2, 3]], [[1, 4], [2, 3]], [[0, 1], [5, 6]]])  # [T=3, L=2, k=2]
    assert expert_union(routes) == 3 + 4  # layer 0: {0, 1, 4}; layer 1: {2, 3, 5, 6}
    assert expert_union(routes[:1]) == 4  # one token: L * k
