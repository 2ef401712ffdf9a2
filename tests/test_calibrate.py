"""Calibration probes (Appendix B): states, probe trees, restoration between probes, the fit's outputs."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from specfit.selection import Pool, select_min_union
from specfit.stages import calibrate

PROTOCOL = {"question_ids": [10, 11], "cycle_boundaries": [0, 2], "sizes": 8, "repeats": 2, "limit_tokens": 60}


def spec(**kw):
    return {"dtype": "float32", "torch_device": "cpu", "max_inflight": 2, "link": None, "emulate": None, "slots": 4,
            "coefficients": "fit", "protocol": PROTOCOL, "seed": 0, "model": "tiny", "logits_dtype": "model",
            "verify": "exact", **kw}


def calibrated(files, out, **kw):
    outputs = {"coefficients": out / "c.json", "points": out / "c.points.parquet"}
    calibrate.run(spec(**kw), files, outputs)
    return json.loads(outputs["coefficients"].read_text()), pq.read_table(outputs["points"]).to_pylist()


@pytest.fixture(scope="module")
def fitted(files, tmp_path_factory):
    return calibrated(files, tmp_path_factory.mktemp("calibrate"))


@pytest.fixture(scope="module")
def fitted_nocache(files, tmp_path_factory):
    return calibrated(files, tmp_path_factory.mktemp("calibrate-nocache"), slots=0)


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
    pred = (np.array(coefficients["b"])[[p["k"] for p in points]]
            + coefficients["beta"] * np.array([p["F"] for p in points]))
    np.testing.assert_allclose([p["pred_ms"] for p in points], pred)


@pytest.mark.parametrize("cache", [True, False])
def test_probes_count_misses_and_hits(cache, fitted, fitted_nocache):
    """Every repeat of every probe: the verify forward's misses + hits are the expert union F (drafting touches no
    expert of the target); without the cache every expert is a miss."""
    coefficients, points = fitted if cache else fitted_nocache
    for p in points:
        assert len(p["misses_repeats"]) == len(p["hits_repeats"]) == len(p["draft_repeats_ms"]) == 2
        assert [m + h for m, h in zip(p["misses_repeats"], p["hits_repeats"])] == [p["F"], p["F"]]
        assert (p["misses"], p["hits"]) == (p["misses_repeats"][0], p["hits_repeats"][0])
        assert p["misses"] + p["hits"] == p["F"]
        assert p["draft_ms"] == pytest.approx(np.mean(p["draft_repeats_ms"])) and p["draft_ms"] > 0
        if not cache:
            assert p["hits_repeats"] == [0, 0]
    if cache:  # the second repeat finds what the first loaded
        assert sum(p["hits"] for p in points) > 0
        assert sum(sum(p["hits_repeats"]) for p in points) > 2 * sum(p["hits"] for p in points)


def test_drafting_fit_in_the_json(fitted):
    """specfit-ca's drafting model: start + (levels - 1)·level over the probes that caught the drafter up (the
    states right after prefill have nothing to catch up on), and one timed selection."""
    from specfit.selection.coefficients import DraftCost, fit_drafting

    coefficients, points = fitted
    assert {p["caught_up"] == 0 for p in points} == {True, False}  # cycle 0 states: none; later ones: the commits
    assert all(p["caught_up"] >= 1 for p in points if p["cycle"] > 0)
    used = [p for p in points if p["caught_up"] > 0]
    levels = np.repeat([p["levels"] for p in used], 2)
    start, level, r2 = fit_drafting(levels, np.concatenate([p["draft_repeats_ms"] for p in used]))
    d = coefficients["drafting"]
    assert (d["start_ms"], d["level_ms"], d["r2"], d["n_points"]) == pytest.approx((start, level, r2, 2 * len(used)))
    assert all(p["select_ms"] > 0 for p in points)  # every probe drafts at least one level, then selects
    assert d["select_ms"] == pytest.approx(sum(p["select_ms"] for p in points) / sum(p["levels"] for p in points))
    assert d["select_source"] == "measured" and d["select_measured_ms"] == d["select_ms"]  # no emulated host here
    cost = DraftCost.of(coefficients)
    assert cost(0) == 0 and cost(2) == pytest.approx(d["start_ms"] + d["level_ms"] + 2 * d["select_ms"])


def test_an_emulated_host_prices_the_selection(files, tmp_path):
    """An emulated device with ``select_ms`` prices specfit-ca's selection at it (the same on every machine and run),
    keeping the measured time beside it; the clock's timings and the rest of the fit are the probes' own."""
    emulate = {"name": "A100", "fixed_ms": 74.02, "token_ms": 1.423, "expert_ms": 4.786, "copy_ms": 4.575,
               "draft_ms": 10.24}
    priced, priced_points = calibrated(files, tmp_path / "priced", emulate={**emulate, "select_ms": 0.5},
                                       protocol={**PROTOCOL, "repeats": 1})
    measured, points = calibrated(files, tmp_path / "measured", emulate=emulate, protocol={**PROTOCOL, "repeats": 1})
    d, m = priced["drafting"], measured["drafting"]
    assert (d["select_ms"], d["select_source"]) == (0.5, "device")
    assert m["select_source"] == "measured" and m["select_ms"] == m["select_measured_ms"] > 0
    assert d["select_measured_ms"] > 0
    # on the virtual clock the probes' cycle times are the model's: identical with or without the host's figure
    assert [p["y_ms"] for p in priced_points] == [p["y_ms"] for p in points]
    assert (d["start_ms"], d["level_ms"], priced["b"], priced["beta"]) == (m["start_ms"], m["level_ms"],
                                                                              measured["b"], measured["beta"])


@pytest.mark.parametrize("cache", [True, False])
def test_cache_aware_fit_in_the_json(cache, fitted, fitted_nocache):
    coefficients, points = fitted if cache else fitted_nocache
    ca = coefficients["cache_aware"]
    assert ca["n_points"] == 2 * len(points) and ca["n_probes"] == len(points) and ca["fit_on"] == "repeats"
    assert len(ca["b"]) == 8 and min(ca["b"]) >= 0 and ca["beta_miss"] >= 0 and ca["beta_hit"] >= 0
    assert ca["r2"] <= 1.0 and ca["r2_means"] <= 1.0 and ca["rmse_ms"] >= 0 and ca["union_mismatches"] == 0
    assert ca["beta_hit_identified"] is cache and ca["beta_miss_identified"] is True
    if not cache:
        assert ca["beta_hit"] == 0.0
    # pred_ca_ms: the mean over the repeats of each repeat's prediction
    for p in points:
        per_repeat = [ca["b"][p["k"]] + ca["beta_miss"] * m + ca["beta_hit"] * h
                      for m, h in zip(p["misses_repeats"], p["hits_repeats"])]
        assert p["pred_ca_ms"] == pytest.approx(np.mean(per_repeat))
    y, pred = np.array([p["y_ms"] for p in points]), np.array([p["pred_ca_ms"] for p in points])
    assert ca["r2_means"] == pytest.approx(1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))
    # the paper's model keeps its fit on the probe means
    from specfit.selection.coefficients import fit_nnls

    paper = fit_nnls([p["k"] for p in points], [p["F"] for p in points], y)
    assert coefficients["b"] == paper.b and coefficients["beta"] == paper.beta and coefficients["r2"] == paper.r2


def test_probes_restore_the_state(target, drafter):
    """Probe cycles leave target KV, drafter KV and the trajectory exactly as they found them."""
    import copy

    import torch

    from specfit.engine.offload import make_engine
    from specfit.speculative.request import Limits

    target = copy.deepcopy(target)  # offloaded below: the shared fixture stays plain for other tests
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
    assert c["cache_aware"] is None and c["drafting"] is None
    assert pq.read_table(outputs["points"]).num_rows == 0


def test_min_union_probe_is_the_exact_argmin():
    routes = np.array([[[0, 1]], [[0, 1]], [[2, 3]], [[0, 2]], [[1, 0]]])  # [5, 1 layer, top-2]
    pool = Pool([-1, 0, 0, 1, 1], [1.0, 0.6, 0.3, 0.2, 0.1], routes, num_experts=4)
    assert select_min_union(pool, 2).nodes == (1, 4)  # adds nothing to the root's {0, 1}

