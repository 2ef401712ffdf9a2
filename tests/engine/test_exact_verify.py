"""The exact verify (`specfit.speculative.exact`): every committed row of a tree verify computes its logits and KV
rows as AR's one-row step does, bit for bit, for every family, dtype and cache size; refusals at load."""

import copy

import pytest
import torch

from conftest import VOCAB
from specfit.engine.offload import make_engine
from specfit.errors import SpecFitError
from specfit.models.precision import upcast_logits
from specfit.models.verify_mode import check_exact, set_verify
from specfit.speculative.exact import exact_tree_forward, module_tree_forward
from specfit.speculative.tree import keep_rows
from specfit.speculative.verify import Target

FAMILIES = ("qwen3_moe", "olmoe", "qwen2_moe", "mixtral")
SLOTS = (None, 0, 2, 8)  # no engine (the family's own experts), no cache, a few slots, every expert
NEW = 16  # output tokens per request


def target_on(model, slots):
    engine = make_engine(model, slots) if slots is not None else None
    return Target(model, engine)


def ar_decode(model, slots, prompt, new=NEW):
    """AR's output tokens, its logits [V] before each of them, and its final KV cache."""
    target = target_on(model, slots)
    logits, _ = target.forward(prompt)
    steps, out = [logits[-1]], [int(logits[-1].argmax())]
    while len(out) < new:
        logits, _ = target.forward(out[-1:])
        steps.append(logits[0])
        out.append(int(logits[0].argmax()))
    return out, steps, target.cache


def tree_for(ar_out, at, gen):
    """A tree below the root ``ar_out[at - 1]``: a chain that follows AR for a random length and then goes wrong,
    and a wrong sibling at each level, as a drafter's pool would hold them; parents first."""
    tokens, parent, depth = [ar_out[at - 1]], [-1], [0]
    follow = int(torch.randint(0, 4, (1,), generator=gen))
    node = 0
    for level in range(1, 4):
        right = ar_out[at - 1 + level] if at - 1 + level < len(ar_out) else 0
        chain = right if level <= follow else (right + 1) % VOCAB
        for token in (chain, (right + 7) % VOCAB):
            tokens.append(token)
            parent.append(node)
            depth.append(level)
        node = len(tokens) - 2  # the chain continues below its first child
    return tokens, parent, depth


def speculative_decode(model, slots, prompt, ar_out, seed=0, new=NEW):
    """Greedy tree decoding (drafted trees, the accepted path kept) and the logits of every committed row."""
    gen = torch.Generator().manual_seed(seed)
    target = target_on(model, slots)
    logits, _ = target.forward(prompt)
    out, committed = [int(logits[-1].argmax())], [logits[-1]]
    while len(out) < new:
        tokens, parent, depth = tree_for(ar_out, len(out), gen)
        past = target.prefix_len
        logits, _ = target.forward(tokens, parent, depth)  # [q, V]
        row, kept = 0, [0]
        while True:
            committed.append(logits[row])
            out.append(int(logits[row].argmax()))
            child = next((c for c in range(len(tokens)) if parent[c] == row and tokens[c] == out[-1]), None)
            if child is None:
                break
            kept.append(child)
            row = child
        keep_rows(target.cache, past, kept)
    return out, committed, target.cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_committed_row_is_ars_step_bit_for_bit(make_target, family, dtype):
    prompt = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    base = make_target(family).to(dtype)
    with torch.no_grad():
        for slots in SLOTS:
            ar_out, ar_logits, ar_cache = ar_decode(copy.deepcopy(base), slots, prompt)
            out, logits, cache = speculative_decode(copy.deepcopy(base), slots, prompt, ar_out)
            n = min(len(out), len(ar_out))
            assert out[:n] == ar_out[:n], (family, dtype, slots)
            for i in range(n):
                assert torch.equal(logits[i], ar_logits[i]), (family, dtype, slots, i)  # a difference of exactly 0
            length = len(prompt) + n - 1  # committed positions both hold
            for mine, ars in zip(cache.layers, ar_cache.layers):
                assert torch.equal(mine.keys[..., :length, :], ars.keys[..., :length, :])
                assert torch.equal(mine.values[..., :length, :], ars.values[..., :length, :])


