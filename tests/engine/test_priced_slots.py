"""Slot counts priced on one engine's forwards (`specfit.engine.pricing.price`): a method that reads nothing of the
cache decodes the same tokens at every slot count, so a priced clock must clock what a run at that slot count clocks,
to the last bit of its modelled time, and its cache must hold what that run's holds."""

import pytest

from specfit.engine.pricing import price
from specfit.errors import SpecFitError
from specfit.models import eos_ids
from specfit.results.records import read_prompts
from specfit.speculative.loading import load
from specfit.speculative.request import Limits
from specfit.speculative.sampling import Sampling
from specfit.speculative.stream import StreamSpec
from specfit.stages.tune import decode_priced

EMULATE = {"name": "A100", "fixed_ms": 74.02, "token_ms": 1.423, "expert_ms": 4.786, "copy_ms": 4.575,
           "draft_ms": 10.24}


def spec(slots, emulate=EMULATE, link=None):
    return StreamSpec.from_dict({
        "method": {"name": "eagle3", "k_max": 6, "max_depth": 3, "top_k_expand": 2}, "slots": slots,
        "max_inflight": 2, "link": link, "emulate": emulate, "torch_device": "cpu", "dtype": "float32",
        "limit_tokens": 40, "max_new_tokens": 12, "seed": 0, "warmup_tokens": 3, "model": "tiny",
        "logits_dtype": "model", "verify": "exact"})


def decode_all(loaded, prompts, clocks=()):
    limits = Limits(40, 12, eos_ids(loaded.model), Sampling.of(None))
    loaded.warm_up(prompts[0], limits, 3)
    return [decode_priced(loaded, p, limits, list(clocks)) for p in prompts]


def modelled(timeline) -> tuple:
    """What a timeline modelled since its counters were reset (the warm-up's end): decode forwards, prefill, drafter
    forwards (their CPU seconds aside, the only thing measured) and the copy stall."""
    return ({k: v for k, v in timeline.target.as_dict().items() if k != "cpu_s"}, timeline.prefill.modelled_s,
            timeline.drafter.modelled_s, timeline.copy_stall_s)


def test_a_priced_slot_count_clocks_what_its_own_run_clocks(files):
    prompts = read_prompts(files["prompts"], None)
    loaded = load(spec(4), files, {})
    clocks = {s: price(loaded.engine, s) for s in (0, 2, 4)}
    priced = decode_all(loaded, prompts, clocks.values())
    for s, clock in clocks.items():
        alone = load(spec(s), files, {})
        own = decode_all(alone, prompts)
        assert [r.request["output_ids"] for r, _ in own] == [r.request["output_ids"] for r, _ in priced]
        assert modelled(clock) == modelled(alone.engine.timeline)  # bit for bit
        # its caches hold what that run's hold
        assert [list(c.slot_of) for c in loaded.engine.priced[list(clocks).index(s)].caches] == \
            [list(layer.cache.slot_of) for layer in alone.engine.layers]
    # the engine's own slot count priced beside it reads the request's own times
    for result, times in priced:
        assert times[2] == {k: result.request[k] for k in ("t_request_s", "t_prefill_s")}
    without, cached = modelled(clocks[0]), modelled(clocks[4])
    assert without[0]["modelled_s"] > cached[0]["modelled_s"]  # no cache: every forward copies its union


def test_pricing_needs_a_modelled_clock(files):
    loaded = load(spec(4, emulate=None, link={"bandwidth_gbps": 1.0, "latency_us": 10}), files, {})
    with pytest.raises(SpecFitError, match="only an emulated device's virtual clock prices other slot counts"):
        price(loaded.engine, 0)
