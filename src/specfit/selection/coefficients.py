"""SpecFit's cycle-time model T̂(S) = b_|S| + β·F(S) (Eq. 4): the NNLS fit and the paper's presets; and the
cache-aware model T̂(S) = b_|S| + β_miss·M(S) + β_hit·H(S) (specfit-ca's cost), fitted by NNLS from the same probes.

M(S) counts the experts of the per-layer union (root + S) that the layer's cache does not hold when the verify
forward starts (the copies it makes: the engine loads each missing expert once per forward), H(S) the resident
ones; M + H = F.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import resources

import numpy as np
import yaml
from scipy.optimize import nnls

# Named presets of the paper's Appendix B: devices.<name>.coefficients in the config.
PRESETS = {"paper-a100": "a100", "paper-rtx4090": "rtx4090"}


@dataclass(frozen=True)
class Fit:
    """Coefficients in milliseconds and how well they explain the probe times."""

    b: list[float]  # [sizes] intercepts b_0..b_{sizes-1}
    beta: float  # ms per expert of union demand
    r2: float
    rmse_ms: float
    max_abs_residual_ms: float
    n_points: int

    def as_dict(self) -> dict:
        return asdict(self)


def score(y_ms, pred_ms) -> tuple[float, float]:
    """R² and RMSE (ms) of predictions ``pred_ms`` of ``y_ms``."""
    y = np.asarray(y_ms, dtype=np.float64)
    residual = y - np.asarray(pred_ms, dtype=np.float64)  # [n]
    total = float(np.sum((y - y.mean()) ** 2))
    return (1.0 - float(residual @ residual) / total if total > 0 else 1.0), float(np.sqrt(np.mean(residual**2)))


def _nnls(design: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float, float, float]:
    """NNLS coefficients of ``design`` [n, p] for ``y`` [n]; R², RMSE and the largest absolute residual."""
    coef, _ = nnls(design, y)
    pred = design @ coef  # [n]
    r2, rmse = score(y, pred)
    return coef, r2, rmse, float(np.max(np.abs(y - pred)))


def _size_design(k: np.ndarray, sizes: int, extra: int) -> np.ndarray:
    """[n, sizes + extra]: one-hot probe size, then ``extra`` zero columns to fill."""
    if k.size == 0 or k.min() < 0 or k.max() >= sizes:
        raise ValueError(f"probe sizes must lie in 0..{sizes - 1}")
    design = np.zeros((k.size, sizes + extra))
    design[np.arange(k.size), k] = 1.0
    return design


def fit_nnls(k: np.ndarray, union: np.ndarray, y_ms: np.ndarray, sizes: int = 8) -> Fit:
    """Minimize Σ_i (y_i − b_{k_i} − β F_i)² subject to b, β ≥ 0 (Appendix B) with scipy's NNLS.

    ``k`` [n] probe sizes in 0..sizes-1, ``union`` [n] F of each probe tree, ``y_ms`` [n] cycle times.
    """
    k = np.asarray(k, dtype=np.int64)
    design = _size_design(k, sizes, 1)  # [n, sizes + 1]: one-hot size, then F
    design[:, sizes] = np.asarray(union, dtype=np.float64)
    coef, r2, rmse, max_abs = _nnls(design, np.asarray(y_ms, dtype=np.float64))
    return Fit(b=[float(v) for v in coef[:sizes]], beta=float(coef[sizes]), r2=r2, rmse_ms=rmse,
               max_abs_residual_ms=max_abs, n_points=int(k.size))


def fit_dense(k: np.ndarray, y_ms: np.ndarray, sizes: int = 8) -> Fit:
    """The cycle time of a dense model, T̂(S) = b_|S| with β = 0: Eq. 4's NNLS on the same probes without the union
    column, so each b_k is the mean probe time at size k. What the union column adds is the paper's thesis (kind
    specfit-dense selects with this)."""
    return fit_nnls(k, np.zeros(len(k)), y_ms, sizes)


@dataclass(frozen=True)
class FitCA:
    """The cache-aware coefficients in milliseconds and how well they explain the probe times.

    ``beta_*_identified``: whether the points determine the coefficient at all, i.e. its column is not a linear
    combination of the others (without a cache every expert is a miss, H = 0: NNLS returns β_hit = 0, which
    means nothing).
    """

    b: list[float]  # [sizes] intercepts b_0..b_{sizes-1}
    beta_miss: float  # ms per expert copied by the verify forward
    beta_hit: float  # ms per expert of the union already resident
    r2: float
    rmse_ms: float
    max_abs_residual_ms: float
    n_points: int
    beta_miss_identified: bool
    beta_hit_identified: bool

    def as_dict(self) -> dict:
        return asdict(self)


def fit_nnls_ca(k: np.ndarray, misses: np.ndarray, hits: np.ndarray, y_ms: np.ndarray, sizes: int = 8) -> FitCA:
    """Minimize Σ_i (y_i − b_{k_i} − β_miss M_i − β_hit H_i)² subject to b, β_miss, β_hit ≥ 0 (scipy's NNLS).

    ``k`` [n] probe sizes in 0..sizes-1, ``misses`` / ``hits`` [n] M and H of each point, ``y_ms`` [n] times.
    """
    k = np.asarray(k, dtype=np.int64)
    design = _size_design(k, sizes, 2)  # [n, sizes + 2]: one-hot size, then M, then H
    design[:, sizes] = np.asarray(misses, dtype=np.float64)
    design[:, sizes + 1] = np.asarray(hits, dtype=np.float64)
    coef, r2, rmse, max_abs = _nnls(design, np.asarray(y_ms, dtype=np.float64))
    rank = np.linalg.matrix_rank(design)

    def identified(column: int) -> bool:
        return bool(np.any(design[:, column])) and np.linalg.matrix_rank(np.delete(design, column, axis=1)) < rank

    return FitCA(b=[float(v) for v in coef[:sizes]], beta_miss=float(coef[sizes]), beta_hit=float(coef[sizes + 1]),
                 r2=r2, rmse_ms=rmse, max_abs_residual_ms=max_abs, n_points=int(k.size),
                 beta_miss_identified=identified(sizes), beta_hit_identified=identified(sizes + 1))


@dataclass(frozen=True)
class DraftCost:
    """What drafting d levels adds to a cycle's time (ms), as specfit-ca predicts it (beyond the paper).

    A drafted cycle first catches the drafter up on the tokens committed since it last drafted (one drafter forward)
    and expands level 1 from that forward's logits; each further level is one drafter forward over the frontier;
    after every level the method selects over the pool so far::

        cost(0) = 0,    cost(d) = start_ms + (d - 1)·level_ms + d·select_ms
    """

    start_ms: float  # drafter catch-up + level 1
    level_ms: float  # one further level: a drafter forward over the frontier
    select_ms: float  # one selection over the pool drafted so far (pool view, route encoding, exact search)

    def __call__(self, depth: int) -> float:
        return 0.0 if depth == 0 else self.start_ms + (depth - 1) * self.level_ms + depth * self.select_ms

    @property
    def next_level_ms(self) -> float:
        """What drafting one more level costs once drafting has started."""
        return self.level_ms + self.select_ms

    @classmethod
    def of(cls, coefficients: dict) -> DraftCost:
        """From a calibration's coefficients JSON; the paper's presets (no drafting fit) cost nothing."""
        if coefficients.get("drafting") is None:
            return cls(0.0, 0.0, 0.0)
        d = coefficients["drafting"]
        return cls(d["start_ms"], d["level_ms"], d["select_ms"])


def cache_aware_cost(coefficients: dict) -> tuple[list[float], float, float, DraftCost]:
    """(b, β_miss, β_hit, D) that specfit-ca selects with, from a calibration's coefficients JSON: the cache-aware
    fit without drafting and the drafting fit (D counts drafting once); for the paper's presets (no cache-aware
    fit) the paper's b, its β for both kinds of expert, and free drafting."""
    fit = coefficients.get("cache_aware")
    if not fit:
        return coefficients["b"], coefficients["beta"], coefficients["beta"], DraftCost.of(coefficients)
    verify = fit["without_drafting"]
    return verify["b"], verify["beta_miss"], verify["beta_hit"], DraftCost.of(coefficients)


