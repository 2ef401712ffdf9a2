"""Learned routes: SpecFit's route source without an oracle (beyond the paper; trained by `specfit.stages.predictor`).

`RoutePredictor` is the paper's estimated predictor (Section 4.6: a linear head from a hidden state to every MoE
layer's router, 12.6M parameters at Qwen3-30B-A3B's size), fed with what the drafter holds for a node before
verification: the two inputs of the node's own EAGLE-3 drafter row, the hidden state it reads (the fused target
feature for the root, the drafter's output at the parent for a draft node) and its token's embedding::

    x_v = [feature_v ; embed(token_v)]              [2H]
    logits_v = W · (x_v - mean) / std + bias        [L, E] one router per MoE layer
    Ê_{l,v} = top-k of logits_v[l]

`LearnedRoutes` predicts inside the request timer (its time is selection time) from the cycle's drafter state
alone: it never reads the atlas or runs the target.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

from specfit.errors import SpecFitError
from specfit.selection.pool import CandidatePool
from specfit.speculative.cycle import Cycle

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
POOL_NODES = 19  # a full pool: the root and 18 draft nodes (depth 5, top-2 expansion)


class RoutePredictor(nn.Module):
    """One linear router per MoE layer over a node's drafter inputs: [N, 2H] -> logits [N, L, E]."""

    def __init__(self, hidden_size: int, num_layers: int, num_experts: int, top_k: int):
        super().__init__()
        self.hidden_size, self.num_layers, self.num_experts, self.top_k = hidden_size, num_layers, num_experts, top_k
        self.head = nn.Linear(2 * hidden_size, num_layers * num_experts)
        self.register_buffer("mean", torch.zeros(2 * hidden_size))  # input standardization, from the training data
        self.register_buffer("std", torch.ones(2 * hidden_size))

    @property
    def config(self) -> dict:
        return {"hidden_size": self.hidden_size, "num_layers": self.num_layers, "num_experts": self.num_experts,
                "top_k": self.top_k}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, 2H] -> router logits [N, L, E]."""
        x = (x.to(self.mean.dtype) - self.mean) / self.std
        return self.head(x).view(-1, self.num_layers, self.num_experts)

    @torch.no_grad()
    def routes(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, 2H] -> predicted experts [N, L, k] (int64)."""
        return self(x).topk(self.top_k, dim=-1).indices

    def save(self, path) -> None:
        path = Path(path)
        (path / CONFIG).write_text(json.dumps(self.config, indent=2, sort_keys=True) + "\n")
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, path / WEIGHTS)

    @classmethod
    def load(cls, path, device="cpu") -> RoutePredictor:
        path = Path(path)
        if not (path / CONFIG).exists() or not (path / WEIGHTS).exists():
            raise SpecFitError(f"{path} holds no route predictor ({CONFIG} and {WEIGHTS}): the predictor rule "
                               "writes one")
        predictor = cls(**json.loads((path / CONFIG).read_text()))
        predictor.load_state_dict(load_file(path / WEIGHTS))
        return predictor.to(device).eval()


