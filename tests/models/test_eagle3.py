import pytest
import torch
from transformers import DynamicCache

from specfit.errors import SpecFitError
from specfit.models.checkpoint import tensor_shapes
from specfit.models.eagle3 import Eagle3Drafter, aux_hidden_states
from specfit.models.speculators import default_aux_layer_ids
from specfit.speculative.tree import tree_mask, tree_positions

# speculators variants: (model_type, decoder layers, options); each must keep the stepping invariants below
VARIANTS = [
    ("llama", 1, {}),
    ("llama", 2, {"norm_output": True}),
    ("qwen3", 1, {"norm_before_fc": True, "norm_before_residual": True}),
    ("llama", 1, {"fc_norm": True, "norm_output": True}),
]
VARIANT_IDS = ["plain", "2layers-norm_output", "qwen3-norm_before_fc", "fc_norm-norm_output"]


def _rms(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _inputs(drafter, B=2, T=9, seed=3):
    g = torch.Generator().manual_seed(seed)
    V = drafter.embed_tokens.num_embeddings
    H = drafter.fc.out_features
    ids = torch.randint(0, V, (B, T), generator=g)  # [B, T]
    hidden = torch.randn(B, T, H, generator=g)  # [B, T, H]
    pos = torch.arange(T)[None].expand(B, -1)  # [B, T]
    return ids, hidden, pos


@pytest.mark.parametrize(("model_type", "layers", "options"), VARIANTS, ids=VARIANT_IDS)
def test_round_trip_keeps_predictions(moe_target, tmp_path, model_type, layers, options, make_drafter):
    drafter = make_drafter(moe_target, model_type=model_type, layers=layers, **options)
    drafter.save_pretrained(tmp_path)
    loaded = Eagle3Drafter.from_pretrained(tmp_path)
    ids, hidden, pos = _inputs(drafter)
    with torch.no_grad():
        logits, out = drafter(ids, hidden, pos)
        logits2, out2 = loaded(ids, hidden, pos)
    assert torch.equal(logits, logits2) and torch.equal(out, out2)
    assert loaded.aux_layer_ids == (2, 3, 3) and loaded.draft_vocab_size == 48
    assert torch.equal(loaded.d2t, drafter.d2t) and torch.equal(loaded.t2d, drafter.t2d)


def test_embed_tokens_taken_from_target(moe_target, tmp_path, make_drafter):
    drafter = make_drafter(moe_target)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(moe_target.get_input_embeddings().weight)
    drafter.embed_from_target = True
    drafter.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert "embed_tokens.weight" not in f.keys()
    with pytest.raises(SpecFitError, match="embed_tokens"):
        Eagle3Drafter.from_pretrained(tmp_path)
    loaded = Eagle3Drafter.from_pretrained(tmp_path, target=moe_target)
    ids, hidden, pos = _inputs(drafter)
    with torch.no_grad():
        assert torch.equal(drafter(ids, hidden, pos)[0], loaded(ids, hidden, pos)[0])


def test_default_aux_layers_come_from_the_target(moe_target, tmp_path, make_drafter):
    drafter = make_drafter(moe_target)
    drafter.config["eagle_aux_hidden_state_layer_ids"] = None
    drafter.save_pretrained(tmp_path)
    loaded = Eagle3Drafter.from_pretrained(tmp_path, target=moe_target)
    assert loaded.aux_layer_ids == default_aux_layer_ids(6) == (2, 3, 3)


@pytest.mark.parametrize(("model_type", "layers", "options"), VARIANTS, ids=VARIANT_IDS)
def test_cached_steps_equal_one_causal_pass(moe_target, make_drafter, model_type, layers, options):
    drafter = make_drafter(moe_target, model_type=model_type, layers=layers, **options)
    ids, hidden, pos = _inputs(drafter)
    cache = DynamicCache()
    with torch.no_grad():
        full, _ = drafter(ids, hidden, pos)
        parts = [drafter(ids[:, s:e], hidden[:, s:e], pos[:, s:e], cache)[0] for s, e in [(0, 5), (5, 6), (6, 9)]]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-5)
    assert cache.get_seq_length() == 9


