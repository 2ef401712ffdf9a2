"""The toy EAGLE-3 drafter in the speculators format: its layers, distillation and acceptance statistics (trained by the
toy_drafter stage)."""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass

import torch
from scipy.optimize import minimize_scalar
from transformers import DynamicCache, LlamaConfig

from specfit.models.eagle3 import Eagle3Drafter, aux_hidden_states
from specfit.models.speculators import default_aux_layer_ids, eagle3_config
from specfit.toy.train import (
    conversations,
    span_conversations,
)

log = logging.getLogger(__name__)


def toy_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3 taps a low, a middle and a high layer. Its default (2, L/2, L-3), made for 32-64 layer targets,
    gives (2, 2, 1) on a 4-layer toy: no high layer at all. The toy taps the inputs of layers 1, L/2 and L-1."""
    if num_layers >= 8:
        return default_aux_layer_ids(num_layers)
    return (1, num_layers // 2, num_layers - 1)


def new_drafter(spec: dict, target, draft_tokens: torch.Tensor, verifier: str) -> Eagle3Drafter:
    """A fresh drafter over ``draft_tokens`` ([Vd] sorted target ids) with the target's frozen embedding."""
    tc = target.config
    heads = spec["num_heads"]
    layer_config = LlamaConfig(
        hidden_size=tc.hidden_size,
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=spec["num_kv_heads"],
        head_dim=tc.hidden_size // heads,
        vocab_size=tc.vocab_size,
        rms_norm_eps=tc.rms_norm_eps,
        max_position_embeddings=tc.max_position_embeddings,
        rope_parameters=tc.rope_parameters,
    )
    aux = toy_aux_layer_ids(tc.num_hidden_layers)
    steps = spec["ttt_steps"]
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


def chat_questions(questions: list[dict], categories) -> list[dict]:
    """The drafter's own training questions: those of the Spec-Bench ``categories`` it trains on
    (``toy.drafter.categories``: chat, never the summarization articles, as the public EAGLE-3 drafters train on
    general chat; docs/toy.md)."""
    keep = set(categories)
    return [q for q in questions if q["category"] in keep]


def draft_vocabulary(replies: list[torch.Tensor], text: torch.Tensor, vocab_size: int, size: int) -> torch.Tensor:
    """[size] sorted target ids: the tokens the target generates most often in the drafter's training data
    (``replies``, its continuations), as EAGLE-3 builds its d2t map from its training responses; ties, and ids the
    replies never hold, by their count in the training ``text`` [N], then by id (stable, so the same data give the
    same vocabulary)."""
    by_text = torch.bincount(text, minlength=vocab_size).argsort(descending=True, stable=True)
    replied = torch.bincount(torch.cat(replies), minlength=vocab_size)
    order = by_text[replied[by_text].argsort(descending=True, stable=True)]
    return order[:size].sort().values


