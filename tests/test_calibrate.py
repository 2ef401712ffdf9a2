"""Calibration probes (Appendix B): states, probe trees, restoration between probes, the fit's outputs."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from specfit import calibrate
from specfit.selection import Pool, select_min_union

PROTOCOL = {"question_ids": [10, 11], "cycle_boundaries": [0, 2], "sizes": 8, "repeats": 2, "limit_tokens": 60}


def spec(**kw):
    return {"dtype": "float32", "torch_device": "cpu", "max_inflight": 2, "link": None, "slots": 4,
            "coefficients": "fit", "protocol": PROTOCOL, "seed": 0, "model": "tiny", "logits_dtype": "model", **kw}


@pytest.fixture(scope="module")
def fitted(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrate")
    outputs = {"coefficients": out / "cache.json", "points": out / "cache.points.parquet"}
    calibrate.run(spec(), files, outputs)
    return json.loads(outputs["coefficients"].read_text()), pq.read_table(outputs["points"]).to_pylist()


def test_probe_points_follow_the_protocol(fitted):
    coefficients, points = fitted
    states = {(p["question_id"], p["cycle"]) for p in points}
    assert states == {(10, 0), (10, 2), (11, 0), (11, 2)}
    # two probe trees per size and state, each timed `repeats` times: 4 states x 8 sizes x 2 trees
    assert len(points) == coefficients["n_points"] == 4 * 8 * 2
    assert all(len(p["y_repeats_ms"]) == 2 and p["y_ms"] == pytest.approx(np.mean(p["y_repeats_ms"]))
               for p in points)
    for p in points:
        assert len(p["nodes"]) == p["k"]
    by = {(p["state"], p["k"], p["tree"]): p for p in points}
    for (state, k, tree), p in by.items():
        # the minimum-union tree never has a larger union than the probability prefix of the same size
        if tree == "union":
            assert p["F"] <= by[state, k, "prob"]["F"]
    assert {p["nodes"] == [] for p in points if p["k"] == 0} == {True}


def test_fit_is_nonnegative_with_diagnostics(fitted):
    coefficients, points = fitted
    assert len(coefficients["b"]) == 8 and min(coefficients["b"]) >= 0 and coefficients["beta"] >= 0
    assert coefficients["r2"] <= 1.0 and coefficients["source"] == "fit" and coefficients["cache"] is True
    assert coefficients["link_emulated"] is False
    pred = np.array(coefficients["b"])[[p["k"] for p in points]] + coefficients["beta"] * np.array([p["F"] for p in points])
    np.testing.assert_allclose([p["pred_ms"] for p in points], pred)


def test_probes_restore_the_state(target, drafter):
    """Probe cycles leave target KV, drafter KV and the trajectory exactly as they found them."""
    import torch

    from specfit.engine import make_engine
    from specfit.speculative.request import Limits

    engine = make_engine(target, slots=4)
    limits = Limits(60, 60, frozenset())
    prompt = [3, 5, 7, 11, 13]
    with torch.inference_mode():
        probed = calibrate.Trajectory(target, drafter, engine, prompt, 0, limits)
        untouched = calibrate.Trajectory(target, drafter, engine, prompt, 0, limits)
        probed.step()
        untouched.step()
        keys = [layer.keys.clone() for layer in probed.session.target.cache.layers]
        committed = probed.session.state.committed  # drafter rows past it are last cycle's draft rows, cropped at sync
        drafter_keys = [layer.keys[..., :committed, :].clone() for layer in probed.session.state.cache.layers]
        pool, decision = untouched.draft()
        for nodes in [(), (1,), (1, 2, 3), tuple(range(1, 8))]:
            calibrate.probe_cycle(probed, pool, nodes)
            assert all(torch.equal(a, layer.keys) for a, layer in zip(keys, probed.session.target.cache.layers))
            assert probed.session.state.committed == committed
            assert all(torch.equal(a, layer.keys[..., :committed, :])
                       for a, layer in zip(drafter_keys, probed.session.state.cache.layers))
        probed.step()
        untouched.finish(pool, decision)
        for _ in range(3):
            probed.step()
            untouched.step()
    assert probed.session.output == untouched.session.output and len(probed.session.output) > 4


def test_preset_needs_no_probes(tmp_path):
    outputs = {"coefficients": tmp_path / "c.json", "points": tmp_path / "p.parquet"}
    calibrate.run(spec(coefficients="paper-rtx4090", slots=0), {}, outputs)
    c = json.loads(outputs["coefficients"].read_text())
    assert c["beta"] == 0.781593955 and c["b"][0] == 151.724 and c["source"] == "paper-rtx4090"
    assert pq.read_table(outputs["points"]).num_rows == 0


def test_min_union_probe_is_the_exact_argmin():
    routes = np.array([[[0, 1]], [[0, 1]], [[2, 3]], [[0, 2]], [[1, 0]]])  # [5, 1 layer, top-2]
    pool = Pool([-1, 0, 0, 1, 1], [1.0, 0.6, 0.3, 0.2, 0.1], routes, num_experts=4)
    assert select_min_union(pool, 2).nodes == (1, 4)  # adds nothing to the root's {0, 1}
