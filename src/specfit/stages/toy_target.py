"""Stage toy_target: the toy target, a small Qwen3-MoE language model trained on Spec-Bench text.

spec (config ``toy.target``, defaults in the schema; the rule adds seed and exclude_question_ids)::

    hidden_size: 128            num_layers: 4           num_heads: 4 (head_dim = hidden_size / num_heads)
    num_kv_heads: 2             num_experts: 32         top_k: 4            moe_intermediate_size: 128
    seq_len: 2176               batch_size: 1           lr: 4.0e-3
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

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, Qwen3MoeForCausalLM

from specfit.io import atomic_path, write_json
from specfit.planning import paths
from specfit.planning.stage import stage_main
from specfit.toy.target import chat_ids, heldout_stats, toy_config, training_stream, unlikelihood_loss
from specfit.toy.tokenizer import ASSISTANT
from specfit.toy.train import cosine_lr, seed_everything, split, state_digest, train_loop

log = logging.getLogger("specfit.stages.toy_target")


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
