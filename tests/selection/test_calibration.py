"""Commit probabilities calibrated online: the drafter's own before any trial, each bin's acceptance after."""

import numpy as np
import pytest

from specfit.errors import SpecFitError
from specfit.selection.calibration import OnlineCalibration
from specfit.speculative.config import MethodConfig

# root 0; level 1: nodes 1 (q 0.8) and 2 (q 0.15); level 2: node 3 under 1 (q 0.5), node 4 under 2 (q 0.6)
PARENT = [-1, 0, 0, 1, 2]
PROB = [1.0, 0.8, 0.15, 0.4, 0.09]
LEVEL = [0, 1, 1, 2, 2]


def test_before_any_trial_the_path_probabilities_are_the_drafters():
    cal = OnlineCalibration(max_depth=5)
    assert np.allclose(cal.path_probs(PARENT, PROB, LEVEL), PROB, rtol=0, atol=1e-15)
    assert cal.chain_rate(1) == 0.5  # no trial: one half


def test_a_bin_moves_to_its_acceptance_shrunk_toward_the_nodes_own_q():
    cal = OnlineCalibration(max_depth=5, prior=4.0)
    for accepted in ([1, 3], [], [1], [], []):  # node 1 (q 0.8, bin [0.8, 0.9)) taken 2 times in 5
        cal.observe(PARENT, PROB, LEVEL, (1, 2, 3), accepted)
    p = cal.path_probs(PARENT, PROB, LEVEL)
    assert p[1] == pytest.approx((2 + 4 * 0.8) / (5 + 4))
    assert p[2] == pytest.approx((0 + 4 * 0.15) / (5 + 4))  # node 2: 5 trials, never taken
    # node 3 (level 2, q 0.5) was a trial only when node 1 was committed: twice, taken once
    assert p[3] == pytest.approx(p[1] * (1 + 4 * 0.5) / (2 + 4))
    assert p[4] == pytest.approx(p[2] * 0.6)  # level 2's bin of q 0.6: no trial yet
    assert all(p[v] <= p[PARENT[v]] for v in range(1, 5))
    # the best child of each committed parent: node 1 at level 1 (5 trials, 2 taken), node 3 at level 2 (2, 1)
    assert cal.chain_rate(1) == pytest.approx((2 + 4 * 0.8) / (5 + 4))
    assert cal.chain_rate(2) == pytest.approx((1 + 4 * 0.5) / (2 + 4))


def test_reset_forgets_every_trial():
    cal = OnlineCalibration(max_depth=5)
    cal.observe(PARENT, PROB, LEVEL, (1, 2), [])
    cal.reset()
    assert np.allclose(cal.path_probs(PARENT, PROB, LEVEL), PROB)


def test_an_unknown_calibration_is_refused_by_name():
    with pytest.raises(SpecFitError, match="calibration 'isotonic'"):
        MethodConfig("specfit-ca", calibration="isotonic")


def test_a_pool_extended_level_by_level_gets_the_same_probabilities_bit_for_bit():
    """SpecFit calibrates each node once per cycle, as the pool grows: the extension equals one pass over the pool."""
    cal = OnlineCalibration(max_depth=5, prior=4.0)
    for accepted in ([1, 3], [], [1]):
        cal.observe(PARENT, PROB, LEVEL, (1, 2, 3, 4), accepted)
    whole = cal.path_probs(PARENT, PROB, LEVEL)
    level_1 = cal.path_probs(PARENT[:3], PROB[:3], LEVEL[:3])
    extended = cal.path_probs(PARENT, PROB, LEVEL, known=level_1)
    assert extended == whole and extended is level_1  # extended in place
    assert whole[3] == whole[1] * (1 + 4 * 0.5) / (2 + 4)


def test_a_calibration_started_from_counts_returns_to_them_on_reset():
    learned = OnlineCalibration(max_depth=5)
    for accepted in ([1, 3], [], [1]):
        learned.observe(PARENT, PROB, LEVEL, (1, 2, 3, 4), accepted)
    started = OnlineCalibration(max_depth=5, start=learned.counts())
    assert started.path_probs(PARENT, PROB, LEVEL) == learned.path_probs(PARENT, PROB, LEVEL)
    started.observe(PARENT, PROB, LEVEL, (1, 2), [])
    assert started.path_probs(PARENT, PROB, LEVEL) != learned.path_probs(PARENT, PROB, LEVEL)
    started.reset()  # back to the start, not to nothing
    assert started.path_probs(PARENT, PROB, LEVEL) == learned.path_probs(PARENT, PROB, LEVEL)
    assert learned.trials.sum() == 3 * 2 + 2  # its counts were copied, not shared (node 3 counts under node 1 taken)
    with pytest.raises(ValueError, match=r"accepted of shape \(6, 12\) does not fit max_depth 3"):
        OnlineCalibration(max_depth=3, start=learned.counts())
