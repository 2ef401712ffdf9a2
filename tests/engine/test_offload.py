import pytest
import torch

from specfit.engine import EXPERTS_IMPLEMENTATION, ExpertCache, LinkModel, OffloadConfig, offload_experts

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]
NUM_EXPERTS, TOP_K = 8, 2
SLOTS = [0, 1, TOP_K - 1, TOP_K, 3, NUM_EXPERTS, NUM_EXPERTS + 4]


@pytest.fixture
def offloaded(make_target, forwards):
    def run(device, slots, family="qwen3_moe", implementation=None, link=None):
        """(plain logits, offloaded logits, engine, recorded routes per forward) over the three forwards."""
        plain = make_target(family, implementation).to(device)
        expected = forwards(plain, device)
        model = make_target(family, implementation)
        engine = offload_experts(model, OffloadConfig(slots=slots, link=link), device=device)
        with engine.record_routes() as rec:
            got = forwards(model, device)
        return expected, got, engine, rec.forwards

    return run


@pytest.fixture
def assert_counters_match_lru(lru):
    def check(engine, recorded, slots):
        stats = engine.stats()
        sim = lru(recorded, slots, engine.num_experts)
        assert stats["per_layer"]["hits"] == sim["hits"]
        assert stats["per_layer"]["misses"] == sim["misses"]
        assert stats["per_layer"]["demand"] == sim["demand"]
        assert stats["per_layer"]["h2d_transfers"] == sim["misses"]
        assert stats["h2d_transfers"] == stats["misses"] == sum(sim["misses"])
        assert stats["hits"] == sum(sim["hits"]) and stats["demand"] == sum(sim["demand"])
        assert stats["h2d_bytes"] == stats["h2d_transfers"] * engine.expert_bytes

    return check


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("slots", SLOTS)
def test_logits_equal_plain_and_counters_match_lru(offloaded, assert_counters_match_lru, device, slots):
    expected, got, engine, recorded = offloaded(device, slots)
    for want, have in zip(expected, got):  # prefill, KV decode, tree verify
        assert (want - have).abs().max().item() <= 1e-5
    assert [f.shape[0] for f in recorded] == [10, 1, 5]
    assert recorded[0].shape[1:] == (engine.num_layers, engine.top_k) == (2, TOP_K)
    assert_counters_match_lru(engine, recorded, slots)
    stats = engine.stats()
    assert stats["forwards"] == 3
    if slots == 0:
        assert stats["hits"] == 0 and stats["misses"] == stats["demand"]
    if slots >= NUM_EXPERTS:  # never evicts: each expert is loaded at most once per layer
        assert all(m <= NUM_EXPERTS for m in stats["per_layer"]["misses"])


@pytest.mark.parametrize("implementation", ["eager", "batched_mm"])
def test_other_experts_implementations_run_in_groups(offloaded, assert_counters_match_lru, implementation):
    expected, got, engine, recorded = offloaded("cpu", 1, implementation=implementation)
    for want, have in zip(expected, got):
        assert (want - have).abs().max().item() <= 1e-5
    assert_counters_match_lru(engine, recorded, 1)


@pytest.mark.parametrize("family", ["olmoe", "qwen2_moe", "mixtral"])
@pytest.mark.parametrize("slots", [0, 1, NUM_EXPERTS])
def test_other_families(offloaded, assert_counters_match_lru, family, slots):
    expected, got, engine, recorded = offloaded("cpu", slots, family=family)
    for want, have in zip(expected, got):
        assert (want - have).abs().max().item() <= 1e-5
    assert_counters_match_lru(engine, recorded, slots)


def test_experts_matter_and_routes_are_the_routers(make_target):
    """The equality above is not vacuous: the routed experts move the logits, and the routes are the router's."""
    model = make_target()
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = model(ids, output_router_logits=True)
    engine = offload_experts(model, OffloadConfig(slots=TOP_K))
    with torch.no_grad(), engine.record_routes() as rec:
        model(ids)
    router_topk = torch.stack([logits.topk(TOP_K, dim=-1).indices for logits in plain.router_logits], dim=1)
    assert torch.equal(rec.routes.sort(-1).values, router_topk.sort(-1).values)  # [T, L, k]
    for layer in engine.layers:  # wrong weights in every host row
        for rows in layer.host.values():
            rows.mul_(-1)
    engine.clear_cache()
    with torch.no_grad():
        broken = model(ids).logits
    assert (broken - plain.logits).abs().max().item() > 1e-2


