"""SpecFit's selection of the verified draft subtree (Sections 3.1-3.3, Algorithm 1)."""

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