@pytest.mark.parametrize(("model_type", "layers", "options"), VARIANTS, ids=VARIANT_IDS)
def test_tree_mask_equals_sequential_paths(moe_target, make_drafter, model_type, layers, options):
    """A draft tree in one masked forward gives each node the logits of a sequential pass along its path."""
    drafter = make_drafter(moe_target, model_type=model_type, layers=layers, **options)
    P = 5
    ids, hidden, pos = _inputs(drafter, B=1, T=P + 6)
    parents = [-1, -1, 0, 0, 1, 2]  # node -> parent node (-1: the prefix's last position)
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    N = len(parents)
    mask = tree_mask(parents, P, torch.float32)  # [1, 1, N, P+N]: the prefix and each node's own path
    tree_pos = tree_positions(depth, P)  # [1, N]
    with torch.no_grad():
        cache = DynamicCache()
        drafter(ids[:, :P], hidden[:, :P], pos[:, :P], cache)
        tree, _ = drafter(ids[:, P:], hidden[:, P:], tree_pos, cache, attention_mask=mask)
        for i in range(N):
            path = []
            j = i
            while j >= 0:
                path.insert(0, j)
                j = parents[j]
            cache = DynamicCache()
            drafter(ids[:, :P], hidden[:, :P], pos[:, :P], cache)
            for j in path:
                node = slice(P + j, P + j + 1)
                step, _ = drafter(ids[:, node], hidden[:, node], tree_pos[:, j : j + 1], cache)
            torch.testing.assert_close(tree[:, i], step[:, 0], rtol=0, atol=1e-5)


def test_aux_hidden_states_are_layer_inputs(moe_target):
    ids = torch.arange(10)[None]
    with torch.no_grad():
        out = moe_target(ids, output_hidden_states=True)
    aux = aux_hidden_states(out.hidden_states, (0, 2))  # [1, 10, 2H]
    H = moe_target.config.hidden_size
    assert torch.equal(aux[..., :H], moe_target.get_input_embeddings()(ids))
    assert torch.equal(aux[..., H:], out.hidden_states[2])


def test_to_target_ids_uses_d2t(moe_target, make_drafter):
    drafter = make_drafter(moe_target)
    draft = torch.arange(drafter.draft_vocab_size)
    target = drafter.to_target_ids(draft)
    assert torch.equal(drafter.t2d.nonzero().squeeze(1), target)


