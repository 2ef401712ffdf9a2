"""Which side of the virtual clock each part of a cycle is on (docs/device.md): drafting, verification and commit are
the device's (their modelled costs, whatever the CPU took), selection and route prediction the host's (their measured
wall time); nothing else moves the clock, and nothing sleeps."""

import copy
import time

import numpy as np
import pytest

from specfit.engine.offload import make_engine
from specfit.speculative.config import MethodConfig
from specfit.speculative.cycle import HOST_SECTIONS
from specfit.speculative.methods import SpecFit, build_method
from specfit.speculative.request import SECTIONS, decode_request

B = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]
# a slow GPU, so that the toy's CPU time is far below every modelled cost
PARAMS = {"name": "A100", "fixed_ms": 500.0, "token_ms": 10.0, "expert_ms": 20.0, "copy_ms": 30.0, "draft_ms": 100.0}
HOST_S = 0.002  # what the route source below takes per query, as a learned predictor would


class SlowRoutes:
    """Routes from the token ids (a stand-in for a route predictor) that take ``HOST_S`` of host time per query."""

    full_pool = False

    def __init__(self, layers: int, top_k: int, experts: int):
        self.layers, self.top_k, self.experts = layers, top_k, experts

    def routes(self, cycle, pool):
        time.sleep(HOST_S)
        token = np.asarray(pool.token)[:, None, None]  # [n+1, 1, 1]
        offsets = np.arange(self.layers)[None, :, None] * 3 + np.arange(self.top_k)[None, None, :]
        return (token + offsets) % self.experts  # [n+1, L, k]


def decode(model, drafter, method, prompts, limits, engine=None):
    return [decode_request(model, drafter, method, p, request_id=i, question_id=i, limits=limits, engine=engine)
            for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def emulated(target):
    model = copy.deepcopy(target)
    engine = make_engine(model, slots=4, emulate=PARAMS)
    yield model, engine
    engine.close()


def test_each_part_of_a_cycle_is_on_its_side_of_the_clock(emulated, drafter, prompts, limits, target):
    model, engine = emulated
    drafter = copy.deepcopy(drafter)
    engine.emulate_drafter(drafter)
    routes = SlowRoutes(engine.num_layers, engine.top_k, engine.num_experts)
    reference = [r.request["output_ids"] for r in decode(target, None, build_method({"name": "ar"}), prompts, limits)]
    engine.reset_stats()
    clock_start, wall_start = engine.timeline.clock_s, time.perf_counter()
    method = SpecFit(MethodConfig("specfit"), B, 0.05, routes, num_experts=engine.num_experts)
    results = decode(model, drafter, method, prompts, limits, engine)
    wall = time.perf_counter() - wall_start
    assert [r.request["output_ids"] for r in results] == reference  # lossless on the virtual clock too
    assert HOST_SECTIONS == {"select"}

    device = engine.stats()["device"]
    cycles = [c for r in results for c in r.cycles]
    requests = [r.request for r in results]
    modelled = sum(device[k]["modelled_s"] for k in ("target", "prefill", "drafter", "drafter_prefill"))
    # the clock moved by the modelled forwards and the measured host work, nothing else
    assert engine.timeline.clock_s - clock_start == pytest.approx(modelled + device["host_s"], rel=1e-12)
    assert sum(r["t_request_s"] for r in requests) == pytest.approx(engine.timeline.clock_s - clock_start, rel=1e-12)
    assert wall < modelled  # nothing slept: the CPU ran ahead of the modelled time (tens of seconds of it)
    for r in results:  # a request's time is its prefill and its cycles' sections, and nothing between them
        t = r.request["t_prefill_s"] + sum(c[f"t_{k}_s"] for c in r.cycles for k in SECTIONS)
        assert r.request["t_request_s"] == pytest.approx(t, rel=1e-12)
    # device side: prefill, drafting and verification are the modelled forwards, commit adds nothing
    device_s = sum(r["t_prefill_s"] for r in requests) + sum(c["t_draft_s"] + c["t_verify_s"] for c in cycles)
    assert device_s == pytest.approx(modelled, rel=1e-9)
    for c in cycles:  # a drafter forward a level, the first drafted by the catch-up (after prefill: in prefill's)
        forwards = c["drafted_levels"] - (c["cycle"] == 0 and c["drafted_levels"] > 0)
        assert c["t_draft_s"] == pytest.approx(forwards * PARAMS["draft_ms"] * 1e-3, rel=1e-9)
        assert c["t_commit_s"] == 0.0  # KV pruning at commit: inside the device's b_k
        assert c["t_verify_s"] >= (PARAMS["fixed_ms"] + PARAMS["token_ms"] * len(c["selected"])) * 1e-3
    # host side: every drafted level's selection queried the routes, and took at least that long
    drafted = [c for c in cycles if c["drafted_levels"] > 0]
    assert drafted and all(c["t_select_s"] >= HOST_S * c["drafted_levels"] for c in drafted)
    assert device["host_s"] == pytest.approx(sum(c["t_select_s"] for c in cycles), rel=1e-9)
    assert device["target"]["cpu_s"] > 0  # the CPU's time is kept, for information only

