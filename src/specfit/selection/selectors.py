"""Verification-subtree selectors: SpecFit's ratio rule (Eq. 5), its cache-aware variant, their parametric forms,
the calibration probe trees and EAGLE-3's probability rule, all returning a `Selection`."""

from dataclasses import dataclass

import numpy as np

from specfit.selection.pool import Pool
from specfit.selection.search import CACHE_AWARE, MIN_UNION, PARAMETRIC, PARAMETRIC_CA, RATIO, RATIO_CA, search


@dataclass(frozen=True)
class Selection:
    """A selected subtree S of a pool and its predicted figures."""

    nodes: tuple[int, ...]  # sorted draft node ids of S, the root s excluded
    reward: float  # R̂(S) = 1 + sum of p_v over S, Eq. 3, summed in increasing node id
    union: int | None  # F(S), Eq. 4; None where no expert demand was asked for
    time: float | None  # T̂(S) = b_|S| + β F(S), Eq. 4 (the cache-aware rule: T̂_CA); None without coefficients
    visited: int  # legal subtrees the search evaluated (0 for a rule without search)
    misses: int | None = None  # M(S), experts of F(S) not resident; None for rules that do not compute it


def _intercepts(b, size: int) -> np.ndarray:
    b = np.asarray(b, dtype=np.float64)  # [>= size + 1] b_0, b_1, ...
    if b.ndim != 1 or b.shape[0] <= size:
        raise ValueError(f"need intercepts b_0..b_{size}, got {b.shape}")
    return b


def _selected(pool: Pool, k_max: int, objective: int, b, beta, lam, backend: str, timed: bool,
              beta_hit: float = 0.0) -> Selection:
    if k_max < 0:
        raise ValueError(f"k_max must be >= 0, got {k_max}")
    b = _intercepts(b, min(k_max, pool.n))
    nodes, reward, union, misses, visited = search(pool, k_max, objective, b, beta, lam, backend, beta_hit)
    if objective in CACHE_AWARE:  # the kernel's float64 T̂_CA, term by term
        time = pool.cache_aware_time(nodes, b[len(nodes)], beta, beta_hit, union, misses)
        return Selection(nodes, reward, union, time, visited, misses)
    time = float(b[len(nodes)]) + float(beta) * union if timed else None  # the kernel's float64 T̂
    return Selection(nodes, reward, union, time, visited)


def select_specfit(pool: Pool, b, beta: float, k_max: int = 7, backend: str = "numba") -> Selection:
    """Ŝ of Eq. 5: the legal subtree with |S| <= min(k_max, |V|) maximizing R̂(S) / T̂(S).

    Ratios are compared as float64 r / t; ties go to larger R̂, smaller F, fewer nodes, then the
    lexicographically smaller sorted node ids.
    """
    return _selected(pool, k_max, RATIO, b, beta, 0.0, backend, timed=True)


def select_specfit_ca(
    pool: Pool, b, beta_miss: float, beta_hit: float, k_max: int = 7, backend: str = "numba"
) -> Selection:
    """The cache-aware Ŝ: the legal subtree with |S| <= min(k_max, |V|) maximizing R̂(S) / T̂_CA(S),

        T̂_CA(S) = b_|S| + β_miss M(S) + β_hit H(S),   M(S) = Σ_l |U_l(S) \\ R_l|,   H(S) = F(S) - M(S),

    U_l(S) the layer-l expert union of F (root included) and R_l the experts resident in layer l's cache
    (`Pool.resident`; nothing when None). A resident expert whose copy is still in flight (`Pool.in_flight`, a
    prefetch) is a hit that still costs the fraction of its copy left: T̂_CA adds (β_miss − β_hit)·P(S), P(S) the
    sum of those fractions over the union (`Pool.in_flight_left`; 0 when nothing is in flight). T̂_CA is evaluated
    as b + β_miss·M + β_hit·(F - M) in float64, so with nothing resident (M = F) and a finite β_hit it is the paper's
    T̂ with β = β_miss, bit for bit, and the selection is `select_specfit`'s.

    Ties: ratio (float64 r / t), then larger R̂, then smaller M, then smaller F, then fewer nodes, then the
    lexicographically smaller sorted node ids. The selection's ``union`` is F, ``misses`` M and ``time`` T̂_CA.
    """
    return _selected(pool, k_max, RATIO_CA, b, beta_miss, 0.0, backend, timed=True, beta_hit=beta_hit)


def select_parametric(pool: Pool, b, beta: float, lam: float, k_max: int = 7, backend: str = "numba") -> Selection:
    """S_λ of Eq. 9: the legal subtree maximizing R̂(S) - λ T̂(S), with the tie rule of `select_specfit`."""
    return _selected(pool, k_max, PARAMETRIC, b, beta, lam, backend, timed=True)


def select_parametric_ca(
    pool: Pool, b, beta_miss: float, beta_hit: float, lam: float, k_max: int = 7, backend: str = "numba"
) -> Selection:
    """S_λ of Eq. 9 under the cache-aware cost: the legal subtree maximizing R̂(S) - λ T̂_CA(S), T̂_CA as in
    `select_specfit_ca`, with its tie rule (larger R̂, then smaller M, smaller F, fewer nodes, smaller ids)."""
    return _selected(pool, k_max, PARAMETRIC_CA, b, beta_miss, lam, backend, timed=True, beta_hit=beta_hit)


def select_min_union(pool: Pool, k: int, b=None, beta: float | None = None, backend: str = "numba") -> Selection:
    """Calibration's minimum-expert-union probe tree (Appendix B): the legal subtree of exactly k nodes
    with the smallest F; ties go to larger R̂, then the lexicographically smaller sorted node ids.

    Its time is given when b and beta are.
    """
    if not 0 <= k <= pool.n:
        raise ValueError(f"probe size {k} outside 0..{pool.n}")
    timed = b is not None and beta is not None
    b = b if timed else np.zeros(k + 1)
    return _selected(pool, k, MIN_UNION, b, beta or 0.0, 0.0, backend, timed)


def select_top_prob(pool: Pool, k_max: int = 7, b=None, beta: float | None = None) -> Selection:
    """EAGLE-3's rule and calibration's probability-prefix probe tree: the k_max nodes of highest p_v,
    ties to the smaller id, all nodes when fewer. Union and time are given when b and beta are.

    The result is ancestor-closed whenever p_v never exceeds its parent's, as path probabilities do.
    """
    ids = np.arange(1, pool.n + 1)
    order = np.lexsort((ids, -pool.path_prob[1:]))  # by decreasing p_v, then increasing id
    nodes = tuple(sorted(int(v) for v in ids[order[:k_max]]))
    reward = 1.0
    for v in nodes:
        reward += float(pool.path_prob[v])
    if b is None or beta is None:
        return Selection(nodes, reward, None, None, 0)
    union = pool.expert_union(nodes)
    time = float(_intercepts(b, len(nodes))[len(nodes)]) + float(beta) * union
    return Selection(nodes, reward, union, time, 0)


def holds_level(pool: Pool, selection: Selection, depth: int) -> bool:
    """Adaptive depth's test (Section 3.3): after drafting level d, draft level d + 1 only if the
    selection over V_<=d holds a level-d node."""
    return any(pool.level[v] == depth for v in selection.nodes)
