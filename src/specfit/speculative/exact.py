"""The exact verify: every row of a tree forward computed as the target's one-row AR step computes it, bit for bit.

A batched tree forward over q rows rounds differently from AR's one-row step: a projection over q rows takes a
matrix-matrix kernel where one row takes a matrix-vector one, and attention reduces over a masked superset of keys
(every row's) where AR's step reads exactly its own. In float32 the difference sits in the last bits; in bfloat16 it
is a few units of the 8-bit mantissa, enough to flip a greedy near-tie, so speculative decoding would no longer be
lossless. Here each row of the tree runs through each decoder layer alone, ``[1, 1, H]``, exactly as AR's step at
that position runs it:

- its token's embedding and its own position's rotary embedding, as the target's model forward makes them;
- attention over exactly its visible keys in AR's order (the committed prefix, its ancestors root first, itself),
  one query with no mask, as AR's step reads the cache (`RowKV`);
- every projection, norm, router, shared expert and routed expert of the layer on that one row; the LM head too.

The layers still advance together (layer ℓ of every row before layer ℓ+1 of any), so the offload engine sees one
forward with one expert union per layer, the same copies and LRU order and the same modelled cost as a batched
verify: each row's MoE block first calls the experts to be *recorded* (the layer's output is then discarded), the
engine admits the union of all rows' routes once and computes every row's experts one row at a time
(`specfit.engine.layer.OffloadedLayer.forward_rows`), and each row's MoE block runs again, *replaying* its row's
expert output. A layer's output is its residual plus its MoE block's output, as the decoder layer of every family
of `specfit.engine.families.FAMILIES` ends (a new entry there must end so too). What this costs (q row passes per
layer instead of one, two calls of each MoE block) is printed by ``python -m specfit.bench exact``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from specfit.engine.families import FAMILIES
from specfit.engine.layer import RowCalls
from specfit.errors import SpecFitError

VERIFY_MODES = ("exact", "batched")  # models.<name>.verify: every row as AR's step, or one batched tree forward
# attention implementations whose one-query call with no mask is AR's step
EXACT_ATTENTION = ("sdpa", "eager")


@dataclass
class ForwardOutput:
    """What the verify reads of a target forward (the fields of transformers' output it uses)."""

    logits: torch.Tensor  # [1, q, V]
    hidden_states: tuple[torch.Tensor, ...] | None  # entry i: [1, q, H] input of layer i; the last: final norm's


def set_verify(model: nn.Module, mode: str, key: str = "models.<model>.verify") -> None:
    """How ``model``'s tree forwards compute their rows (a model config's ``verify``); refused, naming ``key``, where
    an exact verify cannot be made exact."""
    if mode not in VERIFY_MODES:
        raise SpecFitError(f"`{key}` is {mode!r}; it must be one of {', '.join(VERIFY_MODES)}")
    if mode == "exact":
        check_exact(model, key)
    model._specfit_verify = mode


def verify_mode(model: nn.Module) -> str:
    """"exact" unless `set_verify` said "batched": a model loaded elsewhere verifies exactly too."""
    return getattr(model, "_specfit_verify", "exact")


def check_exact(model: nn.Module, key: str) -> None:
    """Refuse an exact verify of a target it cannot make exact, naming ``key`` and the family."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:  # each runs embed -> rotary -> layers (norm, attention, + residual, norm, MoE block,
        # + residual) -> norm -> LM head: the layout the exact verify walks
        raise SpecFitError(
            f"`{key}: exact` needs a decoder whose layout the exact verify knows ({', '.join(FAMILIES)}); "
            f"this target is {family!r}: set `{key}: batched` (lossless only as far as its kernels are "
            "batch-invariant) or add it to specfit.engine.families.FAMILIES once its decoder ends as theirs do"
        )
    attention = getattr(config, "_attn_implementation", None) or "eager"
    if attention not in EXACT_ATTENTION:
        raise SpecFitError(
            f"`{key}: exact` runs each row's attention as AR's one-query step, known for "
            f"{', '.join(EXACT_ATTENTION)}; this {family} target uses {attention!r}: load it with sdpa or set "
            f"`{key}: batched`"
        )
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        raise SpecFitError(
            f"`{key}: exact` reads every committed key, as AR does without a window; this {family} target has "
            f"sliding_window {config.sliding_window}: set `{key}: batched`"
        )


class RowKV:
    """The cache each row's attention sees: at every layer, the committed prefix, the row's ancestors (root first)
    and the row itself, concatenated as AR's `DynamicCache` would hold them; the rows' own keys and values are kept
    to be appended to the prefix cache after the forward (`commit_rows`)."""

    def __init__(self, prefix: DynamicCache, parent: list[int], layers: int):
        self.prefix = prefix
        self.chains = []  # chains[r]: r's ancestors root first, then r
        for r, p in enumerate(parent):
            self.chains.append([*self.chains[p], r] if p >= 0 else [r])
        self.keys = [[None] * len(parent) for _ in range(layers)]  # [L][q] of [1, kv_heads, 1, D]
        self.values = [[None] * len(parent) for _ in range(layers)]
        self.row = 0  # the row whose layer runs now

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """The keys and values the row reads: [1, kv_heads, P + depth + 1, D] each."""
        self.keys[layer_idx][self.row] = key_states
        self.values[layer_idx][self.row] = value_states
        chain = self.chains[self.row]
        layer = self.prefix.layers[layer_idx]
        keys = torch.cat([layer.keys, *(self.keys[layer_idx][a] for a in chain)], dim=-2)
        values = torch.cat([layer.values, *(self.values[layer_idx][a] for a in chain)], dim=-2)
        return keys, values

    def commit_rows(self) -> None:
        """Append every row's keys and values to the prefix cache, in row order (as a batched forward leaves it)."""
        for layer_idx, (keys, values) in enumerate(zip(self.keys, self.values)):
            self.prefix.update(torch.cat(keys, dim=-2), torch.cat(values, dim=-2), layer_idx)


def exact_tree_forward(model: nn.Module, cache: DynamicCache, tokens: list[int], parent: list[int],
                       depth: list[int], engine=None, hidden_states: bool = False) -> ForwardOutput:
    """The tree forward of ``tokens`` (parents first) over ``cache`` with every row computed as AR's step; the
    rows' keys and values are appended to ``cache`` as a batched tree forward appends them."""
    decoder = model.get_decoder()
    device = model.device
    past = cache.get_seq_length()
    q = len(tokens)
    kv = RowKV(cache, parent, len(decoder.layers))
    rows = [decoder.embed_tokens(torch.tensor([[t]], device=device)) for t in tokens]  # q x [1, 1, H]
    positions = [torch.tensor([[past + d]], device=device) for d in depth]  # q x [1, 1]
    rope = [decoder.rotary_emb(rows[r], position_ids=positions[r]) for r in range(q)]
    inputs = []  # per layer, its q input rows
    with _one_forward(engine):
        for layer in decoder.layers:
            inputs.append(rows)
            rows = _layer_rows(layer, rows, positions, rope, kv, engine)
        rows = [decoder.norm(x) for x in rows]
        logits = torch.cat([model.lm_head(x) for x in rows], dim=1)  # [1, q, V]
    kv.commit_rows()
    states = None
    if hidden_states:
        states = tuple(torch.cat(x, dim=1) for x in inputs) + (torch.cat(rows, dim=1),)  # (L + 1) x [1, q, H]
    return ForwardOutput(logits, states)


def _layer_rows(layer: nn.Module, rows: list[torch.Tensor], positions, rope, kv: RowKV, engine) -> list[torch.Tensor]:
    """One decoder layer over every row, one row at a time; q x [1, 1, H] -> q x [1, 1, H]."""
    residuals, moe_inputs = [], []  # per row: the post-attention residual and the MoE block's input

    def capture_rows(_module, args, out) -> None:
        residuals.append(args[0])
        moe_inputs.append(out)

    capture = layer.post_attention_layernorm.register_forward_hook(capture_rows)
    outputs = []
    recorded = RowCalls() if engine is not None else None
    try:
        with _row_calls(engine, recorded):
            for r, x in enumerate(rows):
                kv.row = r
                outputs.append(layer(x, attention_mask=None, position_ids=positions[r], cache=kv, use_cache=True,
                                     position_embeddings=rope[r]))
    finally:
        capture.remove()
    if recorded is None or not recorded.calls:
        return outputs  # the experts were the target's own (no engine), or the layer has no routed experts
    with _row_calls(engine, recorded.forward()):
        return [residuals[r] + layer.mlp(moe_inputs[r]) for r in range(len(rows))]


@contextmanager
def _one_forward(engine):
    """The engine's begin/end of one target forward (its hooks sit on the decoder's forward, not called here)."""
    if engine is None:
        yield
        return
    engine.begin_forward()
    try:
        yield
    finally:
        engine.end_forward()


@contextmanager
def _row_calls(engine, calls: RowCalls | None):
    """The engine's layers record into, or replay from, ``calls`` inside the block (nothing without an engine)."""
    if engine is None:
        yield
        return
    engine.row_calls = calls
    try:
        yield
    finally:
        engine.row_calls = None
