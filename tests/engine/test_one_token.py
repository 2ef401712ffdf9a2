"""`specfit.engine.one_token`: a forward whose experts hold one entry each, computed without grouped_mm's empty
groups, is the implementation's forward bit for bit; the engine takes it only where that holds."""

import copy
import random

import pytest
import torch
from transformers.integrations.moe import grouped_mm_experts_forward

from conftest import VOCAB
from specfit.engine import layer as layer_module
from specfit.engine.families import FAMILIES as ADAPTERS
from specfit.engine.families import moe_experts
from specfit.engine.layer import SlotView
from specfit.engine.offload import make_engine
from specfit.engine.one_token import MAX_ENTRIES, applies, entries, one_token_forward
from specfit.speculative.verify import Target

FAMILIES = ("qwen3_moe", "olmoe", "qwen2_moe", "mixtral")


def experts_module(model, family):
    return moe_experts(model, ADAPTERS[family])[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_one_token_forward_is_grouped_mm_bit_for_bit(make_target, family, dtype):
    module = experts_module(make_target(family, "grouped_mm").to(dtype), family)
    rng = random.Random(0)
    H = module.down_proj.shape[1]
    for rows in (2, 5, 8):  # slot rows: fewer than, about and as many as the experts
        gen = torch.Generator().manual_seed(rows)
        slots = {n: torch.randn((rows, *getattr(module, n).shape[1:]), generator=gen).to(dtype)
                 for n in ("gate_up_proj", "down_proj")}
        for sentinels in (False, True):
            view = SlotView(module, slots, rows, sentinels)
            for _ in range(8):
                # one token's k entries ([1, H], [1, k]), or its entries as the split path passes them ([k, H], [k, 1])
                k = min(2, rows)
                ids = rng.sample(range(rows), k)
                if sentinels:  # entries outside the group: the sentinel row index
                    ids = [i if rng.random() < 0.6 else rows for i in ids]
                x = torch.randn(1, H, generator=gen).to(dtype)
                weights = torch.rand(1, k, generator=gen)  # float32 gate weights over bf16 states, as Mixtral's
                if rng.random() < 0.5:
                    x, index, weights = x.repeat_interleave(k, dim=0), torch.tensor(ids).view(k, 1), torch.ones(k, 1)
                else:
                    index = torch.tensor([ids])
                weights = weights.to(dtype) if rng.random() < 0.5 else weights
                expected = grouped_mm_experts_forward(view, x.clone(), index.clone(), weights.clone())
                got = one_token_forward(view, x, index.flatten().tolist(), weights)
                assert got.dtype == expected.dtype and torch.equal(got, expected), (family, dtype, rows, ids)


def ar_logits(model, slots, one_token, prompt, new=8):
    engine = make_engine(model, slots)
    for layer in engine.layers:
        layer.one_token = layer.one_token and one_token
    target = Target(model, engine)
    logits, _ = target.forward(prompt)
    steps = [logits[-1]]
    while len(steps) < new:
        logits, _ = target.forward([int(steps[-1].argmax())])
        steps.append(logits[0])
    return torch.stack(steps)  # [new, V]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_ar_on_the_engine_is_the_same_with_the_one_token_path(make_target, family, dtype, monkeypatch):
    calls = []
    monkeypatch.setattr(layer_module, "one_token_forward", lambda *a: calls.append(1) or one_token_forward(*a))
    prompt = torch.randint(0, VOCAB, (10,), generator=torch.Generator().manual_seed(5)).tolist()
    base = make_target(family, "grouped_mm").to(dtype)
    with torch.no_grad():
        for slots in (0, 2, 8):  # no cache (misses split every step), a few slots, every expert
            without = ar_logits(copy.deepcopy(base), slots, False, prompt)
            assert not calls
            with_it = ar_logits(copy.deepcopy(base), slots, True, prompt)
            assert calls, (family, slots)  # the steps took it
            calls.clear()
            assert torch.equal(with_it, without), (family, dtype, slots)


def test_the_engine_takes_it_only_where_it_is_the_implementation(make_target):
    module = experts_module(make_target("qwen3_moe"), "qwen3_moe")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert applies("grouped_mm", module, cpu)
    assert not applies("grouped_mm", module, cuda)  # one kernel there, whose sums need not be one mm's
    assert not applies("batched_mm", module, cpu) and not applies("eager", module, cpu)
    module.has_bias = True
    assert not applies("grouped_mm", module, cpu)
    assert make_engine(make_target("qwen3_moe", "grouped_mm"), 2).layers[0].one_token
    assert not make_engine(make_target("qwen3_moe", "eager"), 2).layers[0].one_token


def test_entries_are_taken_only_where_no_slot_row_holds_two():
    assert entries(torch.tensor([[3, 1], [8, 8]]), sentinel=8) == [3, 1, 8, 8]  # the sentinel may repeat
    assert entries(torch.tensor([[3, 1], [3, 8]]), sentinel=8) is None  # slot row 3 twice: one mm over two rows
    assert entries(torch.zeros(1, MAX_ENTRIES + 1, dtype=torch.long).fill_(8), sentinel=8) is None  # too many
