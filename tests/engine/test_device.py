"""The emulated device: its cost model over the engine's plans, its virtual clock, and the engine on it."""

import time

import pytest
import torch

from specfit.engine.cache import ExpertCache
from specfit.engine.device import DeviceModel, Timeline, scaled
from specfit.engine.offload import OffloadConfig, make_engine, offload_experts
from specfit.errors import SpecFitError

PARAMS = {"name": "A100", "fixed_ms": 10.0, "token_ms": 0.5, "expert_ms": 1.0, "copy_ms": 2.0, "draft_ms": 1.5}


def test_a_layers_hits_run_while_its_misses_copy():
    model = DeviceModel.from_spec(PARAMS)
    cache = ExpertCache(8)
    cache.admit([0, 1, 2])  # resident: 0, 1, 2
    _, _, steps = cache.admit([0, 1, 2, 5])  # 3 hits, 1 miss
    # the copy (2 ms) flies while the 3 hits run (3 ms); the miss then runs (1 ms)
    assert model.layer_ms(steps, link_free=0.0, now=0.0) == (4.0, 2.0)
    _, _, steps = cache.admit([6, 7])  # 2 misses, nothing to overlap: 2 copies, then both run
    assert model.layer_ms(steps, link_free=0.0, now=10.0) == (16.0, 14.0)
    assert model.mean_layer_ms(union=4, misses=1) == 4.0 and model.mean_layer_ms(union=2, misses=2) == 6.0


def test_a_union_over_the_slots_waits_for_its_first_group():
    """Three slots, four misses: the fourth evicts a pending expert, so the first three are copied and run first."""
    model = DeviceModel.from_spec(PARAMS)
    cache = ExpertCache(3)
    _, misses, steps = cache.admit([0, 1, 2, 3])
    assert misses == [0, 1, 2, 3]
    # 3 copies (6 ms), 3 run (3 ms), the fourth copy (2 ms) and run (1 ms): as without a cache, 4 * (2 + 1)
    assert model.layer_ms(steps, 0.0, 0.0) == (12.0, 11.0)


def test_fixed_part_and_label():
    model = DeviceModel.from_spec(PARAMS)
    assert model.fixed(1) == 10.0 and model.fixed(8) == 13.5
    assert model.label == "emulated A100, virtual clock"


@pytest.mark.parametrize("key, value, message", [
    ("expert_ms", -0.1, "emulate.expert_ms = -0.1 is negative"),
    ("copy_ms", None, "emulate.copy_ms must be a number"),
    ("token_ms", True, "emulate.token_ms must be a number"),
    ("fixed_ms", 0, "fixed_ms and draft_ms must be > 0"),
])
def test_bad_parameters_are_named(key, value, message):
    spec = dict(PARAMS)
    if value is None:
        del spec[key]
    else:
        spec[key] = value
    with pytest.raises(SpecFitError, match=message.replace(".", r"\.").replace("(", r"\(")):
        DeviceModel.from_spec(spec)


def test_the_hosts_selection_is_optional_and_checked():
    for value in (0.5, None):  # absent or null: the calibration's measured time
        assert DeviceModel.from_spec({**PARAMS, "select_ms": value}) == DeviceModel.from_spec(PARAMS)
    with pytest.raises(SpecFitError, match=r"emulate\.select_ms = -1 is negative"):
        DeviceModel.from_spec({**PARAMS, "select_ms": -1})
    with pytest.raises(SpecFitError, match=r"emulate\.select_ms must be a number"):
        DeviceModel.from_spec({**PARAMS, "select_ms": "fast"})


def test_one_rule_scales_every_time_to_the_toy():
    gpu = {"name": "X", "fixed_ms": 75.0, "token_ms": 1.5, "expert_ms": 0.2, "copy_ms": 0.19, "draft_ms": 10.0,
           "select_ms": 0.5, "ar_step_ms": 300.0, "experts_per_token": 384}
    toy = scaled(gpu, reference_step_ms=150.0, step_ms=15.0, experts_per_token=16)
    assert toy["name"] == "X"
    assert toy["fixed_ms"] == pytest.approx(7.5) and toy["draft_ms"] == pytest.approx(1.0)  # a tenth of the paper's
    assert toy["token_ms"] == pytest.approx(0.15)
    # an AR token's union costs the same share of the step: 384 * 0.2 / 150 == 16 * e / 15
    assert 16 * toy["expert_ms"] / 15 == pytest.approx(384 * 0.2 / 150)
    assert toy["copy_ms"] / toy["expert_ms"] == pytest.approx(0.19 / 0.2)
    assert toy["select_ms"] == 0.5  # the host's: the CPU's work does not scale with the GPU


