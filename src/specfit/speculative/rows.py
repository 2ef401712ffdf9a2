"""One decoder layer of the exact verify on one row, as the family's modules compute it, without their call machinery.

The exact verify (`specfit.speculative.exact`) runs each tree row through each layer alone, ``[1, 1, H]``. Calling
the decoder layer for that, as the module path does, spends most of its time in what surrounds the arithmetic:
``nn.Module.__call__`` on every submodule, the kwargs a layer forwards to its attention, the deprecation and
checkpointing wrappers, two calls of each MoE block (record and replay). Here the same torch operations run on the
same one-row tensors in the same order, read off the installed transformers' modeling files of the families of
`specfit.engine.families.FAMILIES`; the submodules whose forward is a single unit (norms, projections, the router,
the shared expert, the experts) run their own ``forward`` (`call`), so nothing is copied that could drift from
them. What differs between the families is declared there (``qk_norm``, ``shared_expert``).
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import module as torch_module
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from specfit.engine.families import MoEFamily


def call(module: nn.Module, *args):
    """``module(*args)``: its ``forward`` directly unless a hook would run (an fp32 final norm has one,
    `specfit.models.precision`), in which case through ``__call__``; the same arithmetic either way."""
    if (module._forward_pre_hooks or module._forward_hooks or torch_module._global_forward_pre_hooks
            or torch_module._global_forward_hooks):
        return module(*args)
    return module.forward(*args)


class LayerRows:
    """The arithmetic of one decoder layer of ``family`` for one row at a time."""

    def __init__(self, layer: nn.Module, family: MoEFamily):
        self.layer = layer
        self.family = family
        self.attn = layer.self_attn
        modeling = sys.modules[type(self.attn).__module__]  # the family's modeling file
        self.rotary = modeling.apply_rotary_pos_emb
        self.attention = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.attn.config._attn_implementation, modeling.eager_attention_forward)
        self.clip = getattr(self.attn.config, "clip_qkv", None) if family.qk_norm == "projection" else None
        self.sparse = hasattr(layer.mlp, "experts")  # else a dense MLP (Qwen3-MoE's mlp_only_layers)

    def attention_block(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv) -> torch.Tensor:
        """The layer's input up to the MoE block's input: (residual, normed), both [1, 1, H]."""
        attn = self.attn
        h = call(self.layer.input_layernorm, x)  # [1, 1, H]
        hidden_shape = (1, 1, -1, attn.head_dim)
        q, k, v = call(attn.q_proj, h), call(attn.k_proj, h), call(attn.v_proj, h)  # [1, 1, heads * D] each
        if self.family.qk_norm == "projection":  # OLMoE: over the whole projection, then clipped
            q, k = call(attn.q_norm, q), call(attn.k_norm, k)
            if self.clip is not None:
                for t in (q, k, v):
                    t.clamp_(min=-self.clip, max=self.clip)
        q, k, v = q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)  # [1, 1, heads, D]
        if self.family.qk_norm == "head":  # Qwen3-MoE: each head's [D]
            q, k = call(attn.q_norm, q), call(attn.k_norm, k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [1, heads, 1, D]
        q, k = self.rotary(q, k, *rope)
        k, v = kv.update(k, v, attn.layer_idx)  # [1, kv_heads, P + depth + 1, D]
        out, _ = self.attention(attn, q, k, v, None, dropout=0.0, scaling=attn.scaling,
                                sliding_window=getattr(attn.config, "sliding_window", None))
        residual = x + call(attn.o_proj, out.reshape(1, 1, -1).contiguous())  # [1, 1, H]
        return residual, call(self.layer.post_attention_layernorm, residual)

    def route(self, h: torch.Tensor):
        """The MoE block's input [1, 1, H] -> (its rows [1, H], shared expert's output [1, H] or None, gate weights
        [1, k], expert ids [1, k])."""
        mlp = self.layer.mlp
        rows = h.view(-1, h.shape[-1])  # [1, H]
        shared = call(mlp.shared_expert, rows) if self.family.shared_expert else None
        _, weights, index = call(mlp.gate, rows)
        return rows, shared, weights, index

    def moe_output(self, rows: torch.Tensor, shared: torch.Tensor | None, routed: torch.Tensor) -> torch.Tensor:
        """The MoE block's output [1, 1, H] from its routed experts' output [1, H]."""
        if shared is not None:  # Qwen2-MoE's sigmoid-gated shared expert
            routed = routed + F.sigmoid(call(self.layer.mlp.shared_expert_gate, rows)) * shared
        return routed.reshape(1, 1, -1)

    def dense(self, h: torch.Tensor) -> torch.Tensor:
        return call(self.layer.mlp, h)
