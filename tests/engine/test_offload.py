import pytest
import torch

from specfit.engine.cache import ExpertCache
from specfit.engine.layer import EXPERTS_IMPLEMENTATION
from specfit.engine.link import LinkModel
from specfit.engine.offload import OffloadConfig, offload_experts

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]
NUM_EXPERTS, TOP_K = 8, 2
SLOTS = [0, 1, TOP_K - 1, TOP_K, 3, NUM_EXPERTS, NUM_EXPERTS + 4]
FAMILIES = ["qwen3_moe", "olmoe", "qwen2_moe", "mixtral"]
DTYPES = [torch.float32, torch.bfloat16]
# Cross-cache-state tolerance on the tiny targets' logits (|logit| < 1), per dtype. fp32: see CROSS_STATE_ATOL below.
# bf16: four bf16 ulps at the logits' scale (2**-8 each), for a matmul blocking that rounds one bf16 value of a split
# forward differently; seen: 0. Rounding each expert's weighted output to bf16 before the sum over the top-k (what
# the engine did under Mixtral's fp32 gate weights) moved the tree-verify logits by 0.375.
STATE_ATOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-6}


@pytest.fixture
def offloaded(make_target, forwards):
    def run(device, slots, family="qwen3_moe", implementation=None, link=None, dtype=torch.float32,
            host_compute=False):
        """(plain logits, offloaded logits, engine, recorded routes per forward) over the three forwards; by
        default a forward with misses runs in groups as the copies land (as on a GPU), not from the host rows."""
        plain = make_target(family, implementation).to(device, dtype)
        expected = forwards(plain, device)
        model = make_target(family, implementation).to(dtype)
        config = OffloadConfig(slots=slots, link=link, host_compute=host_compute)
        engine = offload_experts(model, config, device=device)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("implementation", ["eager", "batched_mm"])
def test_other_experts_implementations_run_in_groups(offloaded, assert_counters_match_lru, implementation, family,
                                                     dtype):
    expected, got, engine, recorded = offloaded("cpu", 1, family, implementation, dtype=dtype)
    for want, have in zip(expected, got):
        assert (want.float() - have.float()).abs().max().item() <= STATE_ATOL[dtype]
    assert_counters_match_lru(engine, recorded, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("slots", [0, 1, NUM_EXPERTS])
def test_families_across_cache_states(offloaded, assert_counters_match_lru, family, dtype, slots):
    """Cold, split into hit and miss groups, no cache: within the dtype's tolerance, counters as the LRU's."""
    expected, got, engine, recorded = offloaded("cpu", slots, family=family, dtype=dtype)
    for want, have in zip(expected, got):  # prefill, KV decode, tree verify
        assert have.dtype == want.dtype == dtype
        assert (want.float() - have.float()).abs().max().item() <= STATE_ATOL[dtype]
    assert_counters_match_lru(engine, recorded, slots)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_families_all_resident_and_one_group_are_bit_exact(make_target, forwards, family, dtype):
    """Per family and dtype, bit for bit the un-offloaded model: (1) a cold prefill with room for every expert,
    where each layer forward is one group of the whole union through the split path (the same matmuls as the
    target's grouped_mm call, then the engine's own weighting and sum over the top-k: Mixtral's fp32 gate weights
    over bf16 states check that it is the target's arithmetic); (2) every forward with all its experts resident,
    which is one call of the target's own implementation."""
    plain = make_target(family).to(dtype)
    want = forwards(plain)
    model = make_target(family).to(dtype)
    engine = offload_experts(model, OffloadConfig(slots=NUM_EXPERTS, host_compute=False))
    have = forwards(model)  # a fresh engine: the prefill is all misses, one group per layer
    assert torch.equal(have[0], want[0])  # (1)
    engine.reset_stats()
    have = forwards(model)  # the same tokens again: every expert they route to is resident
    stats = engine.stats()
    assert stats["misses"] == 0 and stats["hits"] == stats["demand"] > 0
    assert all(torch.equal(h, w) for h, w in zip(have, want))  # (2) prefill, KV decode, tree verify


def test_mixtral_gate_weights_are_float32_under_bf16(make_target):
    """The premise of the split path's arithmetic for Mixtral: its router returns fp32 gate weights over bf16 states
    (Qwen3-MoE's are cast to the states' dtype), so grouped_mm sums the top-k in fp32 and rounds once."""
    for family, want in (("mixtral", torch.float32), ("qwen3_moe", torch.bfloat16)):
        model = make_target(family).to(torch.bfloat16)
        gate = next(m for name, m in model.named_modules() if name.endswith("mlp.gate"))
        _, weights, _ = gate(torch.randn(3, model.config.hidden_size, dtype=torch.bfloat16))
        assert weights.dtype == want, family


@pytest.mark.parametrize("implementation", ["sonicmoe", "deepgemm"])
def test_unknown_experts_implementation_is_refused(make_target, implementation):
    model = make_target(experts_implementation=implementation)
    with pytest.raises(ValueError, match="not supported by the offload engine"):
        offload_experts(model, OffloadConfig(slots=1))


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


# Cross-cache-state tolerance on fp32 logits of magnitude ~1: a split forward only reassociates the sum over the
# top-k experts and changes which rows a matmul computes together (its blocking on some CPUs), a few ulps (~1e-7)
# per value, a few times 1e-7 after 2 layers and the LM head. 1e-5 is ~30x what is seen and >100x below what
# computing one expert wrong does (checked below).
CROSS_STATE_ATOL = 1e-5
_top4: list = []


def top4_target():
    """A fresh copy of a tiny Qwen3-MoE, top-4 of 8 (so a forward can split into several groups), its expert
    weights large enough (std 0.2) that every expert visibly moves the logits."""
    import copy

    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    if not _top4:
        torch.manual_seed(0)
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=4,
            attn_implementation="sdpa")).eval()
        for module in model.modules():
            for name in ("gate_up_proj", "down_proj"):
                param = getattr(module, name, None)
                if isinstance(param, torch.nn.Parameter) and param.dim() == 3:
                    torch.nn.init.normal_(param, std=0.2)
        _top4.append(model)
    return copy.deepcopy(_top4[0])


