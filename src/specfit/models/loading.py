"""Load the target MoE and its EAGLE-3 drafter from local folders, failing early and clearly.

Every check that can be made from a ``config.json`` runs before any weight is read: loading Qwen3-30B-A3B
takes minutes, and a wrong path or a drafter for another model should not cost them. Nothing here touches
the Hugging Face hub.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from specfit.models.eagle3 import Eagle3Drafter, default_aux_layer_ids
from specfit.errors import SpecFitError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# config keys under which the families of transformers name their routed expert count
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise SpecFitError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def read_config(path: str | os.PathLike, what: str, key: str) -> dict:
    """``config.json`` of a local checkpoint folder; ``key`` names the config.yaml entry that sets ``path``."""
    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        raise SpecFitError(
            f"no {what} at {path}: expected a local checkpoint folder with config.json and *.safetensors "
            f"(set by `{key}` in config.yaml)"
        )
    return json.loads(config_path.read_text())


def _num_experts(config: dict) -> int:
    config = config.get("text_config", config)
    return max((config.get(k) or 0 for k in EXPERT_COUNT_KEYS), default=0)


def load_target(path, dtype="bfloat16", device="cpu", key="models.<model>.target"):
    """(model, tokenizer) of a local MoE causal LM, with sdpa attention."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = read_config(path, "target model", key)
    if _num_experts(config) == 0:
        raise SpecFitError(
            f"the target at {path} ({config.get('model_type')}) is not a mixture-of-experts model: "
            f"its config sets none of {', '.join(EXPERT_COUNT_KEYS)}"
        )
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype(dtype), attn_implementation="sdpa", local_files_only=True
    )
    if not any(name.endswith("experts") for name, _ in model.named_modules()):
        raise SpecFitError(f"the target at {path} ({type(model).__name__}) has no `experts` modules to offload")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.to(device).eval(), tokenizer


def load_drafter(path, target, dtype=None, device=None, key="models.<model>.drafter") -> Eagle3Drafter:
    """The EAGLE-3 drafter at ``path`` for ``target``; its embedding comes from the target when absent."""
    config = read_config(path, "EAGLE-3 drafter", key)
    layer = config.get("transformer_layer_config") or {}
    tc = target.config.get_text_config()
    hidden = config.get("target_hidden_size") or layer.get("hidden_size")
    if hidden != tc.hidden_size:
        raise SpecFitError(
            f"the drafter at {path} reads target features of hidden size {hidden}, "
            f"but the target's hidden size is {tc.hidden_size}"
        )
    if layer.get("vocab_size") != tc.vocab_size:
        raise SpecFitError(
            f"the drafter at {path} has a target vocabulary of {layer.get('vocab_size')} tokens, "
            f"but the target's vocabulary has {tc.vocab_size}"
        )
    aux = config.get("eagle_aux_hidden_state_layer_ids") or default_aux_layer_ids(tc.num_hidden_layers)
    if max(aux) >= tc.num_hidden_layers:
        raise SpecFitError(
            f"the drafter at {path} taps target layers {list(aux)}, but the target has {tc.num_hidden_layers}"
        )
    dtype = torch_dtype(dtype) if dtype is not None else None
    return Eagle3Drafter.from_pretrained(path, target=target, dtype=dtype, device=device or target.device)


def eos_ids(model) -> frozenset[int]:
    """The target's end-of-sequence token ids, from its config and its generation config."""
    ids = set()
    for config in (model.config, model.generation_config):
        eos = getattr(config, "eos_token_id", None)
        ids |= set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    return frozenset(ids)
