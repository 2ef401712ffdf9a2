"""Which modules of a Hugging Face MoE model hold the routed experts, and how to read their shape.

Every family here keeps its routed experts in one ``@use_experts_implementation`` module with fused per-expert
tensors whose leading dimension is the expert id, and routes with ``config.num_experts_per_tok``. Supporting
another such family is one entry in :data:`FAMILIES`. Shared experts (Qwen2-MoE) are ordinary dense modules and
stay on the device untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class MoEFamily:
    """An adapter from one transformers model family to the offload engine."""

    experts_class: str  # class name of the fused experts module
    weights: tuple[str, ...] = ("gate_up_proj", "down_proj")  # per-expert tensors, [num_experts, ...] each
    top_k_attr: str = "num_experts_per_tok"  # config attribute holding k
    # Where the attention normalizes its queries and keys, as the exact verify's row pass (`specfit.speculative.
    # rows`) repeats it: "head" (each head's [D] after the view), "projection" (the whole projection before the view,
    # then config.clip_qkv), or None (no norm).
    qk_norm: str | None = None
    shared_expert: bool = False  # a sigmoid-gated shared expert added to the routed experts' output (Qwen2-MoE)


FAMILIES: dict[str, MoEFamily] = {
    "qwen3_moe": MoEFamily("Qwen3MoeExperts", qk_norm="head"),
    "olmoe": MoEFamily("OlmoeExperts", qk_norm="projection"),
    "qwen2_moe": MoEFamily("Qwen2MoeExperts", shared_expert=True),
    "mixtral": MoEFamily("MixtralExperts"),
}


def family_of(model: nn.Module) -> MoEFamily:
    """The adapter for ``model`` (by ``config.model_type``, or the text config's for multimodal wrappers)."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES and hasattr(config, "get_text_config"):
        model_type = config.get_text_config().model_type
    if model_type not in FAMILIES:
        raise ValueError(f"no offload adapter for model_type {model_type!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def moe_experts(model: nn.Module, family: MoEFamily) -> list[nn.Module]:
    """The fused experts modules of ``model``, in forward (module) order: one per MoE layer."""
    return [m for m in model.modules() if type(m).__name__ == family.experts_class]
