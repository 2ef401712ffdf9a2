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


def test_acceptance_rows_beside_the_papers():
    """Tables 2 and 5's figures per workload, this run's from EAGLE-3's metrics and SpecFit's Table 5, the goal on
    EAGLE-3's committed per cycle only, and the direction of every other difference."""
    from specfit.results.acceptance import (
        ACCEPTANCE,
        acceptance_met,
        direction,
        ordered_met,
        paper_acceptance,
        run_acceptance,
        shown,
    )

    paper = paper_results()
    assert paper_acceptance(paper, "summarization") == {"e3_committed": 2.54, "selected_nodes": 2.88,
                                                        "drafted_levels": 2.86, "stopped_early_pct": 85.8,
                                                        "rho_cv": 0.31}
    assert paper_acceptance(paper, "gsm8k", "rtx4090") == {"e3_committed": 4.32, "selected_nodes": None,
                                                           "drafted_levels": None, "stopped_early_pct": None,
                                                           "rho_cv": None}  # Table 5 is the A100's
    theory = {"selected_nodes_beta": 4.2, "drafted_levels_mean": 3.9, "stopped_early_pct": 51.0, "rho_cv": 0.157}
    toy = run_acceptance({"committed_per_cycle": 2.9}, theory)
    assert toy == {"e3_committed": 2.9, "selected_nodes": 4.2, "drafted_levels": 3.9, "stopped_early_pct": 51.0,
                   "rho_cv": 0.157}
    assert run_acceptance(None, None) == dict.fromkeys((key for key, _, _ in ACCEPTANCE), None)
    assert acceptance_met("e3_committed", 2.92, 2.54) and not acceptance_met("e3_committed", 2.93, 2.54)
    assert acceptance_met("e3_committed", 2.16, 2.54) and not acceptance_met("e3_committed", 2.15, 2.54)
    assert acceptance_met("selected_nodes", 9.0, 2.88) is None and acceptance_met("e3_committed", None, 2.54) is None
    assert direction(4.2, 2.88) == "higher (+46%)" and direction(0.157, 0.31) == "lower (-49%)"
    assert direction(2.54, 2.54) == "equal" and direction(None, 2.54) is None
    assert shown("stopped_early_pct") == ".1f" and shown("rho_cv") == ".2f"
    assert ordered_met({"summarization": 2.5, "gsm8k": 4.1}) and not ordered_met({"summarization": 4.1, "gsm8k": 3.9})
    assert ordered_met({"gsm8k": 4.1}) is None
