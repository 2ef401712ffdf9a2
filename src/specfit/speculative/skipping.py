"""specfit-ca's skipping (beyond the paper; option ``skip``): verify the root alone while drafting has not paid lately.

Before level 1, a cycle drafts only if speculation has paid lately: over the last `Skipping.HISTORY` drafted cycles,
the committed tokens per predicted ms, Σ(1 + accepted) / Σ(T̂(Ŝ) + D(levels)), must exceed the root-only throughput
the same cycles predicted, n / Σ T̂(∅). Otherwise the cycle verifies the root alone (the drafter catches up later in
one pass). After `Skipping.PROBE_EVERY` skipped cycles one drafts anyway (a probe), so the estimate follows the text;
a probe after which drafting still does not pay doubles the wait for the next (up to `Skipping.MAX_PROBE_EVERY`), one
after which it pays resets it. The first `Skipping.MIN_HISTORY` cycles always draft. Everything it reads is known
before verification (predicted times, accepted counts of earlier cycles): the output is AR's whatever it decides, and
the trajectory does not depend on the clock.
"""

from __future__ import annotations

from collections import deque


class Skipping:
    """The skipping rule of a SpecFit kind with a drafting cost (`specfit.speculative.methods.SpecFitCA`): it reads
    the method's ``option("skip")``, ``drafting`` (D(d)) and ``_read_resident``, and its ``decided`` calls `record`."""

    HISTORY = 16
    MIN_HISTORY = 4
    PROBE_EVERY = 8
    MAX_PROBE_EVERY = 64

    def reset(self):
        super().reset()
        self.history: deque[tuple[float, float, int, int]] = deque(maxlen=self.HISTORY)  # (T̂(∅), T̂(Ŝ), d, acc.)
        self.skipped = 0
        self.probe_every = self.PROBE_EVERY  # skipped cycles before the next probe
        self._probing = False
        self._last: tuple[float, float, int] | None = None  # (T̂(∅), T̂(Ŝ), levels) of the cycle being decided

    def record(self, root_only: float, verify: float, levels: int) -> None:
        """The decided cycle's predicted T̂ of the root alone and of its selection's verification, and its levels."""
        self._last = (root_only, verify, levels)

    def wants_draft(self, cycle):
        if not self.option("skip") or len(self.history) < self.MIN_HISTORY:
            return True
        if self.skipped >= self.probe_every:
            self.skipped, self._probing = 0, True
            return True
        if self.drafting_pays():
            return True
        self.skipped += 1
        with cycle.clock.excluded():  # for the record only (theory prices the root alone with it), off the timers
            self._read_resident(cycle)
        return False

    def drafting_pays(self) -> bool:
        """Whether the recent drafted cycles committed more tokens per predicted ms than root-only cycles would."""
        t_root = sum(h[0] for h in self.history)
        t_spec = sum(h[1] + self.drafting(h[2]) for h in self.history)
        committed = sum(1 + h[3] for h in self.history)
        return committed / t_spec > len(self.history) / t_root

    def committed(self, cycle, decision, accepted):
        if self._last is not None and decision.drafted_levels > 0:
            t_root, t_sel, levels = self._last
            self.history.append((t_root, t_sel, levels, accepted))
        self._last = None
        if self._probing:  # a probe that leaves drafting unpaid waits twice as long for the next one
            self._probing = False
            pays = self.drafting_pays()
            self.probe_every = self.PROBE_EVERY if pays else min(2 * self.probe_every, self.MAX_PROBE_EVERY)
