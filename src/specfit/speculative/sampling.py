"""Sampling at temperature T > 0, kept exact: every output position t has its own noise, drawn from (seed, request,
t) only, on the CPU by a seeded generator, so the same numbers come on every machine and device.

Two modes (the workload's ``sampling`` key):

- ``coupled`` (the default at T > 0): the target's token at t is ``argmax(warp(logits) + g_t)``, with ``g_t`` the
  position's Gumbel noise and `warp` the tempered logits masked to the top-k / top-p set: an exact sampler of the
  target's distribution (the Gumbel-max rule). AR samples so; the verify accepts a drafted node exactly when its token
  is that argmax at its position, so every method commits AR's tokens at the seed, bit for bit, whatever it drafted.
  The drafter proposes its children by the same rule over its draft vocabulary (the noise of the target ids it
  drafts), so its proposals track the sample.
- ``rejection``: EAGLE's tree verification at T > 0 (`rejection_path`): siblings tried in turn against the target's
  distribution p, each rejection leaving the residual; lossless in distribution, not in tokens.

This module is torch-free (the workflow validates the config with it); the noise, the warp and the two verifies are
`specfit.speculative.sampler`'s. T = 0 is greedy: `Sampling.greedy`, and the callers take today's argmax path unchanged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from specfit.errors import SpecFitError

MODES = ("coupled", "rejection")
KEYS = ("temperature", "top_p", "top_k", "seed", "sampling")  # a workload's or call's sampling keys


@dataclass(frozen=True)
class Sampling:
    """How each output position's token is chosen; the defaults are greedy decoding."""

    temperature: float = 0.0  # T; 0: greedy (argmax)
    top_p: float = 1.0  # nucleus: the smallest set of most likely tokens holding top_p of the mass (1: all)
    top_k: int = 0  # only the k most likely tokens (0: all)
    seed: int = 0  # the noise's seed (with the request and the position)
    sampling: str = "coupled"  # at T > 0: "coupled" (AR's tokens at the seed) or "rejection" (AR's distribution)

    def __post_init__(self):
        t, p, k, seed = self.temperature, self.top_p, self.top_k, self.seed
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise SpecFitError(f"temperature must be a finite number >= 0, got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise SpecFitError(f"top_p must be in (0, 1], got {p!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise SpecFitError(f"top_k must be an integer >= 0 (0: no top-k cut), got {k!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SpecFitError(f"seed must be an integer, got {seed!r}")
        if self.sampling not in MODES:
            raise SpecFitError(f"sampling {self.sampling!r} is not one of {', '.join(MODES)}")
        if self.sampling == "rejection" and t == 0:
            raise SpecFitError("sampling 'rejection' needs temperature > 0 (at 0 the decode is greedy)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def coupled(self) -> bool:
        return not self.greedy and self.sampling == "coupled"

    @property
    def rejection(self) -> bool:
        return not self.greedy and self.sampling == "rejection"

    @property
    def guarantee(self) -> str:
        """What every method's output keeps of AR's: its "tokens" (greedy, coupled) or only its "distribution"."""
        return "distribution" if self.rejection else "tokens"

    def record(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, entry: dict | None) -> Sampling:
        """From a workload entry or call's keys (others ignored)."""
        return cls(**{k: entry[k] for k in KEYS if entry and entry.get(k) is not None})


GREEDY = Sampling()
TWIN_KEYS = ("question_ids", "limit_tokens", "max_new_tokens", "max_requests")  # what a workload's twins share


def twin(workloads: dict, workload: str, temperature: float, mode: str) -> str | None:
    """The workload with ``workload``'s questions and limits sampled at ``temperature`` under ``mode`` (greedy at 0):
    a sampled workload's greedy twin, or its twin under the other mode; None when the config has none."""
    entry = workloads[workload]
    for name, other in workloads.items():
        s = Sampling.of(other)
        if (name != workload and all(other.get(k) == entry.get(k) for k in TWIN_KEYS) and s.temperature == temperature
                and (temperature == 0 or s.sampling == mode)):
            return name
    return None