def test_last_forward_and_reset(make_target):
    model = make_target()
    engine = offload_experts(model, OffloadConfig(slots=TOP_K))
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model(ids)
        first = engine.last_forward
        model(ids)  # same routes again: the last layer forward's experts are resident
    second = engine.last_forward
    total = engine.stats()
    assert total["demand"] == first["demand"] + second["demand"]
    assert total["misses"] == first["misses"] + second["misses"]
    assert second["demand"] == first["demand"]
    engine.reset_stats()
    assert engine.stats()["h2d_transfers"] == 0 and engine.stats()["forwards"] == 0
    engine.clear_cache()
    with torch.no_grad():
        model(ids)
    assert engine.last_forward["hits"] == 0 and engine.stats()["clear_s"] > 0


def test_no_cache_clears_before_every_forward_and_times_it(make_target):
    model = make_target()
    engine = offload_experts(model, OffloadConfig(slots=0))
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        model(ids)
        with engine.record_routes() as rec:
            model(ids)
    stats = engine.stats()
    assert stats["hits"] == 0 and stats["clear_s"] > 0
    routes = rec.routes  # [6, L, k]
    union = sum(len(set(routes[:, layer].flatten().tolist())) for layer in range(routes.shape[1]))
    # each expert of the per-layer union loaded once, though tokens share experts (fewer loads than entries)
    assert engine.last_forward["h2d_transfers"] == engine.last_forward["demand"] == union < routes.numel()


def test_emulated_link_is_labelled_and_accounted(offloaded):
    link = LinkModel(bandwidth_bytes_per_s=1e9, latency_s=1e-4, virtual=True)
    _, _, engine, _ = offloaded("cpu", TOP_K, link=link)
    stats = engine.stats()
    assert engine.link_emulated and stats["link_emulated"] and "emulated link" in engine.timing_label
    assert stats["link_s"] == pytest.approx(stats["h2d_transfers"] * link.copy_s(engine.expert_bytes))


def test_plan_runs_in_groups_when_demand_exceeds_slots():
    cache = ExpertCache(2)
    hits, misses, steps = cache.admit([0, 1])
    assert (hits, misses) == ([], [0, 1])
    assert steps == [("load", [(0, 0), (1, 1)]), ("compute", [(0, 0), (1, 1)], True)]
    hits, misses, steps = cache.admit([1, 3, 4, 5])
    # 1 is resident (most recent now); 3 evicts 0, 4 evicts the hit 1 once it was computed, 5 evicts 3.
    assert (hits, misses) == ([1], [3, 4, 5])
    assert steps == [
        ("load", [(3, 0)]),
        ("compute", [(1, 1)], False),
        ("load", [(4, 1)]),
        ("compute", [(3, 0), (4, 1)], True),
        ("load", [(5, 0)]),
        ("compute", [(5, 0)], True),
    ]
    assert list(cache.slot_of.items()) == [(4, 1), (5, 0)]


def test_model_is_registered_and_keeps_its_weights(make_target):
    model = make_target()
    names = sorted(model.state_dict())
    engine = offload_experts(model, OffloadConfig(slots=1))
    assert model.config._experts_implementation == EXPERTS_IMPLEMENTATION
    assert sorted(model.state_dict()) == names
    assert engine.expert_bytes == (2 * 32 * 64 + 64 * 32) * 4
    with pytest.raises(ValueError):
        offload_experts(model, OffloadConfig(slots=1))


@pytest.mark.gpu
@CUDA
def test_cuda_host_storage_is_pinned(make_target):
    model = make_target()
    engine = offload_experts(model, OffloadConfig(slots=TOP_K), device="cuda")
    assert all(rows.is_pinned() for layer in engine.layers for rows in layer.host.values())
    assert all(rows.is_cuda for layer in engine.layers for rows in layer.slots.values())
    assert model.lm_head.weight.is_cuda


def test_logits_do_not_depend_on_what_the_cache_holds():
    """Bit-identical logits whatever the cache state: an atlas build (every expert resident) and a measured run
    (a small, warm LRU that splits forwards into hit and miss groups) must see the same pools. Top-4, so that a
    sum over groups in another order would round differently."""
    import copy

    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    base = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=4,
        attn_implementation="sdpa")).eval()
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(5))
    warm = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(6))
    logits = []
    # every expert resident (all hits: the target's own path), cold, warm and split into groups, no cache
    for slots, history in ((8, ids), (8, None), (2, warm), (5, warm), (0, None)):
        model = copy.deepcopy(base)
        offload_experts(model, OffloadConfig(slots=slots))
        with torch.no_grad():
            if history is not None:
                model(history)  # leaves some of the experts `ids` needs resident, others not
            logits.append(model(ids).logits)
    assert all(torch.equal(logits[0], other) for other in logits[1:])
