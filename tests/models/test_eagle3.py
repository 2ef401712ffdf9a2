import pytest
import torch
from transformers import DynamicCache

from specfit.models.eagle3 import (
    Eagle3Drafter,
    aux_hidden_states,
    default_aux_layer_ids,
)
from specfit.speculative.tree import tree_mask, tree_positions
from specfit.errors import SpecFitError


def _inputs(drafter, B=2, T=9, seed=3):
    g = torch.Generator().manual_seed(seed)
    V = drafter.embed_tokens.num_embeddings
    H = drafter.fc.out_features
    ids = torch.randint(0, V, (B, T), generator=g)  # [B, T]
    hidden = torch.randn(B, T, H, generator=g)  # [B, T, H]
    pos = torch.arange(T)[None].expand(B, -1)  # [B, T]
    return ids, hidden, pos


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_round_trip_keeps_predictions(moe_target, tmp_path, model_type, make_drafter):
    drafter = make_drafter(moe_target, model_type=model_type)
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


def test_cached_steps_equal_one_causal_pass(moe_target, make_drafter):
    drafter = make_drafter(moe_target)
    ids, hidden, pos = _inputs(drafter)
    cache = DynamicCache()
    with torch.no_grad():
        full, _ = drafter(ids, hidden, pos)
        parts = [drafter(ids[:, s:e], hidden[:, s:e], pos[:, s:e], cache)[0] for s, e in [(0, 5), (5, 6), (6, 9)]]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-5)
    assert cache.get_seq_length() == 9


def test_tree_mask_equals_sequential_paths(moe_target, make_drafter):
    """A draft tree in one masked forward gives each node the logits of a sequential pass along its path."""
    drafter = make_drafter(moe_target)
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
