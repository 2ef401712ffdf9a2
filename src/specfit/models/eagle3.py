"""The EAGLE-3 drafter, read and written in the vllm-project/speculators checkpoint format.

One decoder layer (a Llama or Qwen3 layer of transformers whose q/k/v take ``2H`` inputs) over the target's
fused features. The target's hidden states at three layers (``aux_layer_ids``, the inputs of those layers, i.e.
``output_hidden_states`` entries) are concatenated and fused by ``fc``; drafter position ``t`` then takes
``(embed(x_{t+1}), h_t)`` and predicts ``x_{t+2}`` over a reduced draft vocabulary. At deeper draft steps ``h`` is
the drafter's own layer output at the parent position.

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
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding

from specfit.errors import SpecFitError

# model_type of transformer_layer_config -> (decoder layer, RMSNorm, rotary embedding) of transformers
LAYER_CLASSES = {
    "llama": (LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding),
    "qwen3": (Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding),
}


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default taps (as in vLLM and speculators): low, middle and high layers of the target."""
    return (2, num_layers // 2, num_layers - 3)


def aux_hidden_states(hidden_states: tuple[torch.Tensor, ...], layer_ids) -> torch.Tensor:
    """[B, T, 3H] target features: entry ``i`` of HF ``output_hidden_states`` is the input of target layer ``i``."""
    return torch.cat([hidden_states[i] for i in layer_ids], dim=-1)


def causal_mask(q_len: int, past_len: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """[1, 1, T, P+T] additive mask: new position ``i`` sees the cache and new positions ``<= i``."""
    kv = torch.arange(past_len + q_len, device=device)
    q = torch.arange(q_len, device=device)[:, None] + past_len
    return torch.zeros(q_len, past_len + q_len, dtype=dtype, device=device).masked_fill(
        kv > q, float("-inf")
    )[None, None]


def eagle3_config(
    layer_config: PretrainedConfig,
    draft_vocab_size: int,
    aux_layer_ids,
    target_hidden_size: int | None = None,
    verifier: str | None = None,
    speculative_tokens: int = 3,
) -> dict:
    """A speculators ``config.json`` for a new drafter over ``layer_config`` (one decoder layer)."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer_config.to_dict(),
        "draft_vocab_size": draft_vocab_size,
        "norm_before_residual": False,
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


def _layer_config(config: dict) -> PretrainedConfig:
    layer = dict(config.get("transformer_layer_config") or {})
    model_type = layer.pop("model_type", "llama")
    if model_type not in LAYER_CLASSES:
        raise SpecFitError(
            f"EAGLE-3 transformer_layer_config has model_type {model_type!r}; supported: {sorted(LAYER_CLASSES)}"
        )
    layer_config = AutoConfig.for_model(model_type, **layer)
    layer_config._attn_implementation = "sdpa"  # a float additive mask; eager with a bool mask corrupts trees
    return layer_config


class Eagle3Drafter(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        self.layer_config = lc = _layer_config(config)
        layer_cls, norm_cls, rotary_cls = LAYER_CLASSES[lc.model_type]
        H = lc.hidden_size
        target_hidden = config.get("target_hidden_size") or H
        self.aux_layer_ids = tuple(config["eagle_aux_hidden_state_layer_ids"])
        self.draft_vocab_size = config["draft_vocab_size"]
        self.norm_before_residual = config.get("norm_before_residual", False)

        self.embed_tokens = nn.Embedding(lc.vocab_size, H)
        self.fc = nn.Linear(len(self.aux_layer_ids) * target_hidden, H, bias=False)
        layer = layer_cls(lc, layer_idx=0)
        # EAGLE-3's first layer: attention reads cat(embeds, hidden), and the hidden half has its own norm
        attn = layer.self_attn
        head_dim = attn.head_dim
        attn.q_proj = nn.Linear(2 * H, lc.num_attention_heads * head_dim, bias=lc.attention_bias)
        attn.k_proj = nn.Linear(2 * H, lc.num_key_value_heads * head_dim, bias=lc.attention_bias)
        attn.v_proj = nn.Linear(2 * H, lc.num_key_value_heads * head_dim, bias=lc.attention_bias)
        layer.hidden_norm = norm_cls(H, eps=lc.rms_norm_eps)
        self.layers = nn.ModuleList([layer])
        self.norm = norm_cls(H, eps=lc.rms_norm_eps)
        self.lm_head = nn.Linear(H, self.draft_vocab_size, bias=False)
        self.rotary_emb = rotary_cls(lc)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(lc.vocab_size, dtype=torch.bool))
        self.embed_from_target = False  # True: embed_tokens is the target's, not saved with the drafter

    @classmethod
    def from_pretrained(cls, path, target=None, dtype=None, device=None) -> "Eagle3Drafter":
        path = Path(path)
        config_path = path / "config.json"
        if not config_path.is_file():
            raise SpecFitError(f"no EAGLE-3 drafter at {path}: expected a speculators folder with config.json")
        config = json.loads(config_path.read_text())
        if config.get("speculators_model_type") != "eagle3":
            raise SpecFitError(
                f"{config_path} is not a speculators EAGLE-3 checkpoint "
                f"(speculators_model_type={config.get('speculators_model_type')!r}, expected 'eagle3')"
            )
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise SpecFitError(f"no *.safetensors weights in the drafter folder {path}")
        state = {}
        for file in files:
            state.update(load_file(file))
        # speculators keeps training-only copies of the verifier's head; the drafter does not use them
        state = {k: v for k, v in state.items() if not k.startswith("verifier_")}

        if not config.get("eagle_aux_hidden_state_layer_ids"):
            if target is None:
                raise SpecFitError(
                    f"{config_path} has no eagle_aux_hidden_state_layer_ids; pass the target to take the default"
                )
            config["eagle_aux_hidden_state_layer_ids"] = list(default_aux_layer_ids(target.config.num_hidden_layers))
        if dtype is None:
            dtype = target.dtype if target is not None else state["fc.weight"].dtype

        with torch.device("meta"):  # no random init of a [V, H] embedding that is overwritten at once
            model = cls(config)
        V, H = model.embed_tokens.weight.shape
        embed_from_target = "embed_tokens.weight" not in state
        if embed_from_target:
            if target is None:
                raise SpecFitError(f"the drafter at {path} has no embed_tokens; pass the target to take its embedding")
            state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach()
        if "d2t" not in state and model.draft_vocab_size == V:  # a full draft vocabulary needs no mapping
            state["d2t"] = torch.zeros(V, dtype=torch.long)
            state["t2d"] = torch.ones(V, dtype=torch.bool)
        expected = model.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise SpecFitError(
                f"drafter weights at {path} do not fit its config: missing {missing}, unexpected {unexpected}"
            )
        for name, tensor in expected.items():
            if state[name].shape != tensor.shape:
                raise SpecFitError(
                    f"drafter tensor {name} at {path} has shape {tuple(state[name].shape)}, "
                    f"its config implies {tuple(tensor.shape)}"
                )
            if state[name].is_floating_point():
                state[name] = state[name].to(dtype)
        model.load_state_dict(state, assign=True)
        # inv_freq is a non-persistent buffer, so it was left on meta: rebuild it in fp32
        model.rotary_emb = LAYER_CLASSES[model.layer_config.model_type][2](model.layer_config)
        model.embed_from_target = embed_from_target
        return model.to(device).eval()

    def save_pretrained(self, path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        config = dict(self.config, transformer_layer_config=self.layer_config.to_dict())
        config["transformer_layer_config"].pop("_attn_implementation_autoset", None)
        (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        state = {
            k: v.detach().contiguous()
            for k, v in self.state_dict().items()
            if not (self.embed_from_target and k == "embed_tokens.weight")
        }
        save_file(state, path / "model.safetensors", metadata={"format": "pt"})

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[B, T, 3H] target aux states -> [B, T, H] fused features."""
        return self.fc(aux)

    def forward(self, input_ids, hidden, position_ids, past_key_values=None, attention_mask=None):
        """One drafter step over T new positions; returns (logits [B, T, Vd], hidden_out [B, T, H]).

        ``hidden`` [B, T, H] is the fused target feature or the drafter's own ``hidden_out`` at the parent.
        ``attention_mask``: None is causal over cache + new; else float additive [B, 1, T, P+T] (tree drafting).
        ``past_key_values`` (a DynamicCache) is appended in place.
        """
        layer = self.layers[0]
        B, T = input_ids.shape
        embeds = layer.input_layernorm(self.embed_tokens(input_ids))  # [B, T, H]
        residual = hidden
        hidden = layer.hidden_norm(hidden)  # [B, T, H]
        if self.norm_before_residual:
            residual = hidden
        x = torch.cat([embeds, hidden], dim=-1)  # [B, T, 2H]

        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is None:
            attention_mask = causal_mask(T, past, x.dtype, x.device)
        attn, _ = layer.self_attn(
            hidden_states=x,
            position_embeddings=self.rotary_emb(x, position_ids),
            attention_mask=attention_mask.to(x.dtype),
            cache=past_key_values,
        )
        h = residual + attn  # [B, T, H]
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm_head(self.norm(h)), h

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
