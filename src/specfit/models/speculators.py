"""The speculators checkpoint format of the EAGLE-3 drafter (vllm-project/speculators): what its ``config.json``
says, which configs are refused by name before any weight is read (`check_config`), and a new drafter's config
(`eagle3_config`). The drafter module that reads and writes it is `specfit.models.eagle3`.

Checkpoint (``config.json`` + ``*.safetensors``)::

    config.json  speculators_model_type "eagle3", transformer_layer_config (llama/qwen3 layer config),
                 draft_vocab_size, norm_before_residual, target_hidden_size, eagle_aux_hidden_state_layer_ids
    fc.weight    [H, 3H]
    layers.0.*   hidden_norm, input_layernorm, self_attn.{q,k,v}_proj [*, 2H], o_proj, post_attention_layernorm, mlp
    norm.weight  [H]
    lm_head.weight [Vd, H]
    d2t          [Vd] int64, target id = draft id + d2t[draft id]
    t2d          [V] bool, target ids the draft vocabulary holds
    embed_tokens.weight [V, H]  optional: taken from the target when absent
    layers.1.* ...  plain decoder layers when transformer_layer_config.num_hidden_layers > 1
    input_norm.weight [3H]      with norm_before_fc      fc_norm.i.weight [H]  with fc_norm

The options of speculators' ``Eagle3SpeculatorConfig`` that change what the drafter computes (`OPTIONS`) are
all implemented; a config that sets an option the drafter does not know, or that is not a speculators EAGLE-3
checkpoint at all (a SpecForge / EAGLE training checkpoint, another speculators algorithm), is refused by name
(`check_config`) before any weight is read.
"""

from __future__ import annotations

import json

from transformers import AutoConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding

from specfit.errors import SpecFitError

# model_type of transformer_layer_config -> (decoder layer, RMSNorm, rotary embedding) of transformers
LAYER_CLASSES = {
    "llama": (LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding),
    "qwen3": (Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding),
}


DRAFTER_KEY = "models.<model>.drafter"  # the config.yaml key of a drafter folder, when the caller names none

# speculators' Eagle3SpeculatorConfig options that change the drafter's computation (all implemented here)
OPTIONS = {
    "norm_before_residual": "the first layer's residual is the normed hidden state",
    "norm_before_fc": "one RMSNorm (input_norm) over the concatenated target features before fc",
    "fc_norm": "one RMSNorm per target feature (fc_norm.i) before fc",
    "norm_output": "the drafter's normed output is the next draft step's hidden state (EAGLE 3.1)",
}
# config.json keys of a speculators drafter that do not change what it computes at inference
INERT_KEYS = {
    "architectures", "speculators_model_type", "speculators_config", "speculators_version", "transformer_layer_config",
    "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "embed_requires_grad",
    "enable_sp_ulysses", "torch_dtype", "dtype", "transformers_version", "has_no_defaults_at_init", "auto_map",
}
# what EAGLE-3 training code (SpecForge, the EAGLE repository) names its drafters in a plain config.json
TRAINING_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Qwen3ForCausalLMEagle3")
# a weight name prefix the config does not expect -> the option or key that would make the drafter read it
UNEXPECTED_HINTS = {"input_norm.": "norm_before_fc: true", "fc_norm.": "fc_norm: true",
                    "midlayer.": "the speculators format (convert the checkpoint with `speculators convert`)"}


def set_by(key: str | None) -> str:
    return f" (set by `{key}` in config.yaml)" if key else ""


