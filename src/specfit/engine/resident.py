"""A resident device: every expert in memory (Apple silicon, one large GPU), its batch-1 costs defined by measured
verify widths instead of the paper's tables.

A device entry's ``resident`` mapping gives the verify forward's measured cost ``ms`` at each width ``widths`` (tokens
verified in one forward) on a real MoE (``moe_layers`` x ``experts`` per layer, ``experts_per_token`` routed per
token), how the stack gathers experts (``gather``) and the drafter's cost per drafted level as a share of a width-1
step (``draft_share``: an assumption where no drafter was measured on that machine). :func:`fit` least-squares
(nonnegative, ``scipy.optimize.nnls``)

    cost(w) = a + b * [w > 1] + c * R(w)

a fixed part for the single-token path (``a``), a fixed part a wider verify adds (``b``: as when a batch leaves a
single-token kernel), and a per-expert read (``c``), over R(w), the expected experts read over the model's MoE
layers: ``pair`` (an unbatched gather, per (token, expert) pair) L*k*w; ``distinct`` (a batched gather, per distinct
expert of a layer) L*N*(1 - (1 - k/N)^w), the expectation under uniform routing.

:class:`ResidentModel` prices the toy's forwards on the engine's own plan on the virtual clock
(`specfit.engine.device.Timeline`): one toy expert read stands for (L*k of the real model) / (the toy's MoE layers *
top-k) real reads, as `specfit.engine.device.scaled` scales the paper's per-expert costs; reads are counted on the
toy's real routes (pair: tokens * top_k per layer; distinct: the layer's union). No expert is ever copied (copy_ms 0),
and a drafted level costs ``draft_share * (a + c * L*k)``. Torch-free. docs/devices.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from specfit.errors import SpecFitError

GATHERS = ("pair", "distinct")


@dataclass(frozen=True)
class ResidentFit:
    """A resident device's measured widths and its fit ``cost(w) = a + b*[w > 1] + c*R(w)`` (ms)."""

    name: str
    gather: str
    widths: tuple[int, ...]
    ms: tuple[float, ...]
    moe_layers: int
    experts: int
    experts_per_token: int
    draft_share: float
    a: float
    b: float
    c: float

    def reads(self, w) -> np.ndarray:
        """R(w): the expected experts read over the real model's MoE layers by a verify of width ``w``."""
        return reads(self.gather, np.asarray(w, dtype=float), self.moe_layers, self.experts, self.experts_per_token)

    def predicted(self, w) -> np.ndarray:
        w = np.asarray(w, dtype=float)
        return self.a + self.b * (w > 1) + self.c * self.reads(w)

    def errors(self) -> np.ndarray:
        """Predicted over measured, minus 1, at each measured width."""
        return self.predicted(self.widths) / np.asarray(self.ms) - 1

    @property
    def step_ms(self) -> float:
        """The width-1 step the drafter's share is of: a + c * L*k."""
        return self.a + self.c * self.moe_layers * self.experts_per_token

    @property
    def draft_ms(self) -> float:
        return self.draft_share * self.step_ms

    def for_toy(self, moe_layers: int, top_k: int) -> ResidentModel:
        """The toy's costs: one toy expert read stands for (L*k real reads) / (``moe_layers`` * ``top_k``)."""
        per_read = self.c * self.moe_layers * self.experts_per_token / (moe_layers * top_k)
        return ResidentModel(self.name, self.gather, self.a, self.b, per_read, top_k, self.draft_ms)


def reads(gather: str, w: np.ndarray, layers: int, experts: int, k: int) -> np.ndarray:
    if gather == "pair":
        return layers * k * w
    if gather == "distinct":
        return layers * experts * (1 - (1 - k / experts) ** w)
    raise SpecFitError(f"gather must be one of {', '.join(GATHERS)}, got {gather!r}")


