"""`python -m specfit.bench sampling`: cycle shapes read from recorded cycles, the replay of each mode timing the
parts it has (greedy draws no noise), one row per method and mode, and bad sampling keys refused before any load."""

import pytest
import torch

from specfit.bench import sampling as bench
from specfit.errors import SpecFitError
from specfit.speculative.sampling import Sampling


def cycle(levels, parents, selected, committed, drafted):
    return {"pool_level": levels, "pool_parent": parents, "pool_token": list(range(len(levels))),
            "selected": selected, "committed": committed, "drafted_levels": drafted}


def test_cycle_shapes_expand_the_frontier_and_verify_the_selected_tree():
    # root, two level-1 children (1, 2), three level-2 nodes (3, 4 under 1; 5 under 2)
    c = cycle([0, 1, 1, 2, 2, 2], [-1, 0, 0, 1, 1, 2], [1, 3], committed=3, drafted=2)
    (shape,) = bench.cycle_shapes([c], top_k=2)
    assert shape["parents"] == [1, 2]  # level 1 from the root's row, level 2 from the 2 frontier nodes of level 1
    assert shape["rows"] == [0, 1, 3] and shape["row_parent"] == [-1, 0, 1] and shape["row_level"] == [0, 1, 2]
    assert shape["committed"] == 3


def test_each_mode_times_its_own_parts():
    shapes = bench.cycle_shapes([cycle([0, 1, 1, 2, 2], [-1, 0, 0, 1, 1], [1, 3], 2, 2)] * 4, top_k=2)
    rows = [torch.randn(50) for _ in range(4)]
    bank, draft_bank = bench.padded(rows, 300), bench.padded(rows, 100)
    assert bank.shape == (4, 300) and torch.equal(bank[0, :50], rows[0]) and bank[0, 50:].max() < rows[0].min()
    s = Sampling(temperature=1.0)
    greedy = bench.replay(shapes, bank, draft_bank, s, "greedy", 2, repeats=1)
    coupled = bench.replay(shapes, bank, draft_bank, s, "coupled", 2, repeats=1)
    assert greedy["noise"] == 0 and greedy["target"] > 0 and greedy["drafter"] > 0
    assert coupled["noise"] > 0 and coupled["target"] > 0 and coupled["drafter"] > 0


def test_one_row_per_method_and_mode(capsys):
    bench.main(["--requests", "1", "--new", "8", "--repeats", "1"])
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out if line.startswith("eagle3 ")]
    assert [r[1] for r in rows] == ["coupled", "rejection"] * 2  # the costs, then the per-level calibration
    assert all(int(r[2]) > 0 and float(r[3]) > 0 for r in rows[:2])  # cycles, the emulated A100's cycle ms
    assert all(r[2] == "L1" for r in rows[2:])  # every cycle verifies a level-1 node


def test_level_calibration_counts_the_nodes_whose_parent_was_committed():
    c = cycle([0, 1, 1, 2], [-1, 0, 0, 1], [1, 2, 3], committed=2, drafted=2)
    c["pool_prob"], c["accepted_path"] = [1.0, 0.6, 0.3, 0.3], [1]  # node 1 committed, its child 3 not
    assert bench.level_calibration([c]) == {1: (2, pytest.approx(0.45), 0.5), 2: (1, 0.5, 0.0)}


def test_bad_sampling_keys_are_refused_before_any_load():
    with pytest.raises(SpecFitError, match="top_p"):
        bench.main(["--top-p", "1.5"])
