"""A prompt's prefill computed once and replayed (`specfit.speculative.prefill.SharedPrefills`), as the tune stage's
sweep does for every tree after the first: a replayed request must decode what a computed one decodes, and the engine
must count and clock what it counts and clocks, to the last bit of the modelled time, at its own slot count and at
every slot count priced beside it."""

import pytest
from test_priced_slots import modelled, spec  # beside it (pytest puts this folder on the path)

from specfit.engine.pricing import price
from specfit.engine.replay import replay_forwards
from specfit.errors import SpecFitError
from specfit.models import eos_ids
from specfit.results.records import read_prompts
from specfit.speculative.config import MethodConfig
from specfit.speculative.loading import load
from specfit.speculative.methods import build_method
from specfit.speculative.prefill import SharedPrefills
from specfit.speculative.request import Limits
from specfit.speculative.sampling import Sampling
from specfit.stages.tune import decode_priced

TREES = ({"k_max": 6, "max_depth": 3, "top_k_expand": 2}, {"k_max": 2, "max_depth": 2, "top_k_expand": 1},
         {"k_max": 4, "max_depth": 2, "top_k_expand": 2})
TIMES = ("t_draft_s", "t_select_s", "t_verify_s", "t_commit_s")  # host work inside: measured, never equal


def sweep(files, prompts, share: bool, sampling=None):
    """Every tree of `TREES` over ``prompts`` as the tune stage sweeps them (an empty cache at each tree's start),
    at 2 slots with 0 priced beside; per tree its requests, cycles (measured times aside), the engine's counters
    and modelled clocks, and the caches; and the forwards the target computed."""
    loaded = load(spec(2), files, {})
    clock = price(loaded.engine, 0)
    computed = []
    loaded.model.get_decoder().register_forward_hook(lambda *_: computed.append(1))
    limits = Limits(40, 12, eos_ids(loaded.model), Sampling.of(sampling))
    loaded.warm_up(prompts[0], limits, 3)
    prefills = SharedPrefills.for_engine(loaded.engine) if share else None
    rows = []
    for tree in TREES:
        loaded.method = build_method(MethodConfig(name="eagle3", **tree), files, 0, loaded.engine.num_experts)
        loaded.reset()
        results = [decode_priced(loaded, p, limits, [clock], prefills) for p in prompts]
        stats = loaded.engine.stats()
        rows.append({
            "requests": [{**r.request, "t_request_s": None} for r, _ in results],
            "cycles": [{k: v for k, v in c.items() if k not in TIMES} for r, _ in results for c in r.cycles],
            "counters": {k: stats[k] for k in ("h2d_transfers", "hits", "misses", "demand", "per_layer")},
            "modelled": modelled(loaded.engine.timeline), "priced": modelled(clock),
            "caches": [list(layer.cache.slot_of) for layer in loaded.engine.layers],
            "priced_caches": [list(c.slot_of) for c in loaded.engine.priced[0].caches],
        })
    return rows, len(computed), prefills


@pytest.mark.parametrize("sampling", [None, {"temperature": 1.0, "sampling": "coupled"}], ids=["greedy", "coupled"])
def test_a_replayed_prefill_decodes_counts_and_clocks_as_a_computed_one(files, sampling):
    prompts = read_prompts(files["prompts"], None)[:3]
    computed, forwards, _ = sweep(files, prompts, share=False, sampling=sampling)
    replayed, forwards_shared, prefills = sweep(files, prompts, share=True, sampling=sampling)
    assert prefills.replayed == len(prompts) * (len(TREES) - 1)
    assert forwards - forwards_shared == prefills.replayed  # those prefills computed nothing
    for ours, theirs in zip(replayed, computed):
        for r, their in zip(ours["requests"], theirs["requests"]):
            r["t_prefill_s"] = pytest.approx(their["t_prefill_s"], rel=1e-12)  # modelled, on another clock base
        assert ours == theirs
    assert computed[0]["counters"]["h2d_transfers"] > 0


def test_a_forward_is_replayed_only_on_a_modelled_clock(files):
    loaded = load(spec(2, emulate=None, link={"bandwidth_gbps": 1.0, "latency_us": 10}), files, {})
    assert SharedPrefills.for_engine(loaded.engine) is None
    with pytest.raises(SpecFitError, match="a forward is replayed only on an emulated device's virtual clock"):
        replay_forwards(loaded.engine, [("drafter", 3)])