def check(spec: dict, key: str = "resident") -> list[str]:
    """What is wrong with a ``resident`` mapping, each problem naming its key (empty: nothing)."""
    problems = []
    widths, ms = spec.get("widths"), spec.get("ms")
    if not isinstance(widths, list) or not isinstance(ms, list):
        return [f"config key '{key}': widths and ms must be lists of the same length"]
    if len(widths) != len(ms):
        problems.append(f"config key '{key}.ms' has {len(ms)} costs for {len(widths)} widths: one cost per width")
    if len(widths) < 3:
        problems.append(f"config key '{key}.widths' has {len(widths)} widths: the fit has three parts (a, b, c), "
                        "measure at least three widths (1, 2 and a wider one)")
    if any(w2 <= w1 for w1, w2 in zip(widths, widths[1:])):
        problems.append(f"config key '{key}.widths' must be strictly increasing, got {widths}")
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0 for v in ms):
        problems.append(f"config key '{key}.ms' must hold positive costs in ms, got {ms}")
    elif any(m2 < m1 for m1, m2 in zip(ms, ms[1:])):
        problems.append(f"config key '{key}.ms' falls as the width grows ({ms}): a wider verify reads at least "
                        "the experts of a narrower one; check the measurement")
    if widths and widths[0] != 1:
        problems.append(f"config key '{key}.widths' must start at 1 (the single-token path), got {widths[0]}")
    experts, k = spec.get("experts"), spec.get("experts_per_token")
    if isinstance(experts, int) and isinstance(k, int) and k > experts:
        problems.append(f"config key '{key}.experts_per_token' is {k}, above the {experts} experts per layer")
    return problems


def fit(spec: dict, key: str = "resident") -> ResidentFit:
    """The nonnegative least-squares fit of a ``resident`` mapping (refused, naming its key, if malformed)."""
    problems = check(spec, key)
    if problems:
        raise SpecFitError("invalid resident device:\n  " + "\n  ".join(problems))
    gather = spec.get("gather", "distinct")
    w, y = np.asarray(spec["widths"], dtype=float), np.asarray(spec["ms"], dtype=float)
    layers, experts, k = int(spec["moe_layers"]), int(spec["experts"]), int(spec["experts_per_token"])
    X = np.column_stack([np.ones_like(w), (w > 1).astype(float), reads(gather, w, layers, experts, k)])
    (a, b, c), _ = nnls(X, y)
    return ResidentFit(str(spec.get("name", "resident device")), gather, tuple(int(v) for v in spec["widths"]),
                       tuple(float(v) for v in spec["ms"]), layers, experts, k, float(spec["draft_share"]),
                       float(a), float(b), float(c))


@dataclass(frozen=True)
class ResidentModel:
    """The toy's forwards on a resident device (the interface `specfit.engine.device.Timeline` prices with): a target
    forward over T tokens costs ``a + b*[T > 1] + read_ms * reads``, reads counted on the plan's routes; no copies."""

    name: str
    gather: str
    a: float
    b: float
    read_ms: float  # one toy expert read
    top_k: int  # the toy's experts per token (pair mode: each token reads its own)
    draft_ms: float
    copy_ms: float = 0.0  # every expert is resident: nothing is ever copied

    @property
    def label(self) -> str:
        return f"emulated {self.name} (resident, {self.gather} gather), virtual clock"

    @property
    def expert_ms(self) -> float:
        return self.read_ms

    def fixed(self, tokens: int) -> float:
        return self.a + (self.b if tokens > 1 else 0.0)

    def reads(self, steps: list, tokens: int) -> int:
        """Expert reads of one layer forward: pair, ``tokens * top_k``; distinct, the union the plan computes."""
        if self.gather == "pair":
            return tokens * self.top_k
        return sum(len(step[1]) for step in steps if step[0] == "compute")

    def compute_ms(self, steps: list, tokens: int) -> float:
        return self.read_ms * self.reads(steps, tokens)

    def layer_ms(self, steps: list, link_free: float, now: float, landing: dict | None = None,
                 tokens: int = 1) -> tuple[float, float]:
        """One layer: its reads, nothing waits (every expert is resident, the link stays idle)."""
        return now + self.compute_ms(steps, tokens), link_free
