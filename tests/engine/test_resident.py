"""A resident device: the fit of its measured verify widths, its scaling to the toy, and the engine on it (every
expert resident from the start, no copies, the virtual clock moved by the fitted formula on the real routes)."""

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from specfit.engine.offload import make_engine
from specfit.engine.resident import fit, reads
from specfit.errors import SpecFitError

# the source measurement, as the workflow's overlay defines it (its gather set per test)
M5_MAX = yaml.safe_load((Path(__file__).resolve().parents[2] / "config.resident.yaml").read_text())[
    "devices"]["cpu-m5max-pair"]["resident"]


@pytest.mark.parametrize("gather", ["pair", "distinct"])
def test_the_m5_max_widths_fit_within_3_percent(gather):
    device = fit({**M5_MAX, "gather": gather})
    assert device.a > 0 and device.b > 0 and device.c > 0
    assert np.all(np.abs(device.errors()) < 0.03), device.errors()
    # the drafter: its share of the width-1 step a + c * L*k
    assert device.draft_ms == pytest.approx(0.068 * (device.a + device.c * 23 * 6))


def test_the_expected_reads():
    w = np.array([1.0, 2.0, 8.0])
    assert list(reads("pair", w, 23, 128, 6)) == [138, 276, 1104]
    distinct = reads("distinct", w, 23, 128, 6)
    assert distinct[0] == pytest.approx(138) and distinct[1] < 276 and distinct[2] < 1104
    assert reads("distinct", np.array([1e6]), 2, 8, 2)[0] == pytest.approx(16)  # at most every expert


def test_one_toy_read_stands_for_the_real_models_reads_per_token():
    device = fit({**M5_MAX, "gather": "pair"})
    toy = device.for_toy(4, 4)  # 16 toy reads per token stand for 23 * 6 = 138
    assert toy.read_ms == pytest.approx(device.c * 138 / 16)
    # a width-1 toy step (16 reads) costs the real width-1 step; width 3 costs the real width-3 forward
    assert toy.fixed(1) + 16 * toy.read_ms == pytest.approx(device.predicted(1))
    assert toy.fixed(3) + 3 * 16 * toy.read_ms == pytest.approx(device.predicted(3))
    assert toy.copy_ms == 0 and toy.label == "emulated M5 Max (resident, pair gather), virtual clock"


@pytest.mark.parametrize("change, message", [
    ({"widths": [1, 3, 2, 5, 8]}, "'resident.widths' must be strictly increasing"),
    ({"ms": [8.47, 13.49, 12.0, 20.67, 28.13]}, "'resident.ms' falls as the width grows"),
    ({"widths": [1, 2], "ms": [8.0, 9.0]}, "'resident.widths' has 2 widths"),
    ({"ms": [8.47, 0, 15.64, 20.67, 28.13]}, "'resident.ms' must hold positive costs"),
    ({"experts_per_token": 200}, "'resident.experts_per_token' is 200"),
    ({"widths": [2, 3, 5, 8, 13]}, "'resident.widths' must start at 1"),
])
def test_bad_measurements_are_refused_naming_the_key(change, message):
    with pytest.raises(SpecFitError, match=message.replace(".", r"\.")):
        fit({**M5_MAX, "gather": "pair", **change})


@pytest.mark.parametrize("gather", ["pair", "distinct"])
def test_engine_on_a_resident_device_copies_nothing_and_prices_the_real_routes(make_target, forwards, gather):
    plain = forwards(make_target())
    model = make_target()  # qwen3_moe: 2 MoE layers, 8 experts, top-2
    engine = make_engine(model, slots=8, emulate={"resident": {**M5_MAX, "gather": gather}})
    toy = engine.timeline.model
    assert toy.read_ms == pytest.approx(fit({**M5_MAX, "gather": gather}).c * 138 / 4)
    with engine.record_routes() as recorder:
        resident = forwards(model)
    for a, b in zip(plain, resident):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)
    stats = engine.stats()
    assert stats["h2d_transfers"] == 0 == engine.h2d_transfers and stats["per_layer"]["misses"] == [0, 0]
    assert engine.resident().all()
    expected = 0.0
    for routes in recorder.forwards:  # [T, L, k]
        T = routes.shape[0]
        n = T * 2 * 2 if gather == "pair" else sum(len(set(routes[:, layer].flatten().tolist())) for layer in range(2))
        expected += toy.fixed(T) + toy.read_ms * n
    assert engine.timeline.clock_s == pytest.approx(expected * 1e-3)
    assert stats["device"]["copy_stall_s"] == pytest.approx(0.0, abs=1e-12)
    assert stats["timing_label"] == f"emulated M5 Max (resident, {gather} gather), virtual clock"
    engine.clear_cache()  # the experts never leave
    assert engine.resident().all()
    again = forwards(model)
    assert torch.allclose(again[-1], plain[-1], atol=1e-5, rtol=0) and engine.h2d_transfers == 0
    engine.close()


def test_a_resident_device_with_fewer_slots_than_experts_is_refused(make_target):
    with pytest.raises(SpecFitError, match=r"8 experts per layer.*'runs\.N\.slots'"):
        make_engine(make_target(), slots=6, emulate={"resident": {**M5_MAX, "gather": "pair"}})
