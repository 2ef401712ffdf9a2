"""Prefetch: experts copied ahead of a forward land in the layer's cache as that forward would admit them, never evict
a protected expert, share the link with the forward's own misses, and leave the logits as any cache state does."""


import pytest
import torch

from specfit.engine.cache import ExpertCache
from specfit.engine.device import DeviceModel, Timeline
from specfit.engine.link import LinkModel
from specfit.engine.offload import OffloadConfig, offload_experts

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]
PARAMS = {"name": "A100", "fixed_ms": 10.0, "token_ms": 0.5, "expert_ms": 1.0, "copy_ms": 2.0, "draft_ms": 1.5}
NUM_EXPERTS = 8


def test_a_prefetch_evicts_the_least_recent_unprotected_expert_and_lands_most_recent():
    cache = ExpertCache(3)
    cache.admit([0, 1, 2])  # least recent first: 0, 1, 2
    assert cache.prefetch(5, protect={0}) == (1, 1)  # 0 is protected: 1 is the victim, its slot (1) reused
    assert list(cache.slot_of) == [0, 2, 5]
    assert cache.prefetch(6, protect={0, 2, 5}) is None  # every resident expert protected: nothing moves
    assert list(cache.slot_of) == [0, 2, 5]
    hits, misses, _ = cache.admit([2, 5, 7])  # the next forward finds the prefetched expert as a hit
    assert (hits, misses) == ([2, 5], [7]) and 0 not in cache.slot_of  # 7 evicted the least recent, 0
    free = ExpertCache(2)
    assert free.prefetch(3, protect=set()) == (0, None)  # a free slot first


def tiny_ids(seed=7, n=6, device="cpu"):
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(seed)).to(device)


def routes_of(engine, model, ids):
    with engine.record_routes() as rec, torch.no_grad():
        logits = model(ids).logits
    return logits, rec.routes  # [T, L, k]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("slots", [3, 5])
def test_prefetch_changes_only_what_the_cache_holds(make_target, slots, device):
    """The same forwards with and without a prefetch before the second: logits within the cross-state tolerance of
    the un-offloaded model's, and the greedy tokens equal; the prefetched experts are the second forward's hits
    (on CUDA the copies run on the copy streams and the forward's compute stream waits for them)."""
    plain = make_target().to(device)
    ids, nxt = tiny_ids(7, device=device), tiny_ids(8, 3, device=device)
    with torch.no_grad():
        want = plain(nxt).logits
    model = make_target()
    engine = offload_experts(model, OffloadConfig(slots=slots), device=device)
    _, routes = routes_of(engine, model, nxt)  # the next forward's own routes, as a perfect predictor would give
    engine.clear_cache()
    routes_of(engine, model, ids)  # something else resident
    needed = [sorted(set(routes[:, layer].flatten().tolist())) for layer in range(engine.num_layers)]
    wanted = [(layer, e) for layer in range(engine.num_layers) for e in needed[layer]]
    resident_before = engine.resident()
    transfers_before = engine.h2d_transfers
    issued = engine.prefetch(wanted, protect=needed)
    expected_issue = sum(min(slots, len(n)) - int(resident_before[layer, n].sum())
                         for layer, n in enumerate(needed))  # each layer: what it lacks, within its slots
    assert issued == expected_issue > 0 and engine.h2d_transfers == transfers_before + issued
    got, _ = routes_of(engine, model, nxt)
    assert (got - want).abs().max().item() <= 1e-5 and torch.equal(got.argmax(-1), want.argmax(-1))
    p = engine.stats()["prefetch"]
    assert p["issued"] == issued == p["used"] and p["evicted_unused"] == p["idle"] == 0
    was_resident = sum(int(resident_before[layer, n].sum()) for layer, n in enumerate(needed))
    assert engine.last_forward["hits"] == was_resident + issued


def test_a_prefetch_never_evicts_a_protected_expert_and_settles_every_copy(make_target):
    model = make_target()
    engine = offload_experts(model, OffloadConfig(slots=3))
    routes_of(engine, model, tiny_ids(7))
    resident = engine.resident()
    protect = [set(resident[layer].nonzero()[0].tolist()) for layer in range(engine.num_layers)]
    absent = [int((~resident[0]).nonzero()[0][0])]
    assert engine.prefetch([(0, absent[0])], protect) == 0  # every slot holds a protected expert
    assert engine.resident().tolist() == resident.tolist()
    keep = [set(list(protect[layer])[:1]) for layer in range(engine.num_layers)]
    spare = [int(e) for e in (~resident[1]).nonzero()[0][:2]]
    assert engine.prefetch([(1, e) for e in spare], keep) == 2
    assert keep[1] <= set(engine.resident()[1].nonzero()[0].tolist())  # the protected one stayed
    _, routes = routes_of(engine, model, tiny_ids(9, 2))
    p = engine.stats()["prefetch"]
    used = sum(e in set(routes[:, 1].flatten().tolist()) for e in spare)
    assert p["issued"] == 2 == p["used"] + p["evicted_unused"] + p["idle"] and p["used"] == used


