"""The EAGLE-3 drafter module, read and written in the speculators checkpoint format (`specfit.models.speculators`).

A first decoder layer (a Llama or Qwen3 layer of transformers whose q/k/v take ``2H`` inputs) over the target's
fused features, then ``num_hidden_layers - 1`` plain decoder layers of the same kind (usually none). The
target's hidden states at three layers (``aux_layer_ids``, the inputs of those layers, i.e.
``output_hidden_states`` entries) are concatenated and fused by ``fc``; drafter position ``t`` then takes
``(embed(x_{t+1}), h_t)`` and predicts ``x_{t+2}`` over a reduced draft vocabulary. At deeper draft steps ``h`` is
the drafter's own layer output at the parent position (its normed output with ``norm_output``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specfit.errors import SpecFitError
from specfit.models.checkpoint import read_config, tensor_shapes, weight_files
from specfit.models.speculators import (
    DRAFTER_KEY,
    LAYER_CLASSES,
    UNEXPECTED_HINTS,
    build_layer_config,
    check_config,
    default_aux_layer_ids,
    set_by,
)


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



class Eagle3Drafter(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        self.layer_config = lc = build_layer_config(config)
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
        where = f"the drafter at {path}{set_by(key)}"
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
                    f"the drafter at {path}{set_by(key)} has no embed_tokens and its [vocab, hidden] = {[V, H]} "
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
                f"the drafter at {path}{set_by(key)} has a d2t that does not map its {model.draft_vocab_size} "
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
