"""Float32 logits for a bf16 (or fp16) target: its final norm and LM head run in float32 in every forward.

Greedy tree verification is lossless only as far as the target's kernels are batch-invariant: a tree forward over
q rows and an AR step over one row may reduce in other orders, so a hidden state can differ in its last bits, and
bf16 logits (8 significant bits) hold exact ties that argmax breaks by token id. After :func:`upcast_logits`, the
final norm reads its input in float32 (so it normalizes and scales in float32; its bf16 weight is promoted
exactly) and the LM head multiplies that by a float32 copy of its weight, so the logits of every forward (prefill,
AR step, tree verify) are float32 of the same hidden states. That removes the ties and flips that bf16 rounding
of the logits creates. It cannot remove differences in the hidden states themselves (the decoder layers stay in
their dtype): a top-2 margin below those can still flip.

Nothing else changes: parameters, state dict, the decoder layers, the KV cache, the routes and the target features
a drafter reads (``hidden_states[i]`` for ``i`` < number of layers) are bit for bit the same; only
``hidden_states[-1]`` (the final norm's output) and the logits become float32. On a float32 model it changes
nothing at all. The float32 copy of the LM head weight costs ``vocab × hidden × 4`` bytes on the model's device
(1.2 GB for Qwen3-30B-A3B); it is made at the first forward and remade when the weight moves or changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MethodType

import torch
from torch import nn
from torch.nn import functional as F

LOGITS_DTYPES = ("model", "float32")  # what a model's ``logits_dtype`` may say: its own dtype, or float32


@dataclass
class UpcastHandle:
    """What :func:`upcast_logits` changed; ``remove()`` restores the model."""

    norm: nn.Module
    head: nn.Linear
    hook: torch.utils.hooks.RemovableHandle

    def remove(self) -> None:
        self.hook.remove()
        del self.head.forward  # the class's forward again
        self.head.__dict__.pop("_specfit_fp32_weight", None)


def final_norm(model: nn.Module) -> nn.Module:
    """The norm the decoder applies to its last hidden state (``model.get_decoder().norm``)."""
    decoder = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
    norm = getattr(decoder, "norm", None)
    if not isinstance(norm, nn.Module):
        raise ValueError(f"{type(model).__name__} has no final norm at get_decoder().norm")
    return norm


def upcast_logits(model: nn.Module) -> UpcastHandle:
    """Run ``model``'s final norm and LM head in float32 for every forward (in place); see the module docstring."""
    norm = final_norm(model)
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__}'s LM head is a {type(head).__name__}, not an nn.Linear")
    if "forward" in head.__dict__:
        raise ValueError("the LM head's forward is already replaced (upcast_logits applied twice?)")
    hook = norm.register_forward_pre_hook(_float32_input)
    head.forward = MethodType(_float32_linear, head)
    return UpcastHandle(norm, head, hook)


def apply_logits_dtype(model: nn.Module, logits_dtype: str) -> UpcastHandle | None:
    """A model config's ``logits_dtype``: ``"model"`` leaves the model as it is, ``"float32"`` upcasts."""
    if logits_dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits_dtype {logits_dtype!r} is not one of {LOGITS_DTYPES}")
    return upcast_logits(model) if logits_dtype == "float32" else None


def _float32_input(module: nn.Module, args: tuple) -> tuple:
    return (args[0].float(), *args[1:])


def _float32_linear(self: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if weight.dtype != torch.float32:
        key = (weight.device, weight.data_ptr(), weight._version)
        cached = self.__dict__.get("_specfit_fp32_weight")
        if cached is None or cached[0] != key:
            cached = (key, weight.detach().float())
            self.__dict__["_specfit_fp32_weight"] = cached
        weight = cached[1]
    bias = self.bias.float() if self.bias is not None else None
    return F.linear(hidden_states.float(), weight, bias)
