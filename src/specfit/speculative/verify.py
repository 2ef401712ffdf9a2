"""The target side of a cycle: the target's causal and tree-masked forwards over its KV cache, the route query, and
greedy acceptance. The operations of a request (prefill, verify, commit) are `specfit.speculative.request.Session`'s,
which runs them on this `Target`.

The target verifies the root s plus the selected subtree S in one forward (paper Section 2): query row 0 is the
root, rows 1.. the selected nodes in id order (parents first). Greedy acceptance takes the longest
root-to-node path whose tokens match the target's argmax; the KV rows of the rejected nodes are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from specfit.models.eagle3 import aux_hidden_states
from specfit.models.verify_mode import verify_mode
from specfit.selection.pool import CandidatePool
from specfit.speculative.exact import exact_tree_forward
from specfit.speculative.tree import tree_mask, tree_positions


@dataclass
class Verdict:
    """What verification decided: the accepted node ids, the target's next token, and features to commit."""

    accepted: list[int]  # node ids of the accepted path, root excluded
    next_root: int  # the target's argmax after the accepted path
    aux: torch.Tensor | None  # [1, 1+len(accepted), 3H] target aux states of root + accepted path
    past_len: int  # committed positions before the verified rows
    kept: list[int]  # verified rows on the committed path: the root (0) and the accepted nodes' rows


class Target:
    """The target model of one request and its forwards: its KV cache holds exactly the committed prefix between
    cycles (`Session` prefills, verifies and commits through it)."""

    def __init__(self, model, engine=None, aux_layer_ids: tuple[int, ...] | None = None):
        self.model = model
        self.engine = engine
        self.aux_layer_ids = aux_layer_ids  # None: no drafter reads target features
        self.cache = DynamicCache()

    @property
    def prefix_len(self) -> int:
        return self.cache.get_seq_length()

    def run(self, tokens: list[int], parent: list[int] | None = None, depth: list[int] | None = None,
            output_hidden_states: bool = False, exact: bool = True, last: bool = False):
        """The model output for new rows ``tokens``: causal when ``parent`` is None, else a tree query, whose rows
        are computed as AR's one-row steps (`specfit.speculative.exact`) unless ``exact`` is False or the model's
        verify is "batched". ``last``: a causal forward's logits for its last row only (transformers'
        ``logits_to_keep=1``, as its generate prefills): a prompt's next token is all a prefill reads of them."""
        if parent is not None and exact and verify_mode(self.model) == "exact":
            return exact_tree_forward(self.model, self.cache, tokens, parent, depth, self.engine, output_hidden_states)
        device = self.model.device
        past = self.prefix_len
        mask = positions = None
        if parent is not None:
            mask = tree_mask(parent, past, self.model.dtype, device)  # [1, 1, q, past+q]
            positions = tree_positions(depth, past, device)  # [1, q]
        input_ids = torch.tensor([tokens], device=device)  # [1, q]
        keep = {"logits_to_keep": 1} if last and parent is None else {}
        return self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True,
            output_hidden_states=output_hidden_states, **keep,
        )

    def forward(self, tokens: list[int], parent: list[int] | None = None, depth: list[int] | None = None,
                last: bool = False):
        """Logits [q, V] of the new rows (``last``: [1, V], the last row's, see `run`) and their aux states
        [1, q, 3H] (None without a drafter)."""
        if self.aux_layer_ids is None:
            return self.run(tokens, parent, depth, last=last).logits[0], None
        out = self.run(tokens, parent, depth, output_hidden_states=True, last=last)
        return out.logits[0], aux_hidden_states(out.hidden_states, self.aux_layer_ids)

    def routes(self, pool: CandidatePool) -> torch.Tensor:
        """[n+1, L, k] experts the target routes root + every pool node to, in one tree forward.

        The forward commits nothing: its KV rows are dropped again, so it is one batched tree forward even where
        the verify is exact (a pool holds several times a verify's rows); a route it gives can differ from the
        verify's only where a router's top-k is tied within rounding. Routes come from the offload engine's
        recorder, or from the routers' logits when there is no engine (unit tests).
        """
        tokens = pool.token
        if self.engine is not None:
            with self.engine.record_routes() as recorder:
                self.run(tokens, pool.parent, pool.level, exact=False)
            routes = recorder.routes  # [n+1, L, k]
        else:
            routes = self._router_choices(tokens, pool)  # [n+1, L, k]
        self.cache.crop(-len(tokens))
        return routes.cpu()

    def _router_choices(self, tokens: list[int], pool: CandidatePool) -> torch.Tensor:
        """[q, L, k] expert ids the routers (``mlp.gate``, returning ``(logits, scores, indices)``) pick."""
        picked = []  # layer by layer: [q, k]
        gates = [m for name, m in self.model.named_modules() if name.endswith("mlp.gate")]
        hooks = [g.register_forward_hook(lambda _m, _in, out: picked.append(out[-1])) for g in gates]
        try:
            self.run(tokens, pool.parent, pool.level, exact=False)
        finally:
            for hook in hooks:
                hook.remove()
        return torch.stack(picked, dim=1)


def greedy_path(pool: CandidatePool, rows: tuple[int, ...], predicted: list[int]) -> list[int]:
    """The longest root-to-node path of ``rows`` whose every token is the target's argmax at its parent."""
    row_of = {v: i for i, v in enumerate(rows)}
    path, node = [], 0
    while True:
        child = next(
            (v for v in rows[1:] if pool.parent[v] == node and pool.token[v] == predicted[row_of[node]]), None
        )
        if child is None:
            return path
        path.append(child)
        node = child
