"""Stage: the toy target, a small Qwen3-MoE language model trained on Spec-Bench text.

spec (config ``toy.target``, defaults as in the schema; num_heads, router_aux_loss_coef and heldout are stage options)::

    hidden_size: 128            num_layers: 4           num_heads: 4 (head_dim = hidden_size / num_heads)
    num_experts: 32             top_k: 4                moe_intermediate_size: 128
    seq_len: 512                batch_size: 4           lr: 4.0e-3
    train_seconds: 150          max_steps: 3000         seed: 0
    router_aux_loss_coef: 0.01  (the load-balancing loss; without it routing collapses onto a few experts)
    heldout: 12                 (as in the tokenizer and drafter stages)

The vocabulary is the tokenizer's. inputs: {questions: question.jsonl, tokenizer: folder};
outputs: {target: folder} holding the fp32 model and the tokenizer, loadable like any HF checkpoint, and
``training.json`` (steps, seconds, losses, expert load on held-out text).
"""

from __future__ import annotations

import logging
import torch
from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

from specfit.io import atomic_path, write_json
from specfit.stage import stage_main
from specfit.toy.train import conversations, cosine_lr, seed_everything, split, train_loop, windows

log = logging.getLogger(__name__)


def chat_ids(tokenizer, questions: list[dict]) -> list[torch.Tensor]:
    """Token ids of each question's toy conversation, ending with the end-of-turn token."""
    return [
        torch.tensor(tokenizer.apply_chat_template(chat, tokenize=True)["input_ids"])
        for chat in conversations(questions)
    ]


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
def heldout_stats(model, ids: list[torch.Tensor], max_len: int = 1024) -> dict:
    """Next-token loss and expert load on held-out conversations: a collapsed router shows up here."""
    model.eval()
    E, k = model.config.num_experts, model.config.num_experts_per_tok
    loss, n, load = 0.0, 0, torch.zeros(model.config.num_hidden_layers, E)
    for x in ids:
        x = x[None, :max_len]  # [1, T]
        out = model(x, labels=x, output_router_logits=True)
        m = x.shape[1] - 1
        loss += (out.loss.item() - model.config.router_aux_loss_coef * out.aux_loss.item()) * m
        n += m
        for layer, logits in enumerate(out.router_logits):  # [T, E] per layer
            load[layer] += torch.bincount(logits.topk(k, dim=-1).indices.flatten(), minlength=E)
    share = load / load.sum(1, keepdim=True)  # [L, E] fraction of routed tokens per expert
    return {
        "heldout_loss": loss / n,
        "expert_share_max": share.max(1).values.tolist(),
        "experts_unused": (share == 0).sum(1).tolist(),
    }


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    seed = spec.get("seed", 0)
    seed_everything(seed)
    tokenizer = AutoTokenizer.from_pretrained(inputs["tokenizer"])
    train, heldout = split(inputs["questions"], spec.get("heldout", 12), seed)
    stream = torch.cat(chat_ids(tokenizer, train))
    seq_len, batch_size, lr = spec.get("seq_len", 512), spec.get("batch_size", 4), spec.get("lr", 4e-3)
    seconds, max_steps = spec.get("train_seconds", 150), spec.get("max_steps", 3000)
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

    stats = train_loop(step, seconds, max_steps, "toy target")
    stats |= heldout_stats(model, chat_ids(tokenizer, heldout))
    log.info("held-out loss %.3f, max expert share per layer %s", stats["heldout_loss"], stats["expert_share_max"])
    with atomic_path(outputs["target"], directory=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        write_json(stats, tmp / "training.json")


main = stage_main(run)

if __name__ == "__main__":
    main()