def random_tree(gen, shape):
    """(tokens, parent, depth) of a random tree of a named ``shape``: one row, a chain, a root's siblings, or a random
    tree of 9 rows; parents first."""
    if shape == "single":
        parent = [-1]
    elif shape == "chain":
        parent = [-1, 0, 1, 2, 3]
    elif shape == "siblings":
        parent = [-1, 0, 0, 0, 0]
    else:
        parent = [-1] + [int(torch.randint(0, r, (1,), generator=gen)) for r in range(1, 9)]
    depth = []
    for p in parent:
        depth.append(depth[p] + 1 if p >= 0 else 0)
    tokens = torch.randint(0, VOCAB, (len(parent),), generator=gen).tolist()
    return tokens, parent, depth


def engine_counters(engine):
    if engine is None:
        return None
    stats = {k: v for k, v in engine.stats().items() if not k.endswith("_s")}  # the counts, not the wall times
    stats["prefetch"] = {k: v for k, v in stats["prefetch"].items() if not k.endswith("_ms")}
    return stats, engine.last_forward, engine.h2d_transfers, [list(layer.cache.slot_of.items()) for layer in
                                                              engine.layers]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_fast_path_is_the_module_path_bit_for_bit(make_target, family, dtype):
    """`exact_tree_forward` (the verify "exact" runs) against `module_tree_forward` (the decoder layers' modules):
    the same logits, hidden states and appended KV, and on an engine the same copies, unions and LRU state."""
    gen = torch.Generator().manual_seed(5)
    base = make_target(family).to(dtype)
    prompt = torch.randint(0, VOCAB, (10,), generator=gen).tolist()
    trees = [random_tree(gen, shape) for shape in ("single", "chain", "siblings", "random", "random")]
    with torch.no_grad():
        for slots in (None, 0, 3, 8):  # no engine, no cache, fewer slots than experts (misses), every expert
            runs = {}
            for forward in (exact_tree_forward, module_tree_forward):
                model = copy.deepcopy(base)
                target = target_on(model, slots)
                target.forward(prompt)
                outs = []
                for tokens, parent, depth in trees:  # each verify's rows stay committed: the prefix grows
                    out = forward(model, target.cache, tokens, parent, depth, target.engine, hidden_states=True)
                    outs.append((out.logits, out.hidden_states))
                kv = [(layer.keys, layer.values) for layer in target.cache.layers]
                runs[forward.__name__] = (outs, kv, engine_counters(target.engine))
            (fast, fast_kv, fast_counters), (ref, ref_kv, ref_counters) = runs.values()
            for (logits, states), (ref_logits, ref_states) in zip(fast, ref):
                assert torch.equal(logits, ref_logits), (family, dtype, slots)
                assert all(torch.equal(a, b) for a, b in zip(states, ref_states, strict=True))
            for (k, v), (ref_k, ref_v) in zip(fast_kv, ref_kv, strict=True):
                assert torch.equal(k, ref_k) and torch.equal(v, ref_v)
            assert fast_counters == ref_counters, (family, dtype, slots)


def test_the_fast_path_runs_an_fp32_final_norm_as_the_module_path(make_target):
    """A bf16 target with float32 logits (a hook on its final norm, a replaced LM head forward) stays exact."""
    base = make_target("qwen3_moe").to(torch.bfloat16)
    upcast_logits(base)
    gen = torch.Generator().manual_seed(2)
    tokens, parent, depth = random_tree(gen, "random")
    logits = []
    with torch.no_grad():
        for forward in (exact_tree_forward, module_tree_forward):
            target = target_on(copy.deepcopy(base), 3)
            target.forward(list(range(9)))
            logits.append(forward(target.model, target.cache, tokens, parent, depth, target.engine).logits)
    assert logits[0].dtype == torch.float32
    assert torch.equal(*logits)


