"""Commit probabilities calibrated online from verification outcomes (beyond the paper).

SpecFit's reward reads a node's path probability p_v as its chance to be committed (Eq. 3). A drafter's confidence
overstates or understates that chance, and differently at each depth (the toy's drafter: 0.80 predicted against 0.62
accepted at level 1 on summarization). `OnlineCalibration` corrects it as decoding goes, from nothing but outcomes
the decode has already seen: after each verification, every verified node whose parent was committed (the root is)
is one trial of "the target takes this token", a success when it is on the accepted path. Trials are counted per
draft level and per bin of the node's conditional probability q_v = p_v / p_parent(v); a node's calibrated
conditional is its bin's acceptance shrunk toward its own q_v by ``prior`` pseudo-trials,

    q̃_v = (accepted_bin + prior · q_v) / (trials_bin + prior),

and its calibrated path probability is the product of the q̃ on its path, so p̃ still never exceeds its parent's and
the selection stays ancestor-closed. With no trials it is the drafter's own p_v. What each level's best child adds on
average (`chain_rate`) is what the look-ahead stopping rule (`specfit.speculative.methods.SpecFit.draft_on`) expects
of levels not drafted yet.

Everything it reads is known before the next selection: the output stays AR's whatever it learns.
"""

from __future__ import annotations

import bisect

import numpy as np

# bin edges of the conditional probability q_v: finer where a drafter's confidence says most
EDGES = np.array([0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
EDGES_LIST = EDGES.tolist()  # for the scalar path (`OnlineCalibration.path_probs`)


def conditional(path_prob, u: int, v: int) -> tuple[float, int]:
    """q_v = p_v / p_u of node v under its parent u (0 under a parent of probability 0), clipped to [0, 1], and its
    bin in `EDGES`."""
    up = path_prob[u]
    q = min(max(path_prob[v] / up, 0.0), 1.0) if up > 0 else 0.0
    return q, bisect.bisect_right(EDGES_LIST, q) - 1


class OnlineCalibration:
    """Per-(level, q-bin) acceptance counts of verified nodes, and the calibrated path probabilities they give."""

    COUNTS = ("accepted", "trials", "best_accepted", "best_trials", "best_q")  # what it has learned

    def __init__(self, max_depth: int, prior: float = 4.0, start: dict[str, np.ndarray] | None = None):
        """``start``: counts to begin with and to return to on `reset` (`counts` of another calibration of the
        same ``max_depth``); none: no trial."""
        self.max_depth, self.prior = max_depth, float(prior)
        shapes = {"accepted": (max_depth + 1, len(EDGES)), "trials": (max_depth + 1, len(EDGES))}  # [level, bin]
        self.start = {k: np.zeros(shapes.get(k, max_depth + 1)) for k in self.COUNTS}
        for k, v in (start or {}).items():
            if k not in self.start or np.shape(v) != self.start[k].shape:
                raise ValueError(f"calibration start: {k} of shape {np.shape(v)} does not fit max_depth {max_depth}")
            self.start[k] = np.array(v, dtype=np.float64)
        self.reset()

    def reset(self) -> None:
        """Back to the start's counts (none by default). Level 0 of the [level, bin] counts is unused; ``best_*``
        count per level the best verified child of a committed parent (``best_q``: the sum of their own q)."""
        for k, v in self.start.items():
            setattr(self, k, v.copy())

    def counts(self) -> dict[str, np.ndarray]:
        """What it has learned so far: a ``start`` for another calibration."""
        return {k: getattr(self, k).copy() for k in self.COUNTS}

    def path_probs(self, parent, path_prob, level, known: list[float] | None = None) -> list[float]:
        """[n+1] the calibrated p̃_v of a pool (parents before children), p̃ of the root 1.

        ``known``: p̃ of the pool's first nodes, from a call before this one in the same cycle (the counts change only
        between cycles, in `observe`): extended in place with the nodes drafted since, and returned. Scalar float64
        arithmetic, the same operations in the same order for every node, so a pool's p̃ does not depend on how
        many levels it was extended by.
        """
        out = [1.0] if not known else known
        prior = self.prior
        for v in range(len(out), len(path_prob)):
            u = parent[v]
            q, b = conditional(path_prob, u, v)
            lv = min(level[v], self.max_depth)
            out.append(out[u] * ((self.accepted[lv, b] + prior * q) / (self.trials[lv, b] + prior)))
        return out

    def observe(self, parent, path_prob, level, nodes, accepted) -> None:
        """Count the outcome of one verification: ``nodes`` the verified draft node ids, ``accepted`` the committed
        ones (a path from the root)."""
        committed = {0, *accepted}
        best: dict[int, tuple[float, int]] = {}  # committed parent -> (q, id) of its verified child of highest q
        for v in nodes:
            u = int(parent[v])
            if u not in committed:
                continue
            q, b = conditional(path_prob, u, v)
            lv = min(int(level[v]), self.max_depth)
            self.trials[lv, b] += 1
            self.accepted[lv, b] += v in committed
            if u not in best or q > best[u][0]:
                best[u] = (q, v)
        for q, v in best.values():
            lv = min(int(level[v]), self.max_depth)
            self.best_trials[lv] += 1
            self.best_accepted[lv] += v in committed
            self.best_q[lv] += q

    def chain_rate(self, level: int) -> float:
        """The expected conditional of the best child at ``level`` (the share of trials the best verified child of a
        committed parent was taken, shrunk toward their mean q, or toward 1/2 before any trial)."""
        lv = min(level, self.max_depth)
        n = self.best_trials[lv]
        mean_q = self.best_q[lv] / n if n else 0.5
        return float((self.best_accepted[lv] + self.prior * mean_q) / (n + self.prior))
