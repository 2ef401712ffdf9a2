"""Drafting the EAGLE-3 candidate pool level by level (paper Section 2 and Section 3.1).

Level 1 holds the top-2 children of the root s; at each next level the 2 nodes of the previous level with the
highest path_prob each get their top-2 children, up to depth 5 (at most 18 nodes). Node ids put parents
before descendants and are assigned level by level, so the nodes of V<=d are a prefix of V.

The drafter's KV cache always holds one row per committed target position between cycles: drafter row ``t``
reads ``(embed(x_{t+1}), h_t)``. A cycle appends one row per expanded node; ``sync`` crops them away again
and appends the rows of the newly committed tokens, with the target's hidden states from verification.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specfit.models.eagle3 import Eagle3Drafter, causal_mask
from specfit.selection.pool import CandidatePool
from specfit.speculative.tree import additive_mask, crop


@dataclass
class DraftState:
    """The drafter's state for one request: its KV cache and what the next cycle's level 1 starts from."""

    cache: DynamicCache
    committed: int = 0  # drafter rows that belong to committed positions (= the target's prefix_len)
    logits: torch.Tensor | None = None  # [Vd] drafter logits at the root's row: level 1
    feature: dict[int, torch.Tensor] = field(default_factory=dict)  # node -> [H] hidden its drafter row reads
    root_input: torch.Tensor | None = None  # [H] hidden the root's own drafter row read (the fused target feature)
    row: dict[int, int] = field(default_factory=dict)  # expanded node -> its row in the drafter cache
    # committed tokens the drafter has not read yet and their target aux states, one [1, T_i, 3H] chunk per cycle
    # (concatenated once, when the drafter catches up)
    pending: tuple[list[int], list[torch.Tensor]] | None = None


def new_draft_state() -> DraftState:
    return DraftState(cache=DynamicCache())


def sync(drafter: Eagle3Drafter, state: DraftState) -> None:
    """Append drafter rows for the pending committed tokens; the last row's output seeds level 1.

    ``pending`` holds tokens ``x_{t+1}`` and the target's aux states of ``x_t`` for the new rows ``t``; rows of
    the last cycle's draft nodes are cropped first, so the cache matches the committed prefix again.
    """
    tokens, chunks = state.pending
    aux = chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=1)  # [1, T, 3H]
    crop(state.cache, state.committed)
    T = len(tokens)
    device = aux.device
    input_ids = torch.tensor([tokens], device=device)  # [1, T]
    positions = torch.arange(state.committed, state.committed + T, device=device)[None]  # [1, T]
    hidden = drafter.fuse(aux)  # [1, T, H]
    mask = causal_mask(T, state.committed, hidden.dtype, device)  # [1, 1, T, P+T]
    logits, hidden_out = drafter(input_ids, hidden, positions, past_key_values=state.cache, attention_mask=mask)
    state.committed += T
    state.logits = logits[0, -1]  # [Vd]
    state.feature = {0: hidden_out[0, -1]}  # children of the root read the root row's output
    state.root_input = hidden[0, -1]
    state.row = {}
    state.pending = None


def expand(drafter: Eagle3Drafter, pool: CandidatePool, parents: list[int], logits: torch.Tensor,
           hidden_out: torch.Tensor, top_k: int, state: DraftState, choose=None) -> None:
    """Add the top-k children of each parent. ``logits`` [len(parents), Vd], ``hidden_out`` [len(parents), H].
    ``choose(logits, depth)``: the children's commit probabilities and draft ids [P, k] under sampling
    (`specfit.speculative.sampler.Noise.draft`, `Noise.proposals`); None: the drafter's top-k (greedy)."""
    if choose is None:
        probs = torch.softmax(logits.float(), dim=-1)  # [P, Vd]
        top_prob, top_ids = probs.topk(top_k, dim=-1)  # [P, k]
    else:
        top_prob, top_ids = choose(logits, pool.depth)  # [P, k] each
    tokens = drafter.to_target_ids(top_ids).tolist()
    top_prob = top_prob.double().tolist()
    for i, parent in enumerate(parents):
        for token, prob in zip(tokens[i], top_prob[i]):
            state.feature[pool.add(parent, token, prob)] = hidden_out[i]


def frontier(pool: CandidatePool, width: int) -> list[int]:
    """The ``width`` deepest-level nodes with the highest path_prob (ties to the smaller id), in id order."""
    last = [v for v in range(1, pool.n + 1) if pool.level[v] == pool.depth]
    return sorted(sorted(last, key=lambda v: (-pool.path_prob[v], v))[:width])


def draft_level(drafter: Eagle3Drafter, state: DraftState, pool: CandidatePool, top_k: int = 2, choose=None) -> None:
    """Draft the next level of ``pool`` in place: level 1 from the root's row, deeper ones by one drafter step
    (``choose``: see `expand`)."""
    if pool.n == 0:
        expand(drafter, pool, [0], state.logits[None], state.feature[0][None], top_k, state, choose)
        return
    parents = frontier(pool, top_k)
    F = len(parents)
    past = state.cache.get_seq_length()
    device = state.logits.device
    # a parent's row sees the committed rows, the rows of its expanded ancestors and itself
    visible = torch.zeros(F, past + F, dtype=torch.bool)  # [F, P+F]
    visible[:, : state.committed] = True
    for i, v in enumerate(parents):
        u = pool.parent[v]
        while u > 0:
            visible[i, state.row[u]] = True
            u = pool.parent[u]
        visible[i, past + i] = True
        state.row[v] = past + i
    input_ids = torch.tensor([[pool.token[v] for v in parents]], device=device)  # [1, F]
    hidden = torch.stack([state.feature[v] for v in parents])[None]  # [1, F, H]
    # the row of a level-d node pairs it with the position before it: committed - 1 + d
    positions = torch.full((1, F), state.committed - 1 + pool.depth, device=device)  # [1, F]
    mask = additive_mask(visible, hidden.dtype, device)  # [1, 1, F, P+F]
    logits, hidden_out = drafter(input_ids, hidden, positions, past_key_values=state.cache, attention_mask=mask)
    expand(drafter, pool, parents, logits[0], hidden_out[0], top_k, state, choose)
