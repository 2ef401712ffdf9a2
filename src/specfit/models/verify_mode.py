"""How a target's tree forwards compute their rows (a model config's ``verify``), and the refusal of an exact verify
where it cannot be exact.

It lives beside the loading code that sets it, below the decoding package that reads it
(`specfit.speculative.exact`), so that neither reaches up into the other.
"""

from __future__ import annotations

from torch import nn

from specfit.engine.families import FAMILIES
from specfit.errors import SpecFitError

VERIFY_MODES = ("exact", "batched")  # models.<name>.verify: every row as AR's step, or one batched tree forward
# attention implementations whose one-query call with no mask is AR's step
EXACT_ATTENTION = ("sdpa", "eager")


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