def test_the_batched_verify_is_not_exact_in_bf16(make_target):
    """What the exact verify removes: a batched tree forward rounds some row otherwise than AR's step (in at least one
    family: which ones depends on the CPU's kernels)."""
    prompt = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    differs = []
    with torch.no_grad():
        for family in FAMILIES:
            base = make_target(family).to(torch.bfloat16)
            ar_out, ar_logits, _ = ar_decode(copy.deepcopy(base), None, prompt)
            model = copy.deepcopy(base)
            set_verify(model, "batched")
            _, logits, _ = speculative_decode(model, None, prompt, ar_out)
            differs.append(any(not torch.equal(a, b) for a, b in zip(logits, ar_logits)))
    assert any(differs)


def tied_prompt(model, tries=200, length=8):
    """A prompt whose AR decode meets an exact tie of its top-2 logits (a margin of 0), and where."""
    gen = torch.Generator().manual_seed(11)
    for _ in range(tries):
        prompt = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        _, steps, _ = ar_decode(copy.deepcopy(model), None, prompt)
        for i, logits in enumerate(steps):
            top = logits.float().topk(2).values
            if top[0] == top[1]:
                return prompt, i
    return None, None


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_an_exact_tie_resolves_as_ar_resolves_it(make_target, family):
    base = make_target(family).to(torch.bfloat16)
    with torch.no_grad():
        prompt, at = tied_prompt(base)
        assert prompt is not None, "no bf16 prompt with a top-2 tie in AR's decode"
        ar_out, ar_logits, _ = ar_decode(copy.deepcopy(base), 2, prompt)
        top = ar_logits[at].float().topk(2).values
        assert top[0] == top[1]  # the tie is there at this cache size too
        for seed in range(3):
            out, logits, _ = speculative_decode(copy.deepcopy(base), 2, prompt, ar_out, seed=seed)
            assert out[:NEW] == ar_out  # a cycle may commit past NEW
            assert all(torch.equal(a, b) for a, b in zip(logits, ar_logits))


def test_one_forward_per_verify_on_the_engine(make_target):
    """The engine sees an exact verify as one forward: one union per layer, the batched verify's counters."""
    base = make_target("qwen3_moe")
    prompt = list(range(10))
    tokens, parent, depth = [5, 6, 7, 8, 9], [-1, 0, 0, 1, 2], [0, 1, 1, 2, 2]
    stats = {}
    for mode in ("exact", "batched"):
        model = copy.deepcopy(base)
        set_verify(model, mode)
        engine = make_engine(model, 3)
        target = Target(model, engine)
        with torch.no_grad():
            target.forward(prompt)
            forwards = engine.stats()["forwards"]
            target.forward(tokens, parent, depth)
        stats[mode] = (engine.stats()["forwards"] - forwards, engine.last_forward, engine.h2d_transfers)
    assert stats["exact"][0] == 1
    assert stats["exact"] == stats["batched"]


def test_refusals_name_the_key_and_the_family(make_target):
    model = make_target("qwen3_moe")
    with pytest.raises(SpecFitError, match=r"`models.m.verify` is 'fast'; it must be one of exact, batched"):
        set_verify(model, "fast", key="models.m.verify")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(SpecFitError, match=r"`models.m.verify: exact` .* qwen3_moe target uses 'flash_attention_2'"):
        check_exact(model, "models.m.verify")
    set_verify(model, "batched", key="models.m.verify")  # batched asks nothing of the kernels
    mixtral = make_target("mixtral")
    mixtral.config.sliding_window = 4
    with pytest.raises(SpecFitError, match=r"mixtral target has sliding_window 4: set `models.m.verify: batched`"):
        check_exact(mixtral, "models.m.verify")
    mixtral.config.model_type = "deepseek_v3"
    with pytest.raises(SpecFitError, match=r"this target is 'deepseek_v3'"):
        check_exact(mixtral, "models.m.verify")
