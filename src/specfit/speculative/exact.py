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
verify: the engine admits the union of all rows' routes once and computes every row's experts one row at a time
(`specfit.engine.layer.OffloadedLayer.forward_rows`).

Two paths compute the same bits. `exact_tree_forward`, what the verify "exact" runs, walks each layer's arithmetic
through `specfit.speculative.rows.LayerRows`: the family's operations on the row without the modules' call
machinery, each MoE block's router once, all rows' routed experts in one `forward_rows`. `module_tree_forward`
calls each decoder layer's module per row, as AR's step calls it; each row's MoE block then calls the experts twice
(`specfit.engine.layer.RowCalls`: recorded, the layer's output discarded, then replayed once the engine has run the
layer's rows), and a layer's output is its residual plus its MoE block's output, as the decoder layer of every
family of `specfit.engine.families.FAMILIES` ends. It is the reference the tests hold the fast path to, and
``python -m specfit.bench exact`` and ``decode`` time both.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from specfit.engine.families import family_of
from specfit.engine.layer import RowCalls
from specfit.speculative.rows import LayerRows, call


@dataclass
class ForwardOutput:
    """What the verify reads of a target forward (the fields of transformers' output it uses)."""

    logits: torch.Tensor  # [1, q, V]
    hidden_states: tuple[torch.Tensor, ...] | None  # entry i: [1, q, H] input of layer i; the last: final norm's


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
    rows' keys and values are appended to ``cache`` as a batched tree forward appends them. Each layer's arithmetic
    runs through `specfit.speculative.rows.LayerRows`; `module_tree_forward` is the same forward through the
    decoder layers' own modules, the reference it equals bit for bit."""
    decoder = model.get_decoder()
    family = family_of(model)
    kv = RowKV(cache, parent, len(decoder.layers))
    rows = _embed(decoder, tokens, model.device)  # q x [1, 1, H]
    rope = _rope(decoder, rows, cache.get_seq_length(), depth)
    inputs = []  # per layer, its q input rows
    with _one_forward(engine):
        for layer in decoder.layers:
            inputs.append(rows)
            rows = _rows_through(LayerRows(layer, family), rows, rope, kv, engine)
        return _finish(model, decoder, rows, inputs, kv, hidden_states)


def module_tree_forward(model: nn.Module, cache: DynamicCache, tokens: list[int], parent: list[int],
                        depth: list[int], engine=None, hidden_states: bool = False) -> ForwardOutput:
    """`exact_tree_forward` through the decoder layers' modules (each row's layer called as AR's step calls it, its
    MoE block twice to record and replay the experts): the reference the fast path is tested and timed against."""
    decoder = model.get_decoder()
    kv = RowKV(cache, parent, len(decoder.layers))
    rows = _embed(decoder, tokens, model.device)  # q x [1, 1, H]
    rope = _rope(decoder, rows, cache.get_seq_length(), depth)
    positions = [torch.tensor([[cache.get_seq_length() + d]], device=model.device) for d in depth]  # q x [1, 1]
    inputs = []  # per layer, its q input rows
    with _one_forward(engine):
        for layer in decoder.layers:
            inputs.append(rows)
            rows = _layer_rows(layer, rows, positions, rope, kv, engine)
        return _finish(model, decoder, rows, inputs, kv, hidden_states)


def _embed(decoder: nn.Module, tokens: list[int], device) -> list[torch.Tensor]:
    return [call(decoder.embed_tokens, torch.tensor([[t]], device=device)) for t in tokens]  # q x [1, 1, H]


def _rope(decoder: nn.Module, rows: list[torch.Tensor], past: int, depth: list[int]) -> list[tuple]:
    """Each row's rotary embedding (cos, sin), [1, 1, D] each, as the model forward makes it at its position;
    made once per depth (it reads its input only for the dtype and device)."""
    made = {}
    for r, d in enumerate(depth):
        if d not in made:
            made[d] = call(decoder.rotary_emb, rows[r], torch.tensor([[past + d]], device=rows[r].device))
    return [made[d] for d in depth]


def _finish(model, decoder, rows, inputs, kv: RowKV, hidden_states: bool) -> ForwardOutput:
    """Final norm and LM head per row; the rows' keys and values committed."""
    rows = [call(decoder.norm, x) for x in rows]
    logits = torch.cat([call(model.lm_head, x) for x in rows], dim=1)  # [1, q, V]
    kv.commit_rows()
    states = None
    if hidden_states:
        states = tuple(torch.cat(x, dim=1) for x in inputs) + (torch.cat(rows, dim=1),)  # (L + 1) x [1, q, H]
    return ForwardOutput(logits, states)


def _rows_through(layer: LayerRows, rows: list[torch.Tensor], rope, kv: RowKV, engine) -> list[torch.Tensor]:
    """One decoder layer over every row, one row at a time; q x [1, 1, H] -> q x [1, 1, H]. On an engine the routed
    experts of all rows are one forward of the layer (`OffloadedLayer.forward_rows`), each row computed alone."""
    residuals, routes = [], []  # per row: the post-attention residual, and its route (see LayerRows.route)
    outputs = []
    for r, x in enumerate(rows):
        kv.row = r
        residual, h = layer.attention_block(x, rope[r], kv)
        if not layer.sparse:
            outputs.append(residual + layer.dense(h))
            continue
        residuals.append(residual)
        routes.append(layer.route(h))
    if not layer.sparse:
        return outputs
    experts = layer.layer.mlp.experts
    offloaded = getattr(experts, "_specfit_layer", None) if engine is not None else None
    if offloaded is not None:
        hidden, weights, index = (torch.cat(x) for x in zip(*((h, w, i) for h, _, w, i in routes)))  # [q, H], [q, k]
        routed = offloaded.forward_rows(hidden, index, weights).split(1)  # q x [1, H]
    else:
        routed = [call(experts, h, i, w) for h, _, w, i in routes]  # q x [1, H]
    return [residuals[r] + layer.moe_output(h, shared, routed[r]) for r, (h, shared, _, _) in enumerate(routes)]


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