IDS = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(5))
WARM = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(6))


def offloaded_forward(slots: int, history: torch.Tensor | None, swap: tuple[int, int] | None = None,
                      host_compute: bool = False):
    """(logits [1, T, V], routes [T, L, k], stats) of the IDS forward after ``history`` warmed the cache;
    ``swap``: two experts whose host rows trade places in the last layer (a wrong expert computed)."""
    model = top4_target()
    engine = offload_experts(model, OffloadConfig(slots=slots, host_compute=host_compute))
    if swap is not None:
        for rows in engine.layers[-1].host.values():
            rows[list(swap)] = rows[list(swap[::-1])].clone()
    with torch.no_grad():
        if history is not None:
            model(history)
        engine.reset_stats()
        with engine.record_routes() as rec:
            logits = model(IDS).logits
    return logits, rec.routes, engine.stats()


@pytest.mark.parametrize("host_compute", [False, None], ids=["slot rows", "host rows"])
def test_all_hit_forward_is_the_targets_own_call_and_bits(host_compute):
    """Every expert resident (the atlas build's steady state): one call of the target's own experts implementation
    per layer over the slot rows (a GPU's path), or over the host rows where the engine computes there (a CPU's
    default, `OffloadConfig.host_compute`), so the logits are bit-identical to the un-offloaded model's."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    plain = top4_target()
    with torch.no_grad():
        want = plain(IDS).logits
    model = top4_target()
    engine = offload_experts(model, OffloadConfig(slots=NUM_EXPERTS, host_compute=host_compute))
    calls = []
    for layer in engine.layers:
        assert layer.inner is ALL_EXPERTS_FUNCTIONS[plain.config._experts_implementation]  # the target's own
        rows = layer.host_view if engine.host_compute else layer.views[0]
        layer.inner = lambda view, *args, _inner=layer.inner, _layer=layer, _rows=rows: (
            calls.append((_layer.index, view is _rows)) or _inner(view, *args)
        )
    with torch.no_grad():
        model(IDS)  # loads every expert IDS needs
        calls.clear()
        engine.reset_stats()
        have = model(IDS).logits
    stats = engine.stats()
    assert stats["misses"] == 0 and stats["hits"] == stats["demand"] > 0
    assert calls == [(0, True), (1, True)]  # one whole-union call per layer: no groups, no sentinels
    assert torch.equal(have, want)


def test_cache_state_changes_logits_only_within_rounding_and_never_routes_or_tokens():
    """What holds on every CPU across cache states (cold, warm and split into hit and miss groups, no cache):
    logits within CROSS_STATE_ATOL of the all-resident ones, the same routes and the same greedy tokens. Bit
    equality does not hold everywhere: the rows computed together change a matmul's blocking on some CPUs."""
    reference, ref_routes, _ = offloaded_forward(NUM_EXPERTS, IDS)  # all resident, all hits
    with torch.no_grad():
        plain = top4_target()(IDS, output_router_logits=True)
    assert torch.equal(reference, plain.logits)
    # the inputs hold no near-tie, so equal routes and tokens follow from the tolerance on every machine
    top2 = reference[0].topk(2, dim=-1).values  # [T, 2]
    assert (top2[:, 0] - top2[:, 1]).min().item() > 100 * CROSS_STATE_ATOL
    for router in plain.router_logits:  # [T, E]: k-th vs (k+1)-th router logit
        ranked = router.sort(dim=-1, descending=True).values
        assert (ranked[:, 3] - ranked[:, 4]).min().item() > 1e-4

    states = {"cold": (NUM_EXPERTS, None), "warm, 2 slots": (2, WARM), "warm, 5 slots": (5, WARM),
              "no cache": (0, None)}
    for name, (slots, history) in states.items():
        logits, routes, stats = offloaded_forward(slots, history)
        if history is not None:  # split into hit and miss groups
            assert 0 < stats["hits"] and 0 < stats["misses"], name
        assert (logits - reference).abs().max().item() <= CROSS_STATE_ATOL, name
        assert torch.equal(routes, ref_routes), name
        assert torch.equal(logits.argmax(-1), reference.argmax(-1)), name

    # the tolerance is meaningful: computing one expert wrong (two experts' host rows swapped in the last layer, so
    # the routes stay the router's) moves the logits by far more, in a split forward as in a cold one
    for slots, history in ((2, WARM), (NUM_EXPERTS, None)):
        logits, routes, _ = offloaded_forward(slots, history, swap=(1, 2))
        assert torch.equal(routes, ref_routes)
        assert (logits - reference).abs().max().item() > 100 * CROSS_STATE_ATOL


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm", "eager"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_host_compute_is_the_unoffloaded_model_bit_for_bit_at_every_cache_state(make_target, forwards, family, dtype,
                                                                                implementation):
    """A CPU engine's default (`OffloadConfig.host_compute`): every forward computes its union from the host rows in
    one call, so prefill, KV decode and tree verify are the un-offloaded model's bits at every cache state, with the
    counters and LRU order of the grouped forwards a GPU runs; its copies are counted, none is made (its slot rows
    stay as allocated, where the grouped engine's hold its resident experts)."""
    want = forwards(make_target(family, implementation).to(dtype))
    for slots in (0, 1, 3, NUM_EXPERTS):
        engines, results = [], []
        for host_compute in (None, False):
            model = make_target(family, implementation).to(dtype)
            engines.append(offload_experts(model, OffloadConfig(slots=slots, host_compute=host_compute)))
            results.append(forwards(model))
        default, grouped = engines
        assert default.host_compute and not grouped.host_compute
        assert all(torch.equal(h, w) for h, w in zip(results[0], want)), (family, dtype, slots)
        counted = [{k: v for k, v in e.stats().items() if not k.endswith("_s")} for e in engines]  # not wall times
        assert counted[0] == counted[1]
        for mine, theirs in zip(default.layers, grouped.layers):
            assert mine.cache.slot_of == theirs.cache.slot_of  # OrderedDicts: the LRU order too
            assert all(not mine.slots[n].any() for n in mine.slots)  # never written
            for e, slot in theirs.cache.slot_of.items() if slots else ():  # the grouped engine's resident experts
                assert all(torch.equal(theirs.slots[n][slot], theirs.host[n][e]) for n in theirs.slots)
        if slots:
            assert counted[0]["h2d_transfers"] > 0  # copies counted, at every slot count that has a cache


def test_host_compute_is_refused_off_the_cpu(make_target):
    with pytest.raises(ValueError, match="host_compute is for a CPU engine"):
        offload_experts(make_target(), OffloadConfig(slots=2, host_compute=True), device="meta")
