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

import numpy as np

# bin edges of the conditional probability q_v: finer where a drafter's confidence says most
EDGES = np.array([0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])


class OnlineCalibration:
    """Per-(level, q-bin) acceptance counts of verified nodes, and the calibrated path probabilities they give."""

    def __init__(self, max_depth: int, prior: float = 4.0):
        self.max_depth, self.prior = max_depth, float(prior)
        self.reset()

    def reset(self) -> None:
        shape = (self.max_depth + 1, len(EDGES))  # [level, bin]; level 0 unused
        self.accepted = np.zeros(shape)
        self.trials = np.zeros(shape)
        self.best_accepted = np.zeros(self.max_depth + 1)  # [level] the best verified child of a committed parent
        self.best_trials = np.zeros(self.max_depth + 1)
        self.best_q = np.zeros(self.max_depth + 1)  # [level] sum of those children's own q

    @staticmethod
    def conditionals(parent, path_prob) -> np.ndarray:
        """[n+1] q_v = p_v / p_parent(v) (1 for the root)."""
        parent, path_prob = np.asarray(parent), np.asarray(path_prob, dtype=np.float64)
        q = np.ones_like(path_prob)
        up = path_prob[np.maximum(parent[1:], 0)]
        q[1:] = np.divide(path_prob[1:], up, out=np.zeros_like(up), where=up > 0)
        return np.clip(q, 0.0, 1.0)

    def path_probs(self, parent, path_prob, level) -> np.ndarray:
        """[n+1] the calibrated p̃_v of a pool (parents before children), p̃ of the root 1."""
        q = self.conditionals(parent, path_prob)
        lv = np.minimum(np.asarray(level), self.max_depth)
        b = np.searchsorted(EDGES, q, side="right") - 1  # [n+1] bin of each q
        tilde = (self.accepted[lv, b] + self.prior * q) / (self.trials[lv, b] + self.prior)
        out = np.ones(len(q))
        for v in range(1, len(q)):
            out[v] = out[parent[v]] * tilde[v]
        return out

    def observe(self, parent, path_prob, level, nodes, accepted) -> None:
        """Count the outcome of one verification: ``nodes`` the verified draft node ids, ``accepted`` the committed
        ones (a path from the root)."""
        committed = {0, *accepted}
        q = self.conditionals(parent, path_prob)
        best: dict[int, int] = {}  # committed parent -> its verified child of highest q
        for v in nodes:
            u = int(parent[v])
            if u not in committed:
                continue
            lv = min(int(level[v]), self.max_depth)
            b = int(np.searchsorted(EDGES, q[v], side="right") - 1)
            self.trials[lv, b] += 1
            self.accepted[lv, b] += v in committed
            if u not in best or q[v] > q[best[u]]:
                best[u] = v
        for v in best.values():
            lv = min(int(level[v]), self.max_depth)
            self.best_trials[lv] += 1
            self.best_accepted[lv] += v in committed
            self.best_q[lv] += q[v]

    def chain_rate(self, level: int) -> float:
        """The expected conditional of the best child at ``level`` (the share of trials the best verified child of a
        committed parent was taken, shrunk toward their mean q, or toward 1/2 before any trial)."""
        lv = min(level, self.max_depth)
        n = self.best_trials[lv]
        mean_q = self.best_q[lv] / n if n else 0.5
        return float((self.best_accepted[lv] + self.prior * mean_q) / (n + self.prior))
