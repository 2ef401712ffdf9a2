"""The toy target: a small Qwen3MoeForCausalLM, its config, training stream and held-out statistics (trained by the
toy_target stage)."""

from __future__ import annotations

import logging
import random

import torch
from transformers import Qwen3MoeConfig

from specfit.toy.tokenizer import ASSISTANT, USER
from specfit.toy.train import (
    conversations,
    span_conversations,
)

log = logging.getLogger(__name__)


def chat_ids(tokenizer, questions: list[dict] | None = None,
             chats: list[list[dict]] | None = None) -> list[torch.Tensor]:
    """Token ids of each toy conversation (of ``questions``, or ``chats``), ending with the end-of-turn token."""
    chats = conversations(questions) if chats is None else chats
    texts = tokenizer.apply_chat_template(chats, tokenize=False)
    return [torch.tensor(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def training_stream(tokenizer, train: list[dict], spans: int, seed: int,
                    max_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([N] tokens, [N] bool: inside an assistant reply) of the training conversations and ``spans`` random-span
    ones, shuffled by ``seed``, back to back."""
    chats = conversations(train) + span_conversations(train, spans, seed, max_words)
    random.Random(seed).shuffle(chats)
    ids = torch.cat(chat_ids(tokenizer, chats=chats))
    user, assistant = tokenizer.convert_tokens_to_ids([USER, ASSISTANT])
    at = torch.arange(len(ids))
    last_user = torch.where(ids == user, at, -1).cummax(0).values  # [N] the latest <|user|> so far
    last_assistant = torch.where(ids == assistant, at, -1).cummax(0).values
    return ids, (last_assistant > last_user) & (ids != assistant)


def unlikelihood_loss(logits: torch.Tensor, x: torch.Tensor, window: int = 64) -> torch.Tensor:
    """Token-level unlikelihood (Welleck et al., 2020, "Neural text degeneration with unlikelihood training").

    ``logits`` [B, T-1, V] predict ``x[:, 1:]`` from ``x`` [B, T]. At each position the tokens of the previous
    ``window`` inputs, other than the true next token, are negative candidates: the loss is the mean over
    positions of -Σ_c log(1 - p(c)). A small greedy LM otherwise falls into loops (the same phrase again and
    again), which a drafter predicts trivially: the toy should earn its acceptance on text that moves on.
    """
    B, T1, V = logits.shape
    seen = torch.zeros(B, T1, V, dtype=torch.bool, device=logits.device)  # [B, T-1, V]
    for lag in range(window):  # position t sees inputs t-lag
        if lag >= T1:
            break
        seen[:, lag:].scatter_(2, x[:, : T1 - lag, None], True)
    seen.scatter_(2, x[:, 1:, None], False)  # the true next token is no negative
    p = torch.softmax(logits.float(), dim=-1)  # [B, T-1, V]
    return -(torch.log1p(-p.clamp(max=1 - 1e-5)) * seen).sum(-1).mean()


def toy_config(spec: dict, tokenizer) -> Qwen3MoeConfig:
    H, heads = spec["hidden_size"], spec["num_heads"]
    return Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=H,
        intermediate_size=spec["moe_intermediate_size"],
        moe_intermediate_size=spec["moe_intermediate_size"],
        num_hidden_layers=spec["num_layers"],
        num_attention_heads=heads,
        num_key_value_heads=spec["num_kv_heads"],
        head_dim=H // heads,
        num_experts=spec["num_experts"],
        num_experts_per_tok=spec["top_k"],
        norm_topk_prob=True,
        router_aux_loss_coef=spec["router_aux_loss_coef"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


@torch.no_grad()
def heldout_stats(model, ids: list[torch.Tensor], assistant_id: int, max_len: int = 2048) -> dict:
    """Next-token loss (all tokens, and the assistant's reply alone) and expert load on held-out conversations:
    a collapsed router shows up here."""
    model.eval()
    E, k = model.config.num_experts, model.config.num_experts_per_tok
    loss, n, load = 0.0, 0, torch.zeros(model.config.num_hidden_layers, E)
    reply_loss, reply_n = 0.0, 0
    for x in ids:
        x = x[None, :max_len]  # [1, T]
        out = model(x, output_router_logits=True)
        nll = torch.nn.functional.cross_entropy(out.logits[0, :-1], x[0, 1:], reduction="none")  # [T-1]
        reply = torch.cumsum(x[0, :-1] == assistant_id, 0) > 0  # predictions made inside the assistant turn
        loss, n = loss + nll.sum().item(), n + nll.numel()
        reply_loss, reply_n = reply_loss + nll[reply].sum().item(), reply_n + int(reply.sum())
        for layer, logits in enumerate(out.router_logits):  # [T, E] per layer
            load[layer] += torch.bincount(logits.topk(k, dim=-1).indices.flatten(), minlength=E)
    share = load / load.sum(1, keepdim=True)  # [L, E] fraction of routed tokens per expert
    return {
        "heldout_loss": loss / n,
        "heldout_reply_loss": reply_loss / max(1, reply_n),
        "expert_share_max": share.max(1).values.tolist(),
        "experts_unused": (share == 0).sum(1).tolist(),
    }
