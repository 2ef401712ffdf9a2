"""A forward's routed experts where every expert holds at most one entry (one token's forward), as transformers'
``grouped_mm`` implementation computes them on the CPU, without its empty groups.

On the CPU, ``grouped_mm`` runs one ``mm`` per group of the weight tensor, the empty ones included, with the
slicing around each: one token's k experts over a layer's R slot rows cost R products per projection, R - k of
them over no row. That loop was most of an exact verify's expert time (`specfit.engine.layer`: the verify computes
every token alone). Where each group holds at most one entry, its product is one ``mm`` of that entry's row
``[1, H]`` with the group's weight, and `one_token_forward` runs exactly those, then the gate, the weighting by the
gate weights and the sum over the top-k as the implementation runs them, on the same values in the same dtypes
and order: the same bits (tests/engine/test_one_token.py holds it to 0 against the implementation, over random
slots, sentinel entries and dtypes).

Where the equivalence is not by construction, the engine calls the implementation itself (`applies`): a device
other than the CPU (CUDA's grouped_mm is one kernel), another implementation, biases, a post-expert norm, or a
forward in which an expert holds two entries (their product would be one ``mm`` over two rows).
"""

from __future__ import annotations

import torch
from torch import nn


def applies(implementation: str, module: nn.Module, device: torch.device) -> bool:
    """Whether `one_token_forward` computes what ``implementation`` computes for ``module`` on ``device``."""
    return (implementation == "grouped_mm" and device.type == "cpu" and not getattr(module, "has_bias", False)
            and not getattr(module, "has_post_expert_norm", False))


MAX_ENTRIES = 16  # the most routed entries of a forward tried for `one_token_forward` (one token's k, a few more)


def entries(slot_index: torch.Tensor, sentinel: int) -> list[int] | None:
    """``slot_index`` [T, k] flattened (a host sync) where `one_token_forward` computes it: at most `MAX_ENTRIES`
    entries, none of its slot rows but the sentinel's (entries the group does not compute) held twice; else None."""
    if slot_index.numel() > MAX_ENTRIES:
        return None
    slots = slot_index.reshape(-1).tolist()
    held = [s for s in slots if s != sentinel]
    return slots if len(set(held)) == len(held) else None


def one_token_forward(view, hidden_states: torch.Tensor, slots: list[int], top_k_weights: torch.Tensor) -> torch.Tensor:
    """``grouped_mm_experts_forward(view, hidden_states, slot_index, top_k_weights)`` where every slot row holds
    at most one entry (`entries`).

    ``hidden_states`` [T, H]; ``slots`` the T*k entries' slot rows in entry order (``slot_index`` flattened, the
    sentinel ``view.num_experts`` for entries outside the group); ``top_k_weights`` [T, k]. -> [T, H]. The
    entries are gathered in the order of their slot rows, as the implementation sorts them, so that each product
    reads its operands where the implementation's does.
    """
    T, k = top_k_weights.shape
    sentinel = view.num_experts
    order = sorted(range(len(slots)), key=slots.__getitem__)  # entries by slot row, the sentinel's last
    transposed = view.is_transposed
    up = view.gate_up_proj if view.has_gate else view.up_proj  # [R, out, H], or [R, H, out] when transposed
    down = view.down_proj  # [R, H, I], or [R, I, H] when transposed
    if not transposed:  # [R, in, out], as grouped_mm reads them
        up, down = up.transpose(1, 2), down.transpose(1, 2)
    selected = hidden_states[[j // k for j in order]].to(up.dtype)  # [T*k, H] as grouped_mm multiplies it
    proj = torch.cat([torch.mm(selected[p : p + 1], up[slots[j]]) if slots[j] != sentinel
                      else selected.new_zeros(1, up.shape[-1])  # an entry outside the group: masked to zero
                      for p, j in enumerate(order)])  # [T*k, out]
    proj = (view._apply_gate(proj) if view.has_gate else view.act_fn(proj)).to(down.dtype)  # [T*k, I]
    out = torch.cat([torch.mm(proj[p : p + 1], down[slots[j]]) if slots[j] != sentinel
                     else proj.new_zeros(1, down.shape[-1])
                     for p, j in enumerate(order)])  # [T*k, H], in slot order
    inverse = [0] * len(order)
    for p, j in enumerate(order):
        inverse[j] = p
    weighted = out[inverse] * top_k_weights.reshape(-1, 1)  # [T*k, H] in entry order, the promoted dtype
    return weighted.view(T, k, -1).sum(dim=1).to(hidden_states.dtype)  # [T, H]