def test_norm_before_fc_normalizes_the_concatenated_features(moe_target, make_drafter):
    """speculators' norm_before_fc (gpt-oss drafters): fc(RMSNorm(cat(h_a, h_b, h_c))) with input_norm [3H]."""
    drafter = make_drafter(moe_target, norm_before_fc=True)
    aux = torch.randn(2, 5, 3 * 32)  # [B, T, 3H]
    with torch.no_grad():
        expected = drafter.fc(_rms(aux, drafter.input_norm.weight))
        torch.testing.assert_close(drafter.fuse(aux), expected, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(drafter.fuse(aux), drafter.fc(aux))
    assert drafter.input_norm.weight.shape == (3 * 32,) and drafter.fc_norm is None


def test_fc_norm_normalizes_each_feature(moe_target, make_drafter):
    """speculators' fc_norm: fc(cat(Norm_a(h_a), Norm_b(h_b), Norm_c(h_c))), one [H] norm per tapped layer."""
    drafter = make_drafter(moe_target, fc_norm=True)
    aux = torch.randn(2, 5, 3 * 32)  # [B, T, 3H]
    with torch.no_grad():
        chunks = aux.split(32, dim=-1)
        expected = drafter.fc(torch.cat([_rms(h, n.weight) for h, n in zip(chunks, drafter.fc_norm)], dim=-1))
        torch.testing.assert_close(drafter.fuse(aux), expected, rtol=1e-5, atol=1e-6)
    assert len(drafter.fc_norm) == 3 and drafter.input_norm is None


def test_norm_output_feeds_back_the_normed_state(moe_target, make_drafter):
    """speculators' norm_output (EAGLE 3.1): the next draft step reads norm(h), the same the LM head reads."""
    plain = make_drafter(moe_target)
    normed = make_drafter(moe_target, norm_output=True)
    ids, hidden, pos = _inputs(plain)
    with torch.no_grad():
        logits, h = plain(ids, hidden, pos)
        logits2, h2 = normed(ids, hidden, pos)
        torch.testing.assert_close(h2, plain.norm(h), rtol=0, atol=0)
        assert torch.equal(logits, logits2) and not torch.allclose(h, h2)


def test_further_layers_are_plain_decoder_layers_after_the_first(moe_target, make_drafter):
    """With num_hidden_layers = 2, layers.1 is a plain decoder layer over the first one's output: with its
    output projections zeroed, the drafter is the one-layer drafter of the same weights."""
    two = make_drafter(moe_target, layers=2)
    one = make_drafter(moe_target)
    state = {k: v for k, v in two.state_dict().items() if not k.startswith("layers.1.")}
    one.load_state_dict(state)
    ids, hidden, pos = _inputs(two)
    with torch.no_grad():
        assert not torch.allclose(two(ids, hidden, pos)[0], one(ids, hidden, pos)[0])
        two.layers[1].self_attn.o_proj.weight.zero_()
        two.layers[1].mlp.down_proj.weight.zero_()
        torch.testing.assert_close(two(ids, hidden, pos)[0], one(ids, hidden, pos)[0], rtol=0, atol=1e-6)
    assert type(two.layers[1].self_attn.q_proj.weight) is type(one.layers[0].self_attn.q_proj.weight)
    assert two.layers[1].self_attn.q_proj.in_features == 32 and two.layers[0].self_attn.q_proj.in_features == 64


def test_headers_name_every_tensor_without_reading_it(moe_target, tmp_path, make_drafter):
    drafter = make_drafter(moe_target, layers=2, fc_norm=True)
    drafter.save_pretrained(tmp_path)
    shapes = tensor_shapes([tmp_path / "model.safetensors"])
    assert shapes == {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    Eagle3Drafter.check_weights(drafter.config, shapes, tmp_path)  # what the config needs, and nothing else


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("model_type", "layers", "options"), VARIANTS, ids=VARIANT_IDS)
def test_drafting_path_is_bit_equal_to_the_modules(moe_target, make_drafter, model_type, layers, options, dtype):
    """Without gradients the first layer calls its projections, attention kernel and MLP directly (`first_layer`);
    with them, it runs through its transformers modules. Both give the same bits: one query (transformers'
    grouped-query path), a tree of two, a chunk of seven, over a cache and without, with tree masks, in fp32 and
    bf16, and the caches they append to are equal."""
    drafter = make_drafter(moe_target, model_type=model_type, layers=layers, **options).to(dtype)
    ids, hidden, pos = _inputs(drafter, B=1, T=16)
    hidden = hidden.to(dtype)
    caches = {}
    for grad in (True, False):
        cache, outs = DynamicCache(), []
        with torch.set_grad_enabled(grad):
            outs.append(drafter(ids[:, :7], hidden[:, :7], pos[:, :7], cache))  # a chunk, no cache yet
            outs.append(drafter(ids[:, 7:8], hidden[:, 7:8], pos[:, 7:8], cache))  # one query
            mask = tree_mask([-1, -1], 8, dtype)  # two siblings over the cache
            outs.append(drafter(ids[:, 8:10], hidden[:, 8:10], tree_positions([0, 0], 8), cache, attention_mask=mask))
            outs.append(drafter(ids[:, 10:11], hidden[:, 10:11], pos[:, 10:11], cache, attention_mask=tree_mask(
                [-1], 10, dtype)))  # one query with a tree mask
        caches[grad] = [(layer.keys, layer.values) for layer in cache.layers]
        outs = [(logits.detach(), h.detach()) for logits, h in outs]
        if grad:
            reference = outs
    for (a_logits, a_h), (b_logits, b_h) in zip(reference, outs, strict=True):
        assert a_logits.dtype == dtype and torch.equal(a_logits, b_logits) and torch.equal(a_h, b_h)
    for (ka, va), (kb, vb) in zip(caches[True], caches[False], strict=True):
        assert torch.equal(ka.detach(), kb) and torch.equal(va.detach(), vb)
