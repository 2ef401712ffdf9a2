"""Stage: the toy target, a small Qwen3-MoE language model trained on Spec-Bench text.

spec (config ``toy.target``, defaults as in the schema; num_heads, router_aux_loss_coef and heldout are stage options)::

    hidden_size: 128            num_layers: 4           num_heads: 4 (head_dim = hidden_size / num_heads)
    num_experts: 32             top_k: 4                moe_intermediate_size: 128
    seq_len: 512                batch_size: 4           lr: 4.0e-3
    steps: 800                  max_minutes: 8          seed: 0     (a step budget; the limit is checked up front)
    router_aux_loss_coef: 0.01  (the load-balancing loss; without it routing collapses onto a few experts)
    heldout: 12                 (as in the tokenizer and drafter stages)

The vocabulary is the tokenizer's. inputs: {questions: question.jsonl, tokenizer: folder};
outputs: {target: folder} holding the fp32 model and the tokenizer, loadable like any HF checkpoint, and
``training.json`` (steps, tokens, wall time, losses, expert load on held-out text, sha256 of the weights).
"""

from __future__ import annotations

import logging
import random

import torch
from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

from specfit.io import atomic_path, write_json
from specfit.stage import stage_main
from specfit.toy.tokenizer import ASSISTANT
from specfit.toy.train import conversations, cosine_lr, span_conversations, seed_everything, split, state_digest, train_loop, windows

log = logging.getLogger(__name__)


def chat_ids(tokenizer, questions: list[dict] | None = None, chats: list[list[dict]] | None = None) -> list[torch.Tensor]:
    """Token ids of each toy conversation (of ``questions``, or ``chats``), ending with the end-of-turn token."""
    chats = conversations(questions) if chats is None else chats
    texts = tokenizer.apply_chat_template(chats, tokenize=False)
    return [torch.tensor(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def training_stream(tokenizer, train: list[dict], spans: int, seed: int) -> torch.Tensor:
    """[N] the training conversations and ``spans`` random-span ones, shuffled by ``seed``, back to back."""
    chats = conversations(train) + span_conversations(train, spans, seed)
    random.Random(seed).shuffle(chats)
    return torch.cat(chat_ids(tokenizer, chats=chats))


def toy_config(spec: dict, tokenizer) -> Qwen3MoeConfig:
    H, heads = spec.get("hidden_size", 128), spec.get("num_heads", 4)
    return Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=H,
        intermediate_size=spec.get("moe_intermediate_size", 128),
        moe_intermediate_size=spec.get("moe_intermediate_size", 128),
        num_hidden_layers=spec.get("num_layers", 4),
        num_attention_heads=heads,
        num_key_value_heads=spec.get("num_kv_heads", heads // 2),
        head_dim=H // heads,
        num_experts=spec.get("num_experts", 32),
        num_experts_per_tok=spec.get("top_k", 4),
        norm_topk_prob=True,
        router_aux_loss_coef=spec.get("router_aux_loss_coef", 0.01),
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
    seed = spec.get("seed", 0)
    seed_everything(seed)
    tokenizer = AutoTokenizer.from_pretrained(inputs["tokenizer"])
    train, heldout = split(inputs["questions"], spec.get("heldout", 12), seed)
    stream = training_stream(tokenizer, train, spec.get("span_conversations", 6000), seed)
    seq_len, batch_size, lr = spec.get("seq_len", 2048), spec.get("batch_size", 1), spec.get("lr", 4e-3)
    log.info("training text: %d tokens from %d questions", len(stream), len(train))

    model = Qwen3MoeForCausalLM(toy_config(spec, tokenizer)).train()
    log.info("toy target: %.1fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)

    def step(i: int, progress: float) -> dict:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(lr, progress)
        x = windows(stream, batch_size, seq_len, gen)  # [B, T]
        out = model(x, labels=x, output_router_logits=True)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return {"loss": out.loss.item(), "aux_loss": out.aux_loss.item()}

    stats = train_loop(step, spec["steps"], "toy target", spec.get("max_minutes"), key="toy.target")
    stats["tokens"] = spec["steps"] * batch_size * seq_len
    stats |= heldout_stats(model, chat_ids(tokenizer, heldout), tokenizer.convert_tokens_to_ids(ASSISTANT))
    log.info("held-out loss %.3f, max expert share per layer %s", stats["heldout_loss"], stats["expert_share_max"])
    with atomic_path(outputs["target"], directory=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        write_json(stats | {"sha256": state_digest(model)}, tmp / "training.json")


main = stage_main(run)

if __name__ == "__main__":
    main()
