"""Tiny random MoE targets, the three forwards every method runs (prefill, KV decode, tree verify), and an
independent LRU simulation of the engine's documented touch order."""

import copy

import pytest
import torch
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

VOCAB = 128
SHAPE = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=128,
    attn_implementation="sdpa",
)


def _build(model_cls, config_cls, **extra):
    torch.manual_seed(0)
    config = config_cls(**(SHAPE | extra))
    model = model_cls(config).eval()
    for module in model.modules():  # expert weights large enough that every expert visibly moves the logits
        for name in ("gate_up_proj", "down_proj"):
            if isinstance(getattr(module, name, None), torch.nn.Parameter) and getattr(module, name).dim() == 3:
                torch.nn.init.normal_(getattr(module, name), std=0.2)
    return model


TARGETS = {
    "qwen3_moe": lambda: _build(
        Qwen3MoeForCausalLM, Qwen3MoeConfig, num_experts=8, moe_intermediate_size=32, head_dim=16
    ),
    "olmoe": lambda: _build(OlmoeForCausalLM, OlmoeConfig, num_experts=8),
    "qwen2_moe": lambda: _build(
        Qwen2MoeForCausalLM, Qwen2MoeConfig, num_experts=8, moe_intermediate_size=32, shared_expert_intermediate_size=64
    ),
    "mixtral": lambda: _build(MixtralForCausalLM, MixtralConfig, num_local_experts=8),
}
_built: dict = {}


@pytest.fixture
def make_target():
    """A fresh copy of a tiny random target of one family (built once per session)."""

    def make(family: str = "qwen3_moe", experts_implementation: str | None = None):
        if family not in _built:
            _built[family] = TARGETS[family]()
        model = copy.deepcopy(_built[family])
        if experts_implementation is not None:
            model.set_experts_implementation(experts_implementation)
        return model

    return make


def tree_mask(past: int, parents: list[int], dtype=torch.float32) -> torch.Tensor:
    """[1, 1, q, past + q] additive mask: every node sees the prefix, itself and its ancestors (0), not others."""
    q = len(parents)
    mask = torch.full((1, 1, q, past + q), float("-inf"), dtype=dtype)
    mask[..., :past] = 0
    for i in range(q):
        j = i
        while j >= 0:
            mask[0, 0, i, past + j] = 0
            j = parents[j]
    return mask


def run_forwards(model, device="cpu") -> list[torch.Tensor]:
    """Prefill 10 tokens, decode one with the KV cache, then verify a 5-node tree; the logits of each."""
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (1, 10), generator=gen).to(device)
    step = torch.randint(0, VOCAB, (1, 1), generator=gen).to(device)
    tree = torch.randint(0, VOCAB, (1, 5), generator=gen).to(device)
    parents = [-1, 0, 0, 1, 2]  # node ids put parents first
    depth = [0, 1, 1, 2, 2]
    with torch.no_grad():
        prefill = model(prompt, use_cache=True)
        decode = model(step, cache=prefill.cache, use_cache=True)
        past = 11
        verify = model(
            tree,
            attention_mask=tree_mask(past, parents).to(device),
            position_ids=torch.tensor([[past + d for d in depth]], device=device),
            cache=decode.cache,
            use_cache=True,
        )
    return [prefill.logits, decode.logits, verify.logits]


def simulate_lru(forwards: list[torch.Tensor], slots: int, num_experts: int) -> dict:
    """Hits, misses and demand per layer of an LRU per layer driven by recorded routes ([T, L, k] per forward).

    The documented order: per forward and layer, the union in increasing expert id; resident experts are touched
    first (each becomes most recent), then the missing ones are inserted, each evicting the least recent.
    """
    num_layers = forwards[0].shape[1]
    capacity = num_experts if slots == 0 or slots >= num_experts else slots
    lru = [[] for _ in range(num_layers)]  # least recent first
    hits, misses, demand = [0] * num_layers, [0] * num_layers, [0] * num_layers
    for routes in forwards:
        if slots == 0:
            lru = [[] for _ in range(num_layers)]
        for layer in range(num_layers):
            union = sorted(set(routes[:, layer].flatten().tolist()))
            order = lru[layer]
            resident = [e for e in union if e in order]
            missing = [e for e in union if e not in order]
            for e in resident:
                order.remove(e)
                order.append(e)
            for e in missing:
                if len(order) == capacity:
                    order.pop(0)
                order.append(e)
            hits[layer] += len(resident)
            misses[layer] += len(missing)
            demand[layer] += len(union)
    return {"hits": hits, "misses": misses, "demand": demand}


@pytest.fixture
def forwards():
    return run_forwards


@pytest.fixture
def lru():
    return simulate_lru
