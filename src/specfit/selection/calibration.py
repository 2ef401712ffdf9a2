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
from numba import njit

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

    def observe_rows(self, parent: np.ndarray, path_prob: np.ndarray, level: np.ndarray, nodes, accepted) -> None:
        """`observe` for a pool held in arrays [>= n+1] (`specfit.selection.pool.GrowingPool`'s), compiled
        (`observed_rows`): the same counts."""
        observed_rows(parent, path_prob, level, np.asarray(nodes, dtype=np.int64), np.asarray(accepted, dtype=np.int64),
                      self.max_depth, EDGES, self.trials, self.accepted, self.best_trials, self.best_accepted,
                      self.best_q)

    def observe(self, parent, path_prob, level, nodes, accepted) -> None:
        """Count the outcome of one verification: ``nodes`` the verified draft node ids (ascending), ``accepted`` the
        committed ones (a path from the root)."""
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


@njit(cache=True, inline="always")
def _conditional(path_prob, u, v, edges):
    """`conditional` compiled: q_v = p_v / p_u clipped to [0, 1] (0 under a parent of probability 0), its bin."""
    up = path_prob[u]
    q = min(max(path_prob[v] / up, 0.0), 1.0) if up > 0 else 0.0
    return q, np.searchsorted(edges, q, side="right") - 1


@njit(cache=True)
def calibrated_rows(parent, path_prob, level, out, start, end, accepted, trials, prior, max_depth, edges):
    """`OnlineCalibration.path_probs` compiled, in place, for a pool held in arrays (``parent``, ``path_prob`` p_v,
    ``level`` [>= end]) with the calibration's counts: out[v] = p̃_v for start <= v < end, out[..start-1] already
    filled (out[0] = 1 is set when start is 0). The same float64 operations in the same order, so the same p̃ bit
    for bit (`specfit.selection.pool.GrowingPool` calls it as each level arrives)."""
    if start == 0:
        out[0] = 1.0
        start = 1
    for v in range(start, end):
        u = parent[v]
        q, b = _conditional(path_prob, u, v, edges)
        lv = min(level[v], max_depth)
        out[v] = out[u] * ((accepted[lv, b] + prior * q) / (trials[lv, b] + prior))


@njit(cache=True)
def observed_rows(parent, path_prob, level, nodes, accepted, max_depth, edges, trials, hits, best_trials, best_hits,
                  best_q):
    """`OnlineCalibration.observe` compiled, for a pool held in arrays (``parent``, ``path_prob`` p_v, ``level``):
    ``nodes`` the verified ids (ascending), ``accepted`` the committed ones. The same counts added in the same order
    (each committed parent's best child in the order the parents first appear), so the same float64 sums."""
    n1 = parent.shape[0]
    committed = np.zeros(n1, dtype=np.bool_)
    committed[0] = True
    for v in accepted:
        committed[v] = True
    best = np.full(n1, -1, dtype=np.int64)  # committed parent -> its verified child of highest q (first on ties)
    best_of = np.zeros(n1, dtype=np.float64)  # that child's q
    order = np.empty(n1, dtype=np.int64)  # the committed parents in the order they first appear
    parents = 0
    for v in nodes:
        u = parent[v]
        if not committed[u]:
            continue
        q, b = _conditional(path_prob, u, v, edges)
        lv = min(level[v], max_depth)
        trials[lv, b] += 1
        hits[lv, b] += committed[v]
        if best[u] < 0:
            order[parents] = u
            parents += 1
            best[u], best_of[u] = v, q
        elif q > best_of[u]:
            best[u], best_of[u] = v, q
    for i in range(parents):
        u = order[i]
        v = best[u]
        lv = min(level[v], max_depth)
        best_trials[lv] += 1
        best_hits[lv] += committed[v]
        best_q[lv] += best_of[u]
