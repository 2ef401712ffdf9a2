"""SpecFit's selection of the verified draft subtree (Sections 3.1-3.3, Algorithm 1): the candidate pool
(`pool`), the exact search over its legal subtrees (`search`), the selectors every method calls (`selectors`: SpecFit's
ratio rule of Eq. 5, its cache-aware variant, EAGLE-3's probability rule) and the cycle-time model they read
(`coefficients`: Eq. 4, fitted by NNLS or the paper's presets)."""

from specfit.selection.pool import Pool
from specfit.selection.search import BACKENDS
from specfit.selection.selectors import (
    Selection,
    holds_level,
    select_min_union,
    select_parametric,
    select_specfit,
    select_specfit_ca,
    select_top_prob,
)

__all__ = [
    "BACKENDS",
    "Pool",
    "Selection",
    "holds_level",
    "select_min_union",
    "select_parametric",
    "select_specfit",
    "select_specfit_ca",
    "select_top_prob",
]
