"""`python -m specfit.bench proportions`: the paper's side of the table, and the toy's summary of a run."""

import pytest

from specfit.bench.proportions import paper_counters
from specfit.paper import paper_results


def test_paper_proportions_from_tables_2_and_3():
    p = paper_counters(paper_results())
    assert p["committed"] == {"summarization": 2.54, "gsm8k": 4.35}
    # expert copies per cycle of EAGLE-3 without the cache over AR's per token: 486.5 * 2.54 / 400.7
    assert p["union"]["summarization"] == pytest.approx(3.084, abs=1e-3)
    assert p["union"]["gsm8k"] == pytest.approx(345.7 * 4.35 / 398.2)


def test_expert_union_counts_each_expert_once_per_layer():
    import torch

    from specfit.bench.proportions import expert_union

    routes = torch.tensor([[[0, 1], [2, 3]], [[1, 4], [2, 3]], [[0, 1], [5, 6]]])  # [T=3, L=2, k=2]
    assert expert_union(routes) == 3 + 4  # layer 0: {0, 1, 4}; layer 1: {2, 3, 5, 6}
    assert expert_union(routes[:1]) == 4  # one token: L * k
