"""`specfit.models.precision.upcast_logits` on a tiny bf16 Qwen3-MoE: float32 logits of the same hidden states in
every forward (prefill, AR step, tree verify), the bf16 logit ties resolved as a float32 head resolves them, and
nothing else changed."""

import copy

import pytest
import torch
from torch.nn import functional as F

from specfit.models.precision import apply_logits_dtype, final_norm, upcast_logits
from specfit.speculative.tree import tree_mask, tree_positions

VOCAB = 256
PROMPT = torch.randint(0, VOCAB, (1, 160), generator=torch.Generator().manual_seed(7))
PARENT = [-1, 0, 0, 1, 1, 2, 3]  # root + 6 nodes, parents first
DEPTH = [0, 1, 1, 2, 2, 2, 3]


@pytest.fixture(scope="module")
def bf16_target(target):
    """The shared tiny Qwen3-MoE target (tests/conftest.py) in bf16."""
    return copy.deepcopy(target).to(torch.bfloat16)


def three_forwards(model, **kwargs):
    """Prefill, one AR step on the KV cache, a 7-row tree verify: their outputs."""
    with torch.no_grad():
        prefill = model(PROMPT, use_cache=True, **kwargs)
        step = model(PROMPT[:, :1], cache=prefill.cache, use_cache=True, **kwargs)
        past = PROMPT.shape[1] + 1
        verify = model(
            PROMPT[:, 1:8], attention_mask=tree_mask(PARENT, past, model.dtype, "cpu"),
            position_ids=tree_positions(DEPTH, past, "cpu"), cache=step.cache, use_cache=True, **kwargs,
        )
    return [prefill, step, verify]


def head_inputs(model, **kwargs):
    """The final norm's input (the last decoder layer's output) in each of the three forwards."""
    seen = []
    hook = final_norm(model).register_forward_pre_hook(lambda _m, args: seen.append(args[0]), prepend=True)
    try:
        outs = three_forwards(model, **kwargs)
    finally:
        hook.remove()
    return outs, seen


def with_router_outputs(model, **kwargs):
    """The three forwards, and every router's (logits, weights, expert ids) in them."""
    seen = []
    gates = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
    hooks = [g.register_forward_hook(lambda _m, _args, out: seen.append(out)) for g in gates]
    try:
        return three_forwards(model, **kwargs), seen
    finally:
        for hook in hooks:
            hook.remove()


def float32_head(model, hidden: torch.Tensor) -> torch.Tensor:
    """The reference: RMSNorm and LM head of ``hidden`` computed in float32 by hand."""
    norm = final_norm(model)
    h = hidden.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return F.linear(norm.weight.float() * h, model.lm_head.weight.float())


def test_every_forward_gives_float32_logits_of_the_same_hidden_states(bf16_target):
    model = copy.deepcopy(bf16_target)
    plain, plain_hidden = head_inputs(bf16_target)
    handle = upcast_logits(model)
    upcast, hidden = head_inputs(model)
    for p, u, hp, hu in zip(plain, upcast, plain_hidden, hidden):  # prefill, AR step, tree verify
        assert p.logits.dtype == torch.bfloat16 and u.logits.dtype == torch.float32
        assert torch.equal(hp, hu) and hu.dtype == torch.bfloat16  # the layers are untouched
        assert torch.equal(u.logits, float32_head(model, hu))
    handle.remove()
    restored = three_forwards(model)
    assert all(torch.equal(p.logits, r.logits) for p, r in zip(plain, restored))


def test_bf16_ties_resolve_as_the_float32_head_resolves_them(bf16_target):
    """bf16 logits tie exactly at some positions (argmax then takes the lower token id); float32 logits do not,
    and their argmax is the float32 reference's everywhere."""
    plain, hidden = head_inputs(bf16_target)
    model = copy.deepcopy(bf16_target)
    upcast_logits(model)
    upcast = three_forwards(model)
    ties = flips = 0
    for p, u, h in zip(plain, upcast, hidden):
        bf16, fp32 = p.logits[0], u.logits[0]  # [q, V]
        reference = float32_head(model, h)[0]
        assert torch.equal(fp32.argmax(-1), reference.argmax(-1))
        top2 = bf16.topk(2, dim=-1).values
        tied = top2[:, 0] == top2[:, 1]  # [q]
        ties += int(tied.sum())
        flips += int((bf16.argmax(-1) != reference.argmax(-1))[tied].sum())
        fp32_top2 = fp32[tied].topk(2, dim=-1).values
        assert bool((fp32_top2[:, 0] > fp32_top2[:, 1]).all())
    assert ties >= 2 and flips >= 1, (ties, flips)  # the inputs hold ties, and bf16 resolves one of them wrong


def test_nothing_else_changes(bf16_target):
    model = copy.deepcopy(bf16_target)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    embedding = model.get_input_embeddings().weight
    upcast_logits(model)
    (plain, plain_routes), (upcast, routes) = (
        with_router_outputs(m, output_hidden_states=True) for m in (bf16_target, model)
    )
    for p, u in zip(plain, upcast):
        layers = model.config.num_hidden_layers
        assert all(torch.equal(a, b) for a, b in zip(p.hidden_states[:layers], u.hidden_states[:layers]))
        assert u.hidden_states[layers].dtype == torch.float32  # the final norm's output (no drafter reads it)
    assert len(routes) == 3 * layers
    assert all(torch.equal(a, b) for pa, ua in zip(plain_routes, routes) for a, b in zip(pa, ua))
    for layer_p, layer_u in zip(plain[-1].cache.layers, upcast[-1].cache.layers):
        assert torch.equal(layer_p.keys, layer_u.keys) and torch.equal(layer_p.values, layer_u.values)
    assert model.dtype == torch.bfloat16 and model.get_input_embeddings().weight is embedding
    after = model.state_dict()
    assert sorted(after) == sorted(state) and all(torch.equal(after[k], v) for k, v in state.items())
    with pytest.raises(ValueError, match="twice"):
        upcast_logits(model)


def test_float32_model_is_unchanged_and_the_config_values(bf16_target):
    plain = copy.deepcopy(bf16_target).float()
    model = copy.deepcopy(plain)
    assert apply_logits_dtype(model, "model") is None
    apply_logits_dtype(model, "float32")
    assert all(torch.equal(p.logits, u.logits) for p, u in zip(three_forwards(plain), three_forwards(model)))
    with pytest.raises(ValueError, match="logits_dtype"):
        apply_logits_dtype(model, "float64")


def test_offloaded_target_verifies_with_float32_logits(bf16_target):
    """With the offload engine and the decode path's `Target`: prefill and a tree verify give float32 logits."""
    from specfit.engine.offload import OffloadConfig, offload_experts
    from specfit.selection.pool import CandidatePool
    from specfit.speculative.request import Limits, Session

    model = copy.deepcopy(bf16_target)
    upcast_logits(model)
    engine = offload_experts(model, OffloadConfig(slots=2))
    session = Session(model, None, PROMPT[0].tolist(), Limits(10_000, 10_000, frozenset()), engine=engine)
    with torch.inference_mode():
        logits, _ = session.target.forward(PROMPT[0].tolist())
        assert logits.dtype == torch.float32
        root = int(logits[-1].argmax())
        pool = CandidatePool.root_only(root)
        verdict = session.verify(pool, (), {})
    assert verdict.past_len == PROMPT.shape[1] and engine.stats()["forwards"] == 2
