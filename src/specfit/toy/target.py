"""Stage: the toy target, a small Qwen3-MoE language model trained on Spec-Bench text.

spec (config ``toy.target``, defaults in the schema; the rule adds seed and exclude_question_ids)::

    hidden_size: 128            num_layers: 4           num_heads: 4 (head_dim = hidden_size / num_heads)
    num_kv_heads: 2             num_experts: 32         top_k: 4            moe_intermediate_size: 128
    seq_len: 512                batch_size: 4           lr: 4.0e-3
    steps: 600                  max_minutes: 8          seed: 0     (a step budget; the limit is checked up front)
    span_conversations: 6000    span_max_words: 150     (random-span Lead-3 conversations beside the questions')
    unlikelihood: 1.0           (weight of the token-level unlikelihood loss against loops; 0: plain LM loss)
    router_aux_loss_coef: 0.01  (the load-balancing loss; without it routing collapses onto a few experts)
    heldout: 12                 (as in the tokenizer and drafter stages)
    exclude_question_ids        (the evaluated ids, never trained on; required)

The vocabulary is the tokenizer's. inputs: {questions: question.jsonl, tokenizer: folder};
outputs: {target: folder} holding the fp32 model and the tokenizer, loadable like any HF checkpoint, and
``training.json`` (steps, tokens, wall time, threads, losses, held-out loss overall and on the assistant's replies,
expert load on held-out text, sha256 of the weights).
"""

from __future__ import annotations

import logging
import random

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

from specfit import paths
from specfit.io import atomic_path, write_json
from specfit.stage import stage_main
from specfit.toy.tokenizer import ASSISTANT, USER
from specfit.toy.train import (
    conversations,
    cosine_lr,
    seed_everything,
    span_conversations,
    split,
    state_digest,
    train_loop,
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


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    train, heldout = split(inputs["questions"], spec)  # first: refuses a spec without the evaluated ids
    seed = spec["seed"]
    seed_everything(seed, spec["threads"])
    tokenizer = AutoTokenizer.from_pretrained(inputs["tokenizer"])
    stream, reply = training_stream(tokenizer, train, spec["span_conversations"], seed, spec["span_max_words"])
    unlikelihood = spec["unlikelihood"]
    seq_len, batch_size, lr = spec["seq_len"], spec["batch_size"], spec["lr"]
    log.info("training text: %d tokens from %d questions", len(stream), len(train))

    model = Qwen3MoeForCausalLM(toy_config(spec, tokenizer)).train()
    log.info("toy target: %.1fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)
    # weight decay on matrices only (as nanoGPT): decayed RMSNorm gains, q_norm and k_norm among them, would cap
    # the attention logits that copying a token from hundreds of positions back needs
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    gains = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": gains, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)

    def step(i: int, progress: float) -> dict:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(lr, progress)
        start = torch.randint(0, len(stream) - seq_len, (batch_size,), generator=gen).tolist()
        x = torch.stack([stream[s : s + seq_len] for s in start])  # [B, T]
        out = model(x, output_router_logits=True)
        nll = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), x[:, 1:].flatten(), reduction="none")  # [B*(T-1)]
        loss = nll.mean() + model.config.router_aux_loss_coef * out.aux_loss
        stats = {}
        if unlikelihood > 0:
            ul = unlikelihood_loss(out.logits[:, :-1], x)
            loss = loss + unlikelihood * ul
            stats["ul_loss"] = ul.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        on_reply = torch.stack([reply[s + 1 : s + seq_len] for s in start]).flatten()  # [B*(T-1)]
        return {"loss": nll.mean().item(), "reply_loss": nll[on_reply].mean().item() if on_reply.any() else 0.0,
                "aux_loss": out.aux_loss.item(), **stats}

    stats = train_loop(step, spec["steps"], "toy target", spec["max_minutes"], key="toy.target")
    stats["tokens"] = spec["steps"] * batch_size * seq_len
    stats |= heldout_stats(model, chat_ids(tokenizer, heldout), tokenizer.convert_tokens_to_ids(ASSISTANT))
    log.info("held-out loss %.3f, max expert share per layer %s", stats["heldout_loss"], stats["expert_share_max"])
    with atomic_path(outputs["target"], directory=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        write_json(stats | {"sha256": state_digest(model)}, tmp / paths.TOY_RECORDS["target"])


main = stage_main(run, trains=True)

if __name__ == "__main__":
    main()
