"""The noise and the rules of sampled decoding (`specfit.speculative.sampling` says what each mode promises): Gumbel
noise per (seed, request, output position) drawn on the CPU by a seeded generator, the top-k / top-p warp, the
Gumbel-max sample, the drafter's coupled proposals and EAGLE's rejection verification of a tree."""

from __future__ import annotations

import hashlib
import math
import os
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from specfit.speculative.sampling import Sampling


def _stream_seed(seed: int, key: int, position: int, salt: str) -> int:
    """A 63-bit generator seed from (seed, request, position): the same on every machine."""
    digest = hashlib.blake2b(f"{seed}:{key}:{position}:{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def gumbel(seed: int, key: int, position: int, vocab: int) -> torch.Tensor:
    """[V] float32 Gumbel noise of output position ``position`` of request ``key``, drawn on the CPU."""
    g = torch.Generator().manual_seed(_stream_seed(seed, key, position, "gumbel"))
    u = torch.rand(vocab, generator=g, dtype=torch.float32).clamp_(min=torch.finfo(torch.float32).tiny)
    return u.log_().neg_().log_().neg_()  # -log(-log(u)), in place


def uniforms(seed: int, key: int, position: int, n: int) -> list[float]:
    """``n`` uniforms in [0, 1) of position ``position`` (rejection sampling's accept tests)."""
    g = torch.Generator().manual_seed(_stream_seed(seed, key, position, "accept"))
    return torch.rand(n, generator=g, dtype=torch.float64).tolist()


def warp(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """[..., V] tempered logits (float32), -inf outside the top-k and top-p sets. A token tied with the last one a
    set keeps is kept too, so the sets do not depend on how a sort orders ties."""
    scores = logits.float() / s.temperature
    if s.top_k and s.top_k < scores.shape[-1]:
        kth = scores.topk(s.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if s.top_p < 1:
        probs = scores.softmax(-1)  # [..., V]
        scores = scores.masked_fill(probs < nucleus_floor(probs, s.top_p), -math.inf)
    return scores


def nucleus_floor(probs: torch.Tensor, top_p: float, first: int = 64) -> torch.Tensor:
    """[..., 1] the least probability the nucleus keeps: in descending order, a token is kept while the mass before
    it is below ``top_p``. Read from the ``first`` most likely tokens, four times as many while a row keeps them all,
    instead of sorting the whole vocabulary (12 ms a row at 151,936 tokens on a CPU core, a top-64 0.1 ms)."""
    V = probs.shape[-1]
    k = min(first, V)
    while True:
        top = probs.topk(k, dim=-1).values  # [..., k] descending
        kept = ((top.cumsum(-1) - top) < top_p).sum(-1, keepdim=True)  # [..., 1] >= 1: a prefix of the k
        if k == V or bool((kept < k).all()):
            return top.gather(-1, kept - 1)
        k = min(4 * k, V)


_worker: ThreadPoolExecutor | None = None  # draws noise ahead (`Noise.ahead`); made on first use


def _ahead_worker() -> ThreadPoolExecutor:
    global _worker
    if _worker is None:
        _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specfit-noise")
    return _worker


def _forget_worker() -> None:
    """A forked child (the stage server's jobs) has none of its parent's threads: it makes its own worker."""
    global _worker
    _worker = None


os.register_at_fork(after_in_child=_forget_worker)


def next_positions(n: int, depth: int, room: int | None = None) -> range:
    """The output positions the next cycle can reach after a cycle at output length ``n`` that drafts at most
    ``depth`` levels: it commits up to depth + 1 tokens, then drafts and verifies up to depth past them (none past
    ``room``, the tokens still allowed)."""
    reach = 2 * depth + 1
    return range(n + 1, n + 1 + (reach if room is None else min(reach, room)))


class Noise:
    """One request's noise, position by position (kept while the cycle that reads it may ask again).

    A position's noise is a function of (seed, request, position) alone, so it can be drawn before it is read:
    `ahead` hands positions the next cycle may reach to a worker thread while the device verifies (the host waits on
    the verify anyway), and `gumbel` takes a drawn position's noise from it, waiting only for what is not drawn yet.
    The numbers are the same either way."""

    def __init__(self, sampling: Sampling, key: int, vocab: int):
        self.sampling, self.key, self.vocab = sampling, key, vocab
        self._gumbel: dict[int, torch.Tensor] = {}
        self._drawing: dict[int, Future] = {}  # positions the worker draws

    def gumbel(self, position: int) -> torch.Tensor:
        """[V] the position's Gumbel noise."""
        if position not in self._gumbel:
            for old in [p for p in self._gumbel if p < position - 16]:
                del self._gumbel[old]
            drawing = self._drawing.pop(position, None)
            self._gumbel[position] = (drawing.result() if drawing is not None
                                      else gumbel(self.sampling.seed, self.key, position, self.vocab))
        return self._gumbel[position]

    def ahead(self, positions) -> None:
        """Draw ``positions``' noise in the worker thread, those not drawn or drawing yet."""
        for p in positions:
            if p not in self._gumbel and p not in self._drawing:
                self._drawing[p] = _ahead_worker().submit(gumbel, self.sampling.seed, self.key, p, self.vocab)

    def sample(self, logits: torch.Tensor, positions: list[int]) -> list[int]:
        """The target's token after each row of ``logits`` [q, V] (AR's step at each row's output position)."""
        scores = warp(logits, self.sampling)  # [q, V], a new tensor: noised in place, row by row
        for row, p in zip(scores, positions):
            row.add_(self.gumbel(p).to(scores.device))
        return scores.argmax(-1).tolist()

    def sample_from(self, probs: torch.Tensor, position: int) -> int:
        """A token from distribution ``probs`` [V] by the position's Gumbel-max rule."""
        return int((probs.double().log() + self.gumbel(position).to(probs.device).double()).argmax())

    def draft(self, logits: torch.Tensor, position: int, target_ids: torch.Tensor, k: int):
        """The drafter's top-``k`` children by the same rule: ``logits`` [P, Vd] over the draft vocabulary,
        ``target_ids`` [Vd] its target ids. Returns their commit probabilities [P, k] and draft ids [P, k].

        A child is committed when the target's Gumbel-max at this position, with the same noise, picks its token.
        The drafter's estimate of that: if the target's warped scores were the drafter's plus an independent Gumbel
        (the drafter's uncertainty about them), the target would pick x with probability softmax(scores + g)[x], the
        drafter's noised distribution, near 1 where the noise makes x a clear winner and far above the tempered
        q(x) for a token the noise favours. The online calibration learns the rest."""
        scores = warp(logits, self.sampling)  # [P, Vd]
        noised = scores + self.gumbel(position).to(scores.device)[target_ids]  # [P, Vd]
        top = noised.topk(k, dim=-1)  # [P, k]
        return (top.values - noised.logsumexp(-1, keepdim=True)).exp(), top.indices

    def proposals(self, logits: torch.Tensor, k: int):
        """Rejection sampling's children: the drafter's top-``k`` (the proposals are point masses at them) with
        their commit probabilities [P, k]. A drafted child x is accepted with probability p(x) whatever its rank
        (the first with p(x); a later sibling once the earlier ones were rejected, (1 - p(x1)) p(x2) / (1 - p(x1)));
        the drafter's estimate of p(x) is its own warped, tempered q(x) (0 outside its top-k / top-p sets)."""
        ids = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1).indices  # [P, k] the best, as greedy drafts
        return warp(logits, self.sampling).softmax(-1).gather(-1, ids), ids


def rejection_path(children: dict[int, list[int]], token: list[int], probs: dict[int, torch.Tensor],
                   noise: Noise, first: int, depth: dict[int, int], residual: bool = True) -> tuple[list[int], int]:
    """EAGLE's tree verification at T > 0: from the root (node 0), the children of the current node (in id order,
    best draft first) are tried in turn against the target's distribution p there (``probs[node]`` [V], warped): a
    drafted child x is accepted with probability min(1, p(x)/q(x)), where q is the proposal; the drafts are the
    drafter's top-k, so q is a point mass at x and the test is u < p(x). On rejection p <- norm(max(p - q, 0)), i.e.
    p with x zeroed; when all are rejected the next token is drawn from that residual. Lossless in distribution.
    ``first``: the output position after the root; ``residual`` False is a known-wrong verifier (for the tests).
    Returns the accepted node ids (root excluded) and the next root."""
    path, node = [], 0
    while True:
        position = first + depth[node]
        p = probs[node].double()
        tried = children.get(node, [])
        u = uniforms(noise.sampling.seed, noise.key, position, len(tried))
        for child, ui in zip(tried, u):
            x = token[child]
            if ui < float(p[x]):
                path.append(child)
                node = child
                break
            if residual:
                p = p.clone()
                p[x] = 0
                p = p / p.sum()
        else:
            return path, noise.sample_from(p, position)