def test_without_a_cache_nothing_is_prefetched(make_target):
    model = make_target()
    engine = offload_experts(model, OffloadConfig(slots=0))
    assert engine.prefetch([(0, 1), (1, 2)], [set(), set()]) == 0 and engine.stats()["prefetch"]["issued"] == 0


def test_a_prefetch_over_an_emulated_link_shares_the_copy_lanes(make_target):
    """Over an emulated link the copies run on the forward's own copier lanes; the forward waits for them."""
    model = make_target()
    link = LinkModel(bandwidth_bytes_per_s=1e9, latency_s=1e-4, virtual=True)
    engine = offload_experts(model, OffloadConfig(slots=4, link=link))
    assert engine.copy_ms == pytest.approx(link.copy_s(engine.expert_bytes) * 1e3)
    assert engine.prefetch([(0, 1), (1, 2)], [set(), set()]) == 2
    routes_of(engine, model, tiny_ids())
    assert engine.stats()["link_s"] == pytest.approx(engine.h2d_transfers * link.copy_s(engine.expert_bytes))


def test_prefetched_copies_hold_the_one_link_and_a_forward_waits_only_for_what_is_left():
    """Copy 2 ms, execution 1 ms. Two prefetched copies issued at t = 0 hold the link until 2 and 4 ms; a forward
    beginning at 1 ms with fixed part 10 ms finds them landed, and its one miss queues behind them (link free at
    3 ms from its start) and is copied by 12 ms; its hit runs at once. A forward beginning at once waits for a
    prefetched hit still in flight."""
    timeline = Timeline(DeviceModel.from_spec(PARAMS), clock_s=100.0)  # the virtual clock stands at 100 s
    assert timeline.copy_ahead() == (100.0, pytest.approx(100.002))
    assert timeline.copy_ahead() == (pytest.approx(100.002), pytest.approx(100.004))
    assert timeline.backlog_ms() == pytest.approx(4.0)
    timeline.clock_s = 100.001
    timeline.begin()
    assert timeline.link_free == pytest.approx(3.0)
    cache = ExpertCache(4)
    cache.admit([0])
    _, _, steps = cache.admit([0, 1])  # hit 0, miss 1
    timeline.layer(0, 1, steps)
    # fixed 10; the miss's copy from max(3, 10) to 12 while the hit runs 10..11; the miss runs 12..13
    assert (timeline.now, timeline.link_free) == (pytest.approx(13.0), pytest.approx(12.0))
    assert timeline.stall_ms == pytest.approx(1.0)  # 11..12: execution waited for the copy
    timeline.end()
    assert timeline.copy_stall_s == pytest.approx(1e-3) and timeline.link_free_at == pytest.approx(100.013)

    timeline = Timeline(DeviceModel.from_spec(dict(PARAMS, fixed_ms=0.5)), clock_s=100.0)
    assert timeline.copy_ahead()[1] == pytest.approx(100.002)  # expert 6, prefetched
    timeline.begin()  # at once
    cache = ExpertCache(4)
    cache.admit([5, 6])
    _, _, steps = cache.admit([5, 6])  # two hits
    timeline.layer(0, 1, steps, landing={6: 100.002})
    assert timeline.now == pytest.approx(3.0)  # 5 runs 0.5..1.5; 6 lands at 2 and runs 2..3
    assert timeline.stall_ms == pytest.approx(0.5)
    assert timeline.model.layer_ms(steps, 0.0, 0.5) == (2.5, 0.0)  # both landed: no wait


def test_the_copy_time_hidden_behind_drafting_is_counted(make_target):
    """On an emulated device a prefetched expert copied before its forward began is hidden in full (copy_ms)."""
    model = make_target()
    spec = dict(PARAMS, fixed_ms=1.0, expert_ms=0.01, copy_ms=50.0)
    engine = offload_experts(model, OffloadConfig(slots=4, device=DeviceModel.from_spec(spec)))
    nxt = tiny_ids(8, 2)
    _, routes = routes_of(engine, model, nxt)
    engine.clear_cache()
    engine.reset_stats()
    needed = [sorted(set(routes[:, layer].flatten().tolist()))[:2] for layer in range(engine.num_layers)]
    issued = engine.prefetch([(layer, e) for layer in range(engine.num_layers) for e in needed[layer]], needed)
    assert issued == sum(map(len, needed)) and engine.link_backlog_ms() > 0
    assert engine.link_backlog_ms() == pytest.approx(issued * spec["copy_ms"])  # nothing moves the virtual clock
    engine.timeline.host(issued * spec["copy_ms"] * 1e-3)  # host work as long: every copy lands before the forward
    assert engine.in_flight_ms().max() == 0.0
    routes_of(engine, model, nxt)
    p = engine.stats()["prefetch"]
    assert p["used"] == issued and p["hidden_ms"] == pytest.approx(issued * spec["copy_ms"])