def test_the_virtual_clock_moves_by_modelled_time_and_host_work_only():
    """A forward advances the clock by its modelled time whatever the CPU took; host work by its measured time."""
    timeline = Timeline(DeviceModel.from_spec(PARAMS))
    cache = ExpertCache(8)
    _, _, steps = cache.admit([0, 1])  # two misses: 2 copies (4 ms), then both run (2 ms)
    timeline.begin()
    time.sleep(0.02)  # the CPU is slow: it changes nothing
    timeline.layer(0, 1, steps)
    timeline.end()
    assert timeline.clock_s == pytest.approx((10.0 + 6.0) * 1e-3)
    assert timeline.target.forwards == 1 and timeline.target.cpu_s >= 0.02  # recorded, for information only
    timeline.drafted(rows=1, cpu_s=0.5)
    assert timeline.clock_s == pytest.approx((16.0 + 1.5) * 1e-3)
    timeline.host(0.001)
    assert timeline.clock_s == pytest.approx(18.5e-3) and timeline.host_s == pytest.approx(1e-3)
    # a prefetch between forwards holds the link in virtual time; the next forward queues behind it
    start, lands = timeline.copy_ahead()
    assert (start, lands) == (pytest.approx(18.5e-3), pytest.approx(20.5e-3))
    assert timeline.backlog_ms() == pytest.approx(2.0) and timeline.in_flight_ms(lands) == pytest.approx(2.0)
    for _ in range(5):
        timeline.copy_ahead()  # six prefetched copies: the link is busy for 12 ms, past the 10 ms fixed part
    timeline.begin()
    _, _, steps = cache.admit([2])  # one miss behind them: copied from 12 ms, run from 14 ms
    timeline.layer(0, 1, steps)
    timeline.end()
    assert timeline.clock_s == pytest.approx(18.5e-3 + (12.0 + 2.0 + 1.0) * 1e-3)
    timeline.reset()  # fresh counters, the clock goes on
    assert timeline.target.forwards == 0 and timeline.clock_s > 0


def test_engine_on_the_device_changes_no_logit_and_advances_the_clock_by_the_model(make_target, forwards):
    plain = forwards(make_target())
    model = make_target()
    params = dict(PARAMS, fixed_ms=20.0, expert_ms=0.5, copy_ms=1.0)
    engine = make_engine(model, slots=3, emulate=params)
    started = time.perf_counter()
    emulated = forwards(model)
    elapsed = time.perf_counter() - started
    for a, b in zip(plain, emulated):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)
    stats = engine.stats()
    device = stats["device"]["target"]
    # prefill of 10 tokens, one token, a 5-token tree (all decode-sized: a prefill has over 16 tokens)
    assert device["forwards"] == 3 == stats["forwards"] and stats["device"]["prefill"]["forwards"] == 0
    # their fixed parts at least, and every executed expert
    assert device["modelled_s"] >= (3 * 20.0 + 0.5 * (9 + 0 + 4) + 0.5 * stats["demand"]) * 1e-3
    assert engine.timeline.clock_s == pytest.approx(device["modelled_s"])  # the clock moved by the model alone
    assert elapsed < device["modelled_s"] or device["cpu_s"] >= device["modelled_s"]  # nothing slept to it
    with torch.no_grad():
        model(torch.zeros(1, 17, dtype=torch.long))  # a prefill: counted apart
    assert engine.stats()["device"]["prefill"]["forwards"] == 1 and engine.stats()["device"]["target"]["forwards"] == 3
    assert stats["link_emulated"] and stats["timing_label"] == "emulated A100, virtual clock"
    engine.close()


def test_drafter_forwards_take_draft_ms_on_the_clock(make_target):
    model = make_target()
    engine = make_engine(model, slots=3, emulate=dict(PARAMS, draft_ms=4.0))
    drafter = torch.nn.Linear(4, 4)
    engine.emulate_drafter(drafter)
    for _ in range(3):
        drafter(torch.zeros(1, 4))
    assert engine.timeline.clock_s == pytest.approx(12e-3)
    assert engine.stats()["device"]["drafter"]["forwards"] == 3
    engine.reset_stats()
    drafter(torch.zeros(1, 4))
    assert engine.stats()["device"]["drafter"]["forwards"] == 1
    engine.close()


def test_the_drafters_catch_up_on_a_prompt_is_counted_apart(make_target):
    """A drafter forward over more than PREFILL_TOKENS rows (the prompt, after the target's prefill) is counted
    with the drafter's prefills, not with the drafted levels."""
    from specfit.engine.device import PREFILL_TOKENS

    engine = make_engine(make_target(), slots=3, emulate=dict(PARAMS, draft_ms=1.0))
    drafter = torch.nn.Embedding(8, 4)  # forward(input_ids [B, T]), as the EAGLE-3 drafter's
    engine.emulate_drafter(drafter)
    drafter(torch.zeros(1, PREFILL_TOKENS + 1, dtype=torch.long))
    drafter(torch.zeros(1, 2, dtype=torch.long))
    device = engine.stats()["device"]
    assert device["drafter_prefill"]["forwards"] == 1 and device["drafter"]["forwards"] == 1
    engine.reset_stats()
    assert engine.stats()["device"]["drafter_prefill"]["forwards"] == 0
    engine.close()


def test_a_device_and_a_link_together_are_refused():
    from specfit.engine.link import LinkModel

    with pytest.raises(ValueError, match="a link or a device"):
        OffloadConfig(4, link=LinkModel(1e9), device=DeviceModel.from_spec(PARAMS))


def test_device_emulation_on_cuda_is_refused(make_target):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with pytest.raises(ValueError, match="CUDA runs are measured"):
        offload_experts(make_target(), OffloadConfig(4, device=DeviceModel.from_spec(PARAMS)), device="cuda")
