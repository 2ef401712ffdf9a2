"""Stage: the toy's EAGLE-3 drafter, trained on the toy target's features with training-time test.

spec (config ``toy.drafter``)::

    intermediate_size: 512      num_heads: 4            num_kv_heads: 2     (one Llama layer, the target's H)
    draft_vocab_size: 2048      (the most frequent training tokens, mapped by d2t / t2d as in EAGLE-3)
    ttt_steps: 3                (EAGLE-3's training-time test: each step feeds back the drafter's own states)
    seq_len: 512                batch_size: 4           lr: 2.0e-3
    train_seconds: 80           max_steps: 2000         (config ``toy.drafter``; the rest are stage options)
    agreement_texts: 6          (held-out conversations, first 512 tokens each, for top-1 agreement)
    acceptance_prompts: 4       acceptance_new_tokens: 48
    distill_prompts: 192        distill_new_tokens: 64      (EAGLE's recipe: train along the target's own output)
    heldout: 12                 seed: 0                 (as in the tokenizer and target stages)

inputs: {questions: question.jsonl, target: folder}; outputs: {drafter: folder} in speculators format, without
embed_tokens (the target's, frozen, as EAGLE-3 trains it), and ``acceptance.json``: top-1 agreement with the
target on held-out text, and the mean accepted draft tokens per 3-token chain along the target's own greedy
output on held-out prompts.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from transformers import DynamicCache, LlamaConfig

from specfit.io import atomic_path, write_json
from specfit.models.eagle3 import Eagle3Drafter, aux_hidden_states, default_aux_layer_ids, eagle3_config
from specfit.models.loading import load_target
from specfit.stage import stage_main
from specfit.toy.target import chat_ids
from specfit.toy.train import cosine_lr, seed_everything, split, train_loop, windows

log = logging.getLogger(__name__)


def new_drafter(spec: dict, target, draft_tokens: torch.Tensor, verifier: str) -> Eagle3Drafter:
    """A fresh drafter over ``draft_tokens`` ([Vd] sorted target ids) with the target's frozen embedding."""
    tc = target.config
    heads = spec.get("num_heads", 4)
    layer_config = LlamaConfig(
        hidden_size=tc.hidden_size,
        intermediate_size=spec.get("intermediate_size", 512),
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=spec.get("num_kv_heads", 2),
        head_dim=tc.hidden_size // heads,
        vocab_size=tc.vocab_size,
        rms_norm_eps=tc.rms_norm_eps,
        max_position_embeddings=tc.max_position_embeddings,
        rope_parameters=tc.rope_parameters,
    )
    aux = default_aux_layer_ids(tc.num_hidden_layers)
    steps = spec.get("ttt_steps", 3)
    config = eagle3_config(layer_config, len(draft_tokens), aux, verifier=verifier, speculative_tokens=steps)
    drafter = Eagle3Drafter(config)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        drafter.d2t.copy_(draft_tokens - torch.arange(len(draft_tokens)))
        drafter.t2d[draft_tokens] = True
    drafter.embed_tokens.requires_grad_(False)
    drafter.embed_from_target = True
    return drafter


def ttt_mask(n: int, step: int) -> torch.Tensor:
    """[1, 1, n, step*n] additive mask of training-time test step ``step`` (1-based).

    Query ``t`` is draft depth ``step`` of the chain rooted at target position ``t``: it sees the first step's
    keys at ``<= t`` (real target features) and its own chain's keys at ``t`` in the later steps.
    """
    causal = torch.ones(n, n).tril()
    mask = torch.cat([causal] + [torch.eye(n)] * (step - 1), dim=1)  # [n, step*n]
    return torch.zeros(1, 1, n, step * n).masked_fill(mask[None, None] == 0, float("-inf"))


def ttt_forward(drafter: Eagle3Drafter, ids: torch.Tensor, fused: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Draft logits of every ``steps``-token chain along a sequence, in ``steps`` batched drafter calls.

    ``ids`` [B, T] target tokens, ``fused`` [B, T, H] fused target features. Index ``t`` roots a chain at
    target position ``t``: step ``k`` there predicts token ``t + k + 1`` (logits [B, T-1, Vd] per step) from
    the drafter's own token and hidden state of step ``k - 1``, exactly as chain drafting does at inference.
    """
    n = ids.shape[1] - 1
    x, h = ids[:, 1:], fused[:, :-1]  # [B, n], [B, n, H]: (embed(x_{t+1}), h_t)
    pos = torch.arange(n)[None].expand(ids.shape[0], -1)  # [B, n]
    cache, out = DynamicCache(), []
    for k in range(1, steps + 1):
        logits, h = drafter(x, h, pos + k - 1, cache, ttt_mask(n, k))
        out.append(logits)
        x = drafter.to_target_ids(logits.argmax(-1))
    return out


@torch.no_grad()
def teacher(target, drafter, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(aux states [B, T, 3H], target logits over the draft vocab [B, T, Vd], target argmax [B, T])."""
    out = target(ids, output_hidden_states=True)
    aux = aux_hidden_states(out.hidden_states, drafter.aux_layer_ids)
    draft_vocab = drafter.to_target_ids(torch.arange(drafter.draft_vocab_size))  # [Vd] target ids
    return aux, out.logits[..., draft_vocab], out.logits.argmax(-1)


@torch.no_grad()
def self_distillation(target, tokenizer, questions: list[dict], spec: dict) -> torch.Tensor:
    """[N] token stream of training prompts (their last 256 tokens) each followed by the target's own greedy
    continuation: the drafter then learns the distribution it drafts along at decode time, as EAGLE trains on
    the target's generations rather than on human text."""
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                      tokenize=False)
        for q in questions[: spec.get("distill_prompts", 192)]
    ]
    tokenizer.truncation_side = "left"
    pieces = []
    for i in range(0, len(texts), 16):
        batch = tokenizer(texts[i : i + 16], return_tensors="pt", padding=True, truncation=True, max_length=256,
                          add_special_tokens=False)
        out = target.generate(**batch, max_new_tokens=spec.get("distill_new_tokens", 64), do_sample=False,
                              pad_token_id=tokenizer.pad_token_id)  # [b, P + N], prompts left-padded
        for row, pads in zip(out, (batch["attention_mask"] == 0).sum(1).tolist()):
            row = row[pads:]
            eos = (row[batch["input_ids"].shape[1] - pads :] == tokenizer.eos_token_id).nonzero()
            if len(eos):  # generate pads a finished sequence: keep it up to its end-of-turn token
                row = row[: batch["input_ids"].shape[1] - pads + int(eos[0]) + 1]
            pieces.append(row)
    return torch.cat(pieces)


