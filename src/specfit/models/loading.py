"""Load the target MoE and its EAGLE-3 drafter from local folders, failing early and clearly.

Every check that can be made from the ``config.json`` files and the safetensors headers runs before any weight
is read (`check_checkpoints`): loading Qwen3-30B-A3B and offloading its experts takes minutes, and a wrong path,
a partial download or a drafter for another model should not cost them. The shipped toy's files are checked against
its manifest first (`specfit.models.shipped.verify`). Each error names the config.yaml key that set the folder
(``models.<name>.target`` / ``.drafter``). Nothing here touches the Hugging Face hub.
"""

from __future__ import annotations

import os

import torch

from specfit.errors import SpecFitError
from specfit.models import shipped
from specfit.models.checkpoint import check_tokenizer, read_config, tensor_shapes, weight_files
from specfit.models.eagle3 import Eagle3Drafter
from specfit.models.precision import apply_logits_dtype
from specfit.models.speculators import DRAFTER_KEY
from specfit.models.verify_mode import set_verify

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# config keys under which the families of transformers name their routed expert count
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
TARGET_KEY = "models.<model>.target"  # the config.yaml key of a target folder, when the caller names none


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise SpecFitError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def _num_experts(config: dict) -> int:
    config = _text_config(config)
    return max((config.get(k) or 0 for k in EXPERT_COUNT_KEYS), default=0)


def check_target(path, key: str = TARGET_KEY) -> dict:
    """The target's ``config.json``, after checking it is an MoE with all its weight shards and a tokenizer (and, for
    the shipped toy, every file against its manifest)."""
    shipped.verify(path, key)
    config = read_config(path, "target model", key)
    if _num_experts(config) == 0:
        raise SpecFitError(
            f"the target at {path} ({config.get('model_type')}) is not a mixture-of-experts model: "
            f"its config sets none of {', '.join(EXPERT_COUNT_KEYS)} (set by `{key}` in config.yaml)"
        )
    weight_files(path, "target model", key)
    check_tokenizer(path, key)
    return config


def check_drafter(path, target_config: dict, key: str = DRAFTER_KEY) -> dict:
    """The drafter's ``config.json`` (aux layers resolved), after checking it against the target's config.

    ``target_config``: the target's ``config.json`` (or a loaded config's ``to_dict()``). Checks the speculators
    format and options (`specfit.models.speculators.check_config`), the hidden size, the vocabulary, the tapped layers
    and every tensor's name and shape in the safetensors headers, and the shipped toy's files against its manifest.
    No weight is read.
    """
    shipped.verify(path, key)
    config = Eagle3Drafter.read_config(path, key)
    tc = _text_config(target_config)
    layer = config["transformer_layer_config"]
    where = f"the drafter at {path} (set by `{key}` in config.yaml)"
    hidden = config.get("target_hidden_size") or layer.get("hidden_size")
    if hidden != tc.get("hidden_size"):
        raise SpecFitError(
            f"{where} reads target features of hidden size {hidden}, "
            f"but the target's hidden size is {tc.get('hidden_size')}"
        )
    if layer.get("vocab_size") != tc.get("vocab_size"):
        raise SpecFitError(
            f"{where} has a target vocabulary of {layer.get('vocab_size')} tokens, "
            f"but the target's vocabulary has {tc.get('vocab_size')}"
        )
    layers = tc.get("num_hidden_layers")
    config = Eagle3Drafter.with_aux_layer_ids(config, layers, path)
    aux = config["eagle_aux_hidden_state_layer_ids"]
    if min(aux) < 0 or max(aux) >= layers:
        raise SpecFitError(f"{where} taps target layers {list(aux)}, but the target has {layers}")
    shapes = tensor_shapes(weight_files(path, "EAGLE-3 drafter", key))
    Eagle3Drafter.check_weights(config, shapes, path, key, embed_from_target=True)
    if "embed_tokens.weight" not in shapes and layer.get("hidden_size") != tc.get("hidden_size"):
        raise SpecFitError(
            f"{where} has no embed_tokens and a hidden size of {layer.get('hidden_size')}, so it cannot take the "
            f"target's embedding (hidden size {tc.get('hidden_size')})"
        )
    return config


def check_checkpoints(target, drafter=None, model: str = "<model>") -> None:
    """Check the target folder and (if given) the drafter folder against it, from their configs and headers.

    Run it before loading: every error comes before the minutes the target takes, naming
    ``models.{model}.target`` / ``models.{model}.drafter``.
    """
    config = check_target(target, f"models.{model}.target")
    if drafter is not None:
        check_drafter(drafter, config, f"models.{model}.drafter")


def load_target(path, dtype="bfloat16", device="cpu", key=TARGET_KEY, logits_dtype="model", verify="exact"):
    """(model, tokenizer) of a local MoE causal LM, with sdpa attention; ``logits_dtype`` "float32" runs its final
    norm and LM head in fp32 (`specfit.models.precision.apply_logits_dtype`); ``verify`` says how its tree
    forwards compute their rows (`specfit.models.verify_mode.set_verify`, refused here where "exact" cannot be)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_target(path, key)
    dtype = torch_dtype(dtype)
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa", local_files_only=True, output_loading_info=True
    )
    # transformers initializes missing tensors at random and only warns: a target that does not fit its config
    # would decode garbage, losslessly
    missing = sorted(info.get("missing_keys") or [])
    mismatched = [k for k, *_ in info.get("mismatched_keys") or []]
    if missing or mismatched:
        raise SpecFitError(
            f"the weights of the target at {path} (set by `{key}` in config.yaml) do not fit its config.json: "
            f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, wrong shape {mismatched[:8]}"
        )
    # and tensors the config does not use are dropped, with a warning: a config of 2 layers over a checkpoint of 8
    # would decode a truncated model
    unexpected = sorted(info.get("unexpected_keys") or [])
    if unexpected:
        raise SpecFitError(
            f"the weights of the target at {path} (set by `{key}` in config.yaml) hold {len(unexpected)} tensors its "
            f"config.json does not use ({', '.join(unexpected[:8])}{', ...' if len(unexpected) > 8 else ''}): the "
            "model would load truncated; use the config.json that came with these weights"
        )
    if not any(name.endswith("experts") for name, _ in model.named_modules()):
        raise SpecFitError(f"the target at {path} ({type(model).__name__}) has no `experts` modules to offload")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = model.to(device).eval()
    apply_logits_dtype(model, logits_dtype)
    set_verify(model, verify, key=key.rpartition(".")[0] + ".verify")
    return model, tokenizer


def load_drafter(path, target, dtype=None, device=None, key=DRAFTER_KEY) -> Eagle3Drafter:
    """The EAGLE-3 drafter at ``path`` for ``target``; its embedding comes from the target when absent."""
    check_drafter(path, target.config.to_dict(), key)
    dtype = torch_dtype(dtype) if dtype is not None else None
    return Eagle3Drafter.from_pretrained(path, target=target, dtype=dtype, device=device or target.device, key=key)


def eos_ids(model) -> frozenset[int]:
    """The target's end-of-sequence token ids, from its config and its generation config."""
    ids = set()
    for config in (model.config, model.generation_config):
        eos = getattr(config, "eos_token_id", None)
        ids |= set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    return frozenset(ids)
