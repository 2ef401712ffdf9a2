"""SpecFit's cycle-time model T̂(S) = b_|S| + β·F(S) (Eq. 4): the NNLS fit and the paper's presets."""

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


def fit_nnls(k: np.ndarray, union: np.ndarray, y_ms: np.ndarray, sizes: int = 8) -> Fit:
    """Minimize Σ_i (y_i − b_{k_i} − β F_i)² subject to b, β ≥ 0 (Appendix B) with scipy's NNLS.

    ``k`` [n] probe sizes in 0..sizes-1, ``union`` [n] F of each probe tree, ``y_ms`` [n] cycle times.
    """
    k = np.asarray(k, dtype=np.int64)
    union = np.asarray(union, dtype=np.float64)
    y = np.asarray(y_ms, dtype=np.float64)
    if k.size == 0 or k.min() < 0 or k.max() >= sizes:
        raise ValueError(f"probe sizes must lie in 0..{sizes - 1}")
    design = np.zeros((k.size, sizes + 1))  # [n, sizes + 1]: one-hot size, then F
    design[np.arange(k.size), k] = 1.0
    design[:, sizes] = union
    coef, _ = nnls(design, y)
    residual = y - design @ coef  # [n]
    total = float(np.sum((y - y.mean()) ** 2))
    return Fit(
        b=[float(v) for v in coef[:sizes]],
        beta=float(coef[sizes]),
        r2=1.0 - float(residual @ residual) / total if total > 0 else 1.0,
        rmse_ms=float(np.sqrt(np.mean(residual**2))),
        max_abs_residual_ms=float(np.max(np.abs(residual))),
        n_points=int(k.size),
    )


def predict_ms(b, beta: float, k: np.ndarray, union: np.ndarray) -> np.ndarray:
    return np.asarray(b, dtype=np.float64)[np.asarray(k)] + beta * np.asarray(union, dtype=np.float64)


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
