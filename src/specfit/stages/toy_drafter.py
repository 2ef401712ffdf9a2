"""Stage toy_drafter: the toy's EAGLE-3 drafter, trained on the toy target's features with training-time test.

spec (config ``toy.drafter``, defaults in the schema; the rule adds seed and exclude_question_ids)::

    intermediate_size: 512      num_heads: 4            num_kv_heads: 2     (one Llama layer, the target's H)
    categories: [writing, ..., translation, qa, rag]   (the Spec-Bench categories of its chat prompts; never
                                the summarization articles, never an evaluated question: refused at config load)
    draft_vocab_size: 2048      (the tokens the target generates most often in that data, mapped by d2t / t2d as
                                in EAGLE-3; config.yaml: 864, the public Qwen3 drafters' share of the vocabulary)
    ttt_steps: 5                (EAGLE-3's training-time test: each step feeds back the drafter's own states)
    seq_len: 2048 (one piece per step: a prompt's end and the target's continuation)    lr: 2.0e-3
    steps: 1200                 max_minutes: 6          (a step budget; the limit is checked up front)
    acceptance_prompts: 12      acceptance_new_tokens: 128  (held-out prompts whose greedy continuations measure it)
    distill_prompts: 256        distill_new_tokens: 128     distill_max_prompt: 1536
                                (EAGLE's recipe: train along the target's own output, of chat prompts)
    span_max_words: 150         (longest random span among the self-distillation prompts, as toy.target's)
    heldout: 12                 seed: 0                 (as in the tokenizer and target stages)
    exclude_question_ids        (the evaluated ids, never trained on; required)

inputs: {questions: question.jsonl, target: folder}; outputs: {drafter: folder} in speculators format, without
embed_tokens (the target's, frozen, as EAGLE-3 trains it), and ``acceptance.json``: top-1 agreement with the
target and the mean accepted draft tokens per ``ttt_steps``-token chain, both along the target's own greedy
continuations of held-out prompts, with the steps, tokens, wall time and sha256 of the weights.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from specfit.io import atomic_path, write_json
from specfit.models.loading import load_target
from specfit.planning import paths
from specfit.planning.stage import stage_main
from specfit.toy.drafter import (
    acceptance,
    calibrate_confidence,
    chat_questions,
    draft_vocabulary,
    new_drafter,
    piece_windows,
    self_distillation,
    teacher,
    ttt_forward,
)
from specfit.toy.target import chat_ids
from specfit.toy.train import cosine_lr, seed_everything, split, state_digest, train_loop

log = logging.getLogger("specfit.stages.toy_drafter")


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    train, heldout = split(inputs["questions"], spec)  # first: refuses a spec without the evaluated ids
    train = chat_questions(train, spec["categories"])
    seed = spec["seed"]
    seed_everything(seed, spec["threads"])
    target, tokenizer = load_target(inputs["target"], dtype="float32", key="models.toy.target")
    target.requires_grad_(False)
    log.info("%d training questions of %s", len(train), ", ".join(spec["categories"]))
    pieces, replies = self_distillation(target.eval(), tokenizer, train, spec, seed)
    log.info("self-distillation: %d training prompts with the target's greedy continuations, %d tokens",
             len(pieces), sum(len(p) for p in pieces))
    vocab = target.config.vocab_size
    draft_tokens = draft_vocabulary(replies, torch.cat(chat_ids(tokenizer, train)), vocab,
                                    min(spec["draft_vocab_size"], vocab))  # [Vd]
    replied = torch.bincount(torch.cat(replies), minlength=vocab)
    coverage = (replied[draft_tokens].sum() / replied.sum()).item()
    log.info("draft vocabulary: %d tokens, %.1f%% of the target's training continuations", len(draft_tokens),
             100 * coverage)
    torch.manual_seed(seed)  # the drafter's initialization, whatever the distillation drew
    drafter = new_drafter(spec, target, draft_tokens, verifier=str(inputs["target"])).train()

    steps, lr, seq_len = spec["ttt_steps"], spec["lr"], spec["seq_len"]
    seen = 0  # tokens trained on
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)

    def step(i: int, progress: float) -> dict:
        nonlocal seen
        for group in opt.param_groups:
            group["lr"] = cosine_lr(lr, progress)
        ids = piece_windows(pieces, seq_len, gen)  # [1, T]
        seen += ids.shape[1]
        aux, teacher_logits, top = teacher(target, drafter, ids)
        loss, stats = 0.0, {}
        for k, logits in enumerate(ttt_forward(drafter, ids, drafter.fuse(aux), steps)):
            m = ids.shape[1] - 1 - k  # chains whose step-k label lies inside the window
            soft = F.softmax(teacher_logits[:, k + 1 :], dim=-1)  # [B, m, Vd] the target over the draft vocab
            step_loss = -(soft * F.log_softmax(logits[:, :m], dim=-1)).sum(-1).mean()
            loss = loss + step_loss
            stats[f"loss{k + 1}"] = step_loss.item()
            hits = drafter.to_target_ids(logits[:, :m].argmax(-1)) == top[:, k + 1 :]
            stats[f"acc{k + 1}"] = hits.float().mean().item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return stats

    stats = train_loop(step, spec["steps"], "toy drafter", spec["max_minutes"], key="toy.drafter")
    stats["tokens"] = seen
    stats["data"] = {"categories": list(spec["categories"]), "questions": len(train), "pieces": len(pieces),
                     "reply_tokens": int(replied.sum()), "draft_vocab_coverage": coverage}
    drafter.eval()
    measured, drafted = acceptance(target, tokenizer, drafter, heldout, spec)
    stats |= measured
    stats["confidence"] = calibrate_confidence(drafter, drafted)
    log.info("acceptance: %s", stats)
    with atomic_path(outputs["drafter"], directory=True) as tmp:
        drafter.save_pretrained(tmp)
        write_json(stats | {"sha256": state_digest(drafter)}, tmp / paths.TOY_RECORDS["drafter"])


main = stage_main(run, trains=True)

if __name__ == "__main__":
    main()