@torch.no_grad()
def self_distillation(target, tokenizer, questions: list[dict], spec: dict, seed: int
                      ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Training prompts, each followed by the target's own greedy continuation ([P + N] per prompt), and the
    continuations alone ([N] each).

    The drafter then learns the distribution it drafts along at decode time, as EAGLE trains on the target's
    generations rather than on human text. The prompts are the first turns of the training questions and of
    random-span conversations over their text (chat prompts: no "Summarize: " prefix), whole: the toy's replies
    copy the lead of the user turn, so a prompt cut on the left would hide what the target copies. Batched by
    length, 8 at a time.
    """
    n = spec["distill_prompts"]
    chats = conversations(questions) + span_conversations(questions, n, seed + 1, spec["span_max_words"],
                                                          summarize_share=0.0)
    prompts = [tokenizer.apply_chat_template(chat[:1], add_generation_prompt=True, tokenize=True)["input_ids"]
               for chat in random.Random(seed).sample(chats, min(n, len(chats)))]
    prompts = sorted((p for p in prompts if len(p) <= spec["distill_max_prompt"]), key=len)
    pieces, replies = [], []
    for i in range(0, len(prompts), 8):
        batch = tokenizer.pad({"input_ids": prompts[i : i + 8]}, return_tensors="pt")  # left-padded
        out = target.generate(**batch, max_new_tokens=spec["distill_new_tokens"], do_sample=False,
                              pad_token_id=tokenizer.pad_token_id)  # [b, P + N]
        width = batch["input_ids"].shape[1]
        for row, pads in zip(out, (batch["attention_mask"] == 0).sum(1).tolist()):
            eos = (row[width:] == tokenizer.eos_token_id).nonzero()
            end = width + int(eos[0]) + 1 if len(eos) else len(row)  # generate pads a finished sequence
            pieces.append(row[pads:end])
            replies.append(row[width:end])
    return pieces, replies


def piece_windows(pieces: list[torch.Tensor], seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """[1, T] the last ``seq_len`` tokens of a random piece: its continuation, with as much prompt as fits."""
    piece = pieces[int(torch.randint(0, len(pieces), (1,), generator=generator))]
    return piece[-seq_len:][None]


@torch.no_grad()
def acceptance(target, tokenizer, drafter, heldout: list[dict], spec: dict) -> tuple[dict, list[Drafted]]:
    """Top-1 agreement per draft step, and accepted tokens per chain, along the target's own greedy continuations
    of held-out prompts (what the drafter meets at decode time), up to the end-of-turn token. Also returns, for
    every chain step whose earlier steps all matched, what the drafter proposed there (its logits and the
    target's token): the states a tree node meets once its parent is accepted."""
    steps = spec["ttt_steps"]
    agree, n = torch.zeros(steps), torch.zeros(steps)
    accepted, drafted = [], []
    for q in heldout[: spec["acceptance_prompts"]]:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"][:, -2048:]
        seq = target.generate(
            prompt, max_new_tokens=spec["acceptance_new_tokens"], do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )  # [1, P + N] the target's own greedy output
        aux, _, _ = teacher(target, drafter, seq)
        logits = [step[0] for step in ttt_forward(drafter, seq, drafter.fuse(aux), steps)]  # steps x [T-1, Vd]
        chains = [drafter.to_target_ids(step.argmax(-1)) for step in logits]  # steps x [T-1] target ids
        P, T = prompt.shape[1], seq.shape[1]
        for t in range(P - 1, T - 2):  # the chain rooted at t drafts tokens t+2 .. t+steps+1 (t+1 is the root)
            hits = [bool(chains[k][t] == seq[0, t + k + 2]) for k in range(steps) if t + k + 2 < T]
            for k, hit in enumerate(hits):
                agree[k] += hit
                n[k] += 1
            for k in range(next((k + 1 for k, hit in enumerate(hits) if not hit), len(hits))):
                drafted.append(Drafted(logits[k][t], int(seq[0, t + k + 2])))  # steps up to the first miss
            if len(hits) == steps:
                accepted.append(next((k for k, hit in enumerate(hits) if not hit), steps))
    return {
        "top1_agreement": (agree[0] / n[0]).item(),
        "agreement_per_step": (agree / n).tolist(),
        "heldout_tokens": int(n[0]),
        "mean_accepted_per_chain": sum(accepted) / max(1, len(accepted)),
        "chain_length": steps,
        "chains": len(accepted),
        "chance_top1": 1 / drafter.draft_vocab_size,
    }, drafted


@dataclass(frozen=True)
class Drafted:
    """One draft step along a held-out greedy continuation: the drafter's logits and the target's own token."""

    logits: torch.Tensor  # [Vd]
    token: int  # the target's greedy token there (a target id; it may lie outside the draft vocabulary)


def calibrate_confidence(drafter: Eagle3Drafter, drafted: list[Drafted], width: int = 2) -> dict:
    """Scale the drafter's logits by one temperature so that its probabilities are what greedy verification accepts.

    A tree node's path probability p_v estimates its commit probability (paper Eq. 3); real EAGLE drafters are
    calibrated that way (EAGLE-2: a draft token's confidence approximates its acceptance rate). The toy's are not:
    it learns the toy target's full next-token distribution, which is flat (the target is a small model, held-out
    loss ~5 nats), while greedy verification accepts the target's argmax, which the drafter matches far more often
    than its probabilities say. The temperature is fitted on held-out continuations (never on evaluated questions)
    by the log loss of the event "this child is the target's token" over the ``width`` children a tree node
    expands (EAGLE-3's top-2), and folded into ``lm_head``: the drafter's argmax, ranking and checkpoint format are
    unchanged, only its probabilities sharpen or flatten.
    """
    logits = torch.stack([d.logits for d in drafted]).double()  # [N, Vd]
    top = logits.topk(width, dim=-1).indices  # [N, width] draft ids of the expanded children
    hits = (drafter.to_target_ids(top) == torch.tensor([d.token for d in drafted])[:, None]).double()  # [N, width]

    def log_loss(log_t: float) -> float:
        p = torch.softmax(logits / math.exp(log_t), dim=-1).gather(1, top).clamp(1e-12, 1 - 1e-12)  # [N, width]
        return float(-(hits * p.log() + (1 - hits) * (1 - p).log()).mean())

    fit = minimize_scalar(log_loss, bounds=(math.log(0.02), math.log(50.0)), method="bounded")
    temperature = math.exp(fit.x)
    with torch.no_grad():
        drafter.lm_head.weight.div_(temperature)
    p_before = torch.softmax(logits, dim=-1).gather(1, top)
    p_after = torch.softmax(logits / temperature, dim=-1).gather(1, top)
    return {
        "temperature": temperature,
        "calibration_steps": len(drafted),
        "top1_hit_rate": hits[:, 0].mean().item(),
        "top1_prob_before": p_before[:, 0].mean().item(),
        "top1_prob_after": p_after[:, 0].mean().item(),
        "top2_hit_rate": hits[:, 1].mean().item() if width > 1 else None,
        "top2_prob_before": p_before[:, 1].mean().item() if width > 1 else None,
        "top2_prob_after": p_after[:, 1].mean().item() if width > 1 else None,
    }