def fit_drafting(levels: np.ndarray, draft_ms: np.ndarray) -> tuple[float, float, float]:
    """NNLS of the "draft" section time on the levels drafted: draft_ms ≈ start + (levels - 1)·level.

    ``levels`` [n] >= 1 and ``draft_ms`` [n] of probe cycles that caught the drafter up. Returns (start_ms,
    level_ms, R²)."""
    levels = np.asarray(levels, dtype=np.float64)
    design = np.stack([np.ones_like(levels), levels - 1], axis=1)  # [n, 2]
    coef, r2, _, _ = _nnls(design, np.asarray(draft_ms, dtype=np.float64))
    return float(coef[0]), float(coef[1]), r2


def predict_ms(b, beta: float, k: np.ndarray, union: np.ndarray) -> np.ndarray:
    return np.asarray(b, dtype=np.float64)[np.asarray(k)] + beta * np.asarray(union, dtype=np.float64)


def predict_ca_ms(b, beta_miss: float, beta_hit: float, k: np.ndarray, misses: np.ndarray,
                  hits: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.float64)[np.asarray(k)] + beta_miss * np.asarray(misses, dtype=np.float64)
            + beta_hit * np.asarray(hits, dtype=np.float64))


def paper_coefficients() -> dict:
    """The paper's coefficients in ms, by GPU and cache mode (Appendix B, shipped with the package)."""
    return yaml.safe_load(resources.files("specfit").joinpath("data/paper_coefficients.yaml").read_text())[
        "coefficients_ms"]


def preset(name: str, cache: bool) -> dict:
    """The paper's frozen coefficients for a named preset, with and without the cache."""
    if name not in PRESETS:
        raise ValueError(f"unknown coefficient preset {name!r}; known: {', '.join(PRESETS)}")
    c = paper_coefficients()[PRESETS[name]]["cache" if cache else "no_cache"]
    return {"b": [float(v) for v in c["b"]], "beta": float(c["beta"])}
