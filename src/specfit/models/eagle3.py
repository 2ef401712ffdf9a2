"""The EAGLE-3 drafter, read and written in the vllm-project/speculators checkpoint format.

A first decoder layer (a Llama or Qwen3 layer of transformers whose q/k/v take ``2H`` inputs) over the target's
fused features, then ``num_hidden_layers - 1`` plain decoder layers of the same kind (usually none). The
target's hidden states at three layers (``aux_layer_ids``, the inputs of those layers, i.e.
``output_hidden_states`` entries) are concatenated and fused by ``fc``; drafter position ``t`` then takes
``(embed(x_{t+1}), h_t)`` and predicts ``x_{t+2}`` over a reduced draft vocabulary. At deeper draft steps ``h`` is
the drafter's own layer output at the parent position (its normed output with ``norm_output``).

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
all implemented; a config that sets an option this module does not know, or that is not a speculators EAGLE-3
checkpoint at all (a SpecForge / EAGLE training checkpoint, another speculators algorithm), is refused by name
(`check_config`) before any weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding

from specfit.errors import SpecFitError
from specfit.models.checkpoint import read_config, tensor_shapes, weight_files

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


def _set_by(key: str | None) -> str:
    return f" (set by `{key}` in config.yaml)" if key else ""


def check_config(config: dict, path, key: str | None = DRAFTER_KEY) -> None:
    """Refuse, by name, a drafter ``config.json`` this module would not run as it was trained."""
    where = f"the drafter at {path}{_set_by(key)}"
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


def linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)


def layer_input(drafter: Eagle3Drafter, input_ids, hidden) -> tuple[torch.Tensor, torch.Tensor]:
    """The first layer's attention input [B, T, 2H] (normed token embeddings beside the normed features) and its
    residual [B, T, H] (the features, normed with ``norm_before_residual``); both paths of `Eagle3Drafter.forward`."""
    layer = drafter.layers[0]
    embeds = layer.input_layernorm(F.embedding(input_ids, drafter.embed_tokens.weight))  # [B, T, H]
    normed = layer.hidden_norm(hidden)  # [B, T, H]
    return torch.cat([embeds, normed], dim=-1), (normed if drafter.norm_before_residual else hidden)


def first_layer(drafter: Eagle3Drafter, input_ids, hidden, position_embeddings, cache, mask) -> torch.Tensor:
    """EAGLE-3's first decoder layer as its transformers modules compute it, with the projections, the attention
    kernel and the gated MLP called directly (Llama or Qwen3 attention over grouped KV heads): [B, T, H] output.

    ``input_ids`` [B, T], ``hidden`` [B, T, H], ``position_embeddings`` the rotary (cos, sin) [B, T, D], ``mask``
    [B, 1, T, P+T] additive; the norms and the rotary embedding are the layer's own modules.
    """
    layer = drafter.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    B, T = input_ids.shape
    x, residual = layer_input(drafter, input_ids, hidden)
    D = attn.head_dim
    q, k, v = (linear(proj, x).view(B, T, -1, D) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head's dims
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), *position_embeddings)  # [B, heads, T, D]
    v = v.transpose(1, 2)
    if cache is not None:
        k, v = cache.update(k, v, 0)  # [B, kv heads, P+T, D]
    groups = attn.num_key_value_groups
    if T == 1 and groups > 1:  # one query: the query heads of a KV head as its rows, as transformers runs it
        out = F.scaled_dot_product_attention(q.reshape(B, -1, groups, D), k, v, attn_mask=mask, scale=attn.scaling)
        out = out.reshape(B, -1, 1, D)  # [B, heads, 1, D]
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=groups > 1)
    h = residual + linear(attn.o_proj, out.transpose(1, 2).reshape(B, T, -1))  # [B, T, H]
    m = layer.post_attention_layernorm(h)
    return h + linear(mlp.down_proj, mlp.act_fn(linear(mlp.gate_proj, m)) * linear(mlp.up_proj, m))


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
        self.norm_before_residual = bool(config.get("norm_before_residual", False))
        self.norm_output = bool(config.get("norm_output", False))

        self.embed_tokens = nn.Embedding(lc.vocab_size, H)
        n_aux = len(self.aux_layer_ids)
        # norm_before_fc: one norm over cat(h_a, h_b, h_c); fc_norm: cat(norm_a(h_a), norm_b(h_b), norm_c(h_c))
        self.input_norm = norm_cls(n_aux * target_hidden, eps=lc.rms_norm_eps) if config.get("norm_before_fc") else None
        self.fc_norm = (
            nn.ModuleList([norm_cls(target_hidden, eps=lc.rms_norm_eps) for _ in range(n_aux)])
            if config.get("fc_norm") else None
        )
        self.fc = nn.Linear(n_aux * target_hidden, H, bias=False)
        layer = layer_cls(lc, layer_idx=0)
        # EAGLE-3's first layer: attention reads cat(embeds, hidden), and the hidden half has its own norm
        attn = layer.self_attn
        head_dim = attn.head_dim
        attn.q_proj = nn.Linear(2 * H, lc.num_attention_heads * head_dim, bias=lc.attention_bias)
        attn.k_proj = nn.Linear(2 * H, lc.num_key_value_heads * head_dim, bias=lc.attention_bias)
        attn.v_proj = nn.Linear(2 * H, lc.num_key_value_heads * head_dim, bias=lc.attention_bias)
        layer.hidden_norm = norm_cls(H, eps=lc.rms_norm_eps)
        # further layers (speculators: num_hidden_layers > 1) are plain decoder layers over the first one's output
        self.layers = nn.ModuleList([layer, *(layer_cls(lc, layer_idx=i) for i in range(1, lc.num_hidden_layers))])
        self.norm = norm_cls(H, eps=lc.rms_norm_eps)
        self.lm_head = nn.Linear(H, self.draft_vocab_size, bias=False)
        self.rotary_emb = rotary_cls(lc)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(lc.vocab_size, dtype=torch.bool))
        self.embed_from_target = False  # True: embed_tokens is the target's, not saved with the drafter

    @staticmethod
    def read_config(path, key: str | None = DRAFTER_KEY) -> dict:
        """The drafter's ``config.json``, checked (`check_config`); no weight is read."""
        config = read_config(path, "EAGLE-3 drafter", key or DRAFTER_KEY)
        check_config(config, path, key)
        return config

    @staticmethod
    def with_aux_layer_ids(config: dict, target_layers: int | None, path) -> dict:
        """``config`` with EAGLE-3's default taps of a ``target_layers``-layer target when it names none."""
        if config.get("eagle_aux_hidden_state_layer_ids"):
            return config
        if target_layers is None:
            raise SpecFitError(
                f"{Path(path) / 'config.json'} has no eagle_aux_hidden_state_layer_ids; pass the target to take the "
                "default"
            )
        return dict(config, eagle_aux_hidden_state_layer_ids=list(default_aux_layer_ids(target_layers)))

    @classmethod
    def check_weights(cls, config: dict, shapes: dict, path, key: str | None = DRAFTER_KEY,
                      embed_from_target: bool = False) -> None:
        """The tensors ``shapes`` (name -> shape, from the safetensors headers) are exactly what ``config`` needs.

        ``embed_from_target``: a missing ``embed_tokens.weight`` will be the target's. A full draft vocabulary
        needs no ``d2t``/``t2d``. speculators' training-only ``verifier_*`` tensors are ignored.
        """
        with torch.device("meta"):
            model = cls(config)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        present = {k: v for k, v in shapes.items() if not k.startswith("verifier_")}
        optional = {"embed_tokens.weight"} if embed_from_target else set()
        if model.draft_vocab_size == model.embed_tokens.num_embeddings:
            optional |= {"d2t", "t2d"}
        missing = sorted(set(expected) - set(present) - optional)
        unexpected = sorted(set(present) - set(expected))
        where = f"the drafter at {path}{_set_by(key)}"
        if "embed_tokens.weight" in missing:
            raise SpecFitError(f"{where} has no embed_tokens; pass the target to take its embedding")
        if missing or unexpected:
            hints = sorted({h for name in unexpected for p, h in UNEXPECTED_HINTS.items() if name.startswith(p)})
            layers = config["transformer_layer_config"].get("num_hidden_layers", 1)
            if any(n.startswith("layers.") and not n.startswith("layers.0.") for n in unexpected):
                hints.append(f"more decoder layers than transformer_layer_config.num_hidden_layers = {layers}")
            hint = f"; the unexpected tensors belong to {' and '.join(hints)}" if hints else ""
            raise SpecFitError(
                f"the weights of {where} do not fit its config.json: missing {missing}, unexpected {unexpected}{hint}"
            )
        for name, shape in present.items():
            if shape != expected[name]:
                raise SpecFitError(
                    f"drafter tensor {name} of {where} has shape {shape}, its config.json implies {expected[name]}"
                )

    @classmethod
    def from_pretrained(cls, path, target=None, dtype=None, device=None, key: str | None = DRAFTER_KEY
                        ) -> Eagle3Drafter:
        path = Path(path)
        config = cls.read_config(path, key)
        target_layers = target.config.get_text_config().num_hidden_layers if target is not None else None
        config = cls.with_aux_layer_ids(config, target_layers, path)
        files = weight_files(path, "EAGLE-3 drafter", key or DRAFTER_KEY)
        cls.check_weights(config, tensor_shapes(files), path, key, embed_from_target=target is not None)
        state = {}
        for file in files:
            state.update(load_file(file))
        # speculators keeps training-only copies of the verifier's head; the drafter does not use them
        state = {k: v for k, v in state.items() if not k.startswith("verifier_")}
        if dtype is None:
            dtype = target.dtype if target is not None else state["fc.weight"].dtype

        with torch.device("meta"):  # no random init of a [V, H] embedding that is overwritten at once
            model = cls(config)
        V, H = model.embed_tokens.weight.shape
        embed_from_target = "embed_tokens.weight" not in state
        if embed_from_target:
            embed = target.get_input_embeddings().weight.detach()
            if tuple(embed.shape) != (V, H):
                raise SpecFitError(
                    f"the drafter at {path}{_set_by(key)} has no embed_tokens and its [vocab, hidden] = {[V, H]} "
                    f"differs from the target's embedding {list(embed.shape)}: it cannot take the target's"
                )
            state["embed_tokens.weight"] = embed
        if "d2t" not in state:  # a full draft vocabulary needs no mapping
            state["d2t"] = torch.zeros(V, dtype=torch.long)
            state["t2d"] = torch.ones(V, dtype=torch.bool)
        for name, tensor in state.items():
            if tensor.is_floating_point():
                state[name] = tensor.to(dtype)
        model.load_state_dict(state, assign=True)
        # inv_freq is a non-persistent buffer, so it was left on meta: rebuild it in fp32
        model.rotary_emb = LAYER_CLASSES[model.layer_config.model_type][2](model.layer_config)
        model.embed_from_target = embed_from_target
        mapped = torch.arange(model.draft_vocab_size) + model.d2t.cpu()  # [Vd] target ids
        if mapped.min() < 0 or mapped.max() >= V or mapped.unique().numel() != model.draft_vocab_size:
            raise SpecFitError(
                f"the drafter at {path}{_set_by(key)} has a d2t that does not map its {model.draft_vocab_size} "
                f"draft tokens onto distinct ids of the target's vocabulary of {V}"
            )
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
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            aux = torch.cat([norm(h) for norm, h in zip(self.fc_norm, aux.chunk(len(self.fc_norm), dim=-1))], dim=-1)
        return self.fc(aux)

    def forward(self, input_ids, hidden, position_ids, past_key_values=None, attention_mask=None):
        """One drafter step over T new positions; returns (logits [B, T, Vd], hidden_out [B, T, H]).

        ``hidden`` [B, T, H] is the fused target feature or the drafter's own ``hidden_out`` at the parent
        (with ``norm_output``, the normed output, as speculators trains it; else the last layer's raw output).
        ``attention_mask``: None is causal over cache + new; else float additive [B, 1, T, P+T] (tree drafting).
        ``past_key_values`` (a DynamicCache) is appended in place.

        With gradients on (training) it runs through its transformers modules; without (drafting), the first layer
        calls its projections, attention kernel and MLP directly (`first_layer`), bit-equal to the modules
        (tests/models/test_eagle3.py): at batch 1 a step of this size is mostly per-call overhead.
        """
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is None:
            attention_mask = causal_mask(input_ids.shape[1], past, hidden.dtype, hidden.device)
        attention_mask = attention_mask.to(hidden.dtype)
        position_embeddings = self.rotary_emb(hidden, position_ids)  # (cos, sin) [B, T, D]
        if torch.is_grad_enabled():  # training: autograd through the transformers modules
            h = self._first_layer_modules(input_ids, hidden, position_embeddings, past_key_values, attention_mask)
        else:
            h = first_layer(self, input_ids, hidden, position_embeddings, past_key_values, attention_mask)
        for extra in self.layers[1:]:
            h = extra(h, attention_mask=attention_mask, cache=past_key_values, position_embeddings=position_embeddings)
        out = self.norm(h)  # [B, T, H]
        return self.lm_head(out), (out if self.norm_output else h)

    def _first_layer_modules(self, input_ids, hidden, position_embeddings, past_key_values, attention_mask):
        """The first layer through its transformers modules: [B, T, H]."""
        layer = self.layers[0]
        x, residual = layer_input(self, input_ids, hidden)
        attn, _ = layer.self_attn(hidden_states=x, position_embeddings=position_embeddings,
                                  attention_mask=attention_mask, cache=past_key_values)
        h = residual + attn  # [B, T, H]
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