@torch.no_grad()
def acceptance(target, tokenizer, drafter, heldout: list[dict], spec: dict) -> dict:
    """Top-1 agreement on held-out text, and accepted tokens per chain along the target's greedy output."""
    steps = spec.get("ttt_steps", 3)
    agree, n = torch.zeros(steps), torch.zeros(steps)
    for x in chat_ids(tokenizer, heldout[: spec.get("agreement_texts", 6)]):
        x = x[None, :512]  # [1, T]
        aux, _, top = teacher(target, drafter, x)
        for k, logits in enumerate(ttt_forward(drafter, x, drafter.fuse(aux), steps)):
            m = x.shape[1] - 1 - k  # chains whose step-k token is in the text
            agree[k] += (drafter.to_target_ids(logits[0, :m].argmax(-1)) == top[0, k + 1 :]).sum()
            n[k] += m

    accepted = []
    for q in heldout[: spec.get("acceptance_prompts", 4)]:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"][:, -1024:]
        seq = target.generate(
            prompt, max_new_tokens=spec.get("acceptance_new_tokens", 48), do_sample=False,
            eos_token_id=None, pad_token_id=tokenizer.pad_token_id,
        )  # [1, P + N] the target's own greedy output
        aux, _, _ = teacher(target, drafter, seq)
        chains = [drafter.to_target_ids(l.argmax(-1))[0] for l in ttt_forward(drafter, seq, drafter.fuse(aux), steps)]
        P, T = prompt.shape[1], seq.shape[1]
        for t in range(P - 1, T - steps - 1):  # chain rooted at t drafts tokens t+2 .. t+steps+1
            hits = [bool(chains[k][t] == seq[0, t + k + 2]) for k in range(steps)]
            accepted.append(next((k for k, hit in enumerate(hits) if not hit), steps))
    return {
        "top1_agreement": (agree[0] / n[0]).item(),
        "agreement_per_step": (agree / n).tolist(),
        "heldout_tokens": int(n[0]),
        "mean_accepted_per_chain": sum(accepted) / len(accepted),
        "chain_length": steps,
        "chains": len(accepted),
        "chance_top1": 1 / drafter.draft_vocab_size,
    }


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    seed = spec.get("seed", 0)
    seed_everything(seed)
    target, tokenizer = load_target(inputs["target"], dtype="float32", key="models.toy.target")
    target.requires_grad_(False)
    train, heldout = split(inputs["questions"], spec.get("heldout", 12), seed)
    text = torch.cat(chat_ids(tokenizer, train))
    counts = torch.bincount(text, minlength=target.config.vocab_size)
    draft_vocab_size = min(spec.get("draft_vocab_size", 2048), target.config.vocab_size)
    draft_tokens = counts.topk(draft_vocab_size).indices.sort().values  # [Vd]
    drafter = new_drafter(spec, target, draft_tokens, verifier=str(inputs["target"])).train()
    log.info("draft vocabulary covers %.1f%% of training tokens", 100 * counts[draft_tokens].sum() / counts.sum())
    stream = self_distillation(target.eval(), tokenizer, train, spec)
    log.info("self-distillation: %d tokens of training prompts and the target's greedy continuations", len(stream))

    steps, lr = spec.get("ttt_steps", 3), spec.get("lr", 2e-3)
    seq_len, batch_size = spec.get("seq_len", 512), spec.get("batch_size", 4)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)

    def step(i: int, progress: float) -> dict:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(lr, progress)
        ids = windows(stream, batch_size, seq_len, gen)  # [B, T]
        aux, teacher_logits, top = teacher(target, drafter, ids)
        loss, stats = 0.0, {}
        for k, logits in enumerate(ttt_forward(drafter, ids, drafter.fuse(aux), steps)):
            m = seq_len - 1 - k  # chains whose step-k label lies inside the window
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

    stats = train_loop(step, spec.get("train_seconds", 80), spec.get("max_steps", 2000), "toy drafter")
    drafter.eval()
    stats |= acceptance(target, tokenizer, drafter, heldout, spec)
    log.info("acceptance: %s", stats)
    with atomic_path(outputs["drafter"], directory=True) as tmp:
        drafter.save_pretrained(tmp)
        write_json(stats, tmp / "acceptance.json")


main = stage_main(run)

if __name__ == "__main__":
    main()