@dataclass(frozen=True)
class FoldedHead:
    """A `RoutePredictor` as decode runs it (`LearnedRoutes`, timed by `pool_times`): the input standardization folded
    into the head, so that a prediction is one fused product where `RoutePredictor.forward` takes four operations;
    the same logits up to rounding."""

    weight_t: torch.Tensor  # [2H, L·E] (W / std)ᵀ
    bias: torch.Tensor  # [L·E] bias - (W / std)·mean
    num_layers: int
    num_experts: int
    top_k: int

    @classmethod
    @torch.no_grad()
    def of(cls, predictor: RoutePredictor) -> FoldedHead:
        weight = predictor.head.weight / predictor.std  # [L·E, 2H]
        return cls(weight.T.contiguous(), predictor.head.bias - weight @ predictor.mean, predictor.num_layers,
                   predictor.num_experts, predictor.top_k)

    @torch.no_grad()
    def routes(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, 2H] -> predicted experts [N, L, k] (int64)."""
        if x.dtype != self.weight_t.dtype:
            x = x.to(self.weight_t.dtype)
        logits = torch.addmm(self.bias, x, self.weight_t)  # [N, L·E]
        return logits.view(-1, self.num_layers, self.num_experts).topk(self.top_k).indices


def pool_times(predictor: RoutePredictor, device, dtype: torch.dtype = torch.float32, repeats: int = 200,
               warmup: int = 10) -> list[float]:
    """Seconds of each of ``repeats`` predictions of one full pool (`POOL_NODES` random inputs on ``device``,
    routes back on the host) as decode runs them (`FoldedHead`), after ``warmup`` untimed ones."""
    x = torch.randn(POOL_NODES, 2 * predictor.hidden_size, device=device, dtype=dtype)  # [19, 2H]
    head = FoldedHead.of(predictor)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times = []
    for i in range(warmup + repeats):
        sync()
        start = time.perf_counter()
        head.routes(x).cpu()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def node_inputs(drafter, state, pool: CandidatePool, nodes: range) -> torch.Tensor:
    """[len(nodes), 2H] the predictor's inputs: the hidden state each node's drafter row reads, its token's embedding.

    ``state`` is the cycle's `specfit.speculative.draft.DraftState` after drafting: ``root_input`` for the root,
    ``feature[v]`` for draft node v. Four operations on the drafter's device whatever the number of nodes (each is a
    kernel launch on a GPU, host work on the critical path).
    """
    feature = state.feature
    features = torch.stack([state.root_input if v == 0 else feature[v] for v in nodes])  # [N, H]
    tokens = torch.tensor(pool.token[nodes.start : nodes.stop], device=features.device)  # [N]
    embeds = F.embedding(tokens, drafter.embed_tokens.weight)  # [N, H], as drafter.embed_tokens(tokens)
    if embeds.dtype != features.dtype:
        embeds = embeds.to(features.dtype)
    return torch.cat([features, embeds], dim=-1)  # [N, 2H]


class LearnedRoutes:
    """Routes predicted from the cycle's drafter state (`RoutePredictor`, run as a `FoldedHead`), inside the request
    timer.

    Each node is predicted once per cycle, when the pool first holds it (the pool grows level by level). It reads
    the cycle's drafter and drafter state only: no atlas, no target query. ``seconds`` and ``nodes`` count its work.
    """

    full_pool = False

    def __init__(self, path):
        self.predictor = RoutePredictor.load(path)
        self._head = FoldedHead.of(self.predictor)  # on the predictor's device
        self.reset_counts()
        self._cycle: Cycle | None = None
        self._routes = self._buffer(0)  # [>= n+1, L, k] the nodes predicted this cycle, rows 0.._known-1
        self._known = 0

    def _buffer(self, rows: int) -> np.ndarray:
        return np.empty((rows, self.predictor.num_layers, self.predictor.top_k), dtype=np.int64)

    def routes(self, cycle: Cycle, pool: CandidatePool) -> np.ndarray:
        start = cycle.clock.wall()  # host work: wall time, on any clock
        if self._cycle is not cycle:  # a fresh buffer: the pools of the last cycle keep views of theirs
            self._cycle, self._routes, self._known = cycle, self._buffer(max(POOL_NODES, pool.n + 1)), 0
            self.cycles += 1
        end = pool.n + 1
        if end > self._known:
            x = node_inputs(cycle.drafter, cycle.draft, pool, range(self._known, end))  # [N, 2H]
            if self._head.bias.device != x.device:
                self._head = FoldedHead.of(self.predictor.to(x.device))
            if end > len(self._routes):
                grown = self._buffer(2 * end)
                grown[: self._known] = self._routes[: self._known]
                self._routes = grown
            self._routes[self._known : end] = self._head.routes(x).cpu().numpy()  # [N, L, k]
            self.nodes += end - self._known
            self._known = end
        self.seconds += cycle.clock.wall() - start
        return self._routes[:end]  # [n+1, L, k]; rows are only appended within a cycle

    def reset_counts(self) -> None:
        self.seconds, self.nodes, self.cycles = 0.0, 0, 0

    def stats(self) -> dict:
        return {"seconds": self.seconds, "nodes": self.nodes, "cycles": self.cycles}