def check_config(config: dict, path, key: str | None = DRAFTER_KEY) -> None:
    """Refuse, by name, a drafter ``config.json`` this module would not run as it was trained."""
    where = f"the drafter at {path}{set_by(key)}"
    kind = config.get("speculators_model_type")
    if kind is None:
        arch = config.get("architectures") or []
        if set(arch) & set(TRAINING_ARCHITECTURES) or "draft_vocab_size" in config:
            raise SpecFitError(
                f"{where} is an EAGLE-3 checkpoint in the SpecForge / EAGLE training format (architectures "
                f"{arch}, draft_vocab_size {config.get('draft_vocab_size')}, no speculators_model_type); SpecFit "
                f"reads the speculators format. Convert it with `pip install speculators` and `speculators convert "
                f"{path} --algorithm eagle3 --verifier <the target's folder> --output-path <a new folder>`, then set "
                f"`{key or DRAFTER_KEY}` to the new folder"
            )
        raise SpecFitError(
            f"{where} is not a speculators EAGLE-3 checkpoint: its config.json has no speculators_model_type "
            f"(model_type {config.get('model_type')!r}, architectures {arch})"
        )
    if kind != "eagle3":
        raise SpecFitError(
            f"{where} is a speculators {kind!r} checkpoint; SpecFit drafts with EAGLE-3 only "
            f"(speculators_model_type 'eagle3')"
        )
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise SpecFitError(f"{where}: config.json has no transformer_layer_config")
    model_type = layer.get("model_type", "llama")
    if model_type not in LAYER_CLASSES:
        raise SpecFitError(
            f"{where}: transformer_layer_config has model_type {model_type!r}; supported: {sorted(LAYER_CLASSES)}"
        )
    sliding = [i for i, t in enumerate(layer.get("layer_types") or []) if t != "full_attention"]
    if sliding or layer.get("use_sliding_window"):
        raise SpecFitError(
            f"{where}: transformer_layer_config has sliding-window attention (layer_types / use_sliding_window), "
            "which SpecFit's drafter does not implement"
        )
    loose = sorted(k for k, v in config.items() if not isinstance(v, bool) and k not in INERT_KEYS
                   and (k in OPTIONS or _reads_as_boolean(v)))
    if loose:
        raise SpecFitError(
            f"{where}: config.json sets {', '.join(f'{k}: {json.dumps(config[k])}' for k in loose)}; a drafter option "
            "is a JSON boolean, true or false (a number or a string is not read as one)"
        )
    if config.get("norm_before_fc") and config.get("fc_norm"):
        raise SpecFitError(f"{where}: config.json sets both norm_before_fc and fc_norm, which exclude each other")
    unknown = sorted(k for k, v in config.items() if v is True and k not in OPTIONS and k not in INERT_KEYS)
    if unknown:
        raise SpecFitError(
            f"{where}: config.json sets {', '.join(f'{k}: true' for k in unknown)}, an option SpecFit's EAGLE-3 "
            f"drafter does not implement (it implements {', '.join(OPTIONS)}); it would draft differently from "
            "how it was trained"
        )


def _reads_as_boolean(value) -> bool:
    """A number or a string that someone may have meant as a boolean option (``1``, ``"false"``)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "false", "yes", "no", "on", "off", "0", "1")
    return isinstance(value, (int, float)) and value in (0, 1)


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default taps (as in vLLM and speculators): low, middle and high layers of the target."""
    return (2, num_layers // 2, num_layers - 3)



def eagle3_config(
    layer_config: PretrainedConfig,
    draft_vocab_size: int,
    aux_layer_ids,
    target_hidden_size: int | None = None,
    verifier: str | None = None,
    speculative_tokens: int = 3,
    **options: bool,
) -> dict:
    """A speculators ``config.json`` for a new drafter over ``layer_config``; ``options``: `OPTIONS` set true."""
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise SpecFitError(f"unknown EAGLE-3 options {sorted(unknown)}; known: {sorted(OPTIONS)}")
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer_config.to_dict(),
        "draft_vocab_size": draft_vocab_size,
        **{name: bool(options.get(name, False)) for name in OPTIONS},
        "target_hidden_size": target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": speculative_tokens, "accept_tolerance": 0.0,
                 "verifier_accept_k": 1}
            ],
            "verifier": {"name_or_path": verifier, "architectures": []},
        },
    }


def build_layer_config(config: dict) -> PretrainedConfig:
    layer = dict(config.get("transformer_layer_config") or {})
    model_type = layer.pop("model_type", "llama")
    if model_type not in LAYER_CLASSES:
        raise SpecFitError(
            f"EAGLE-3 transformer_layer_config has model_type {model_type!r}; supported: {sorted(LAYER_CLASSES)}"
        )
    layer_config = AutoConfig.for_model(model_type, **layer)
    layer_config._attn_implementation = "sdpa"  # a float additive mask; eager with a bool mask corrupts trees
    return layer_config
