"""The paper's reported figures, transcribed from the paper and shipped with the package, for the side-by-side."""

from __future__ import annotations

from importlib import resources

import yaml

from specfit.selection.coefficients import paper_coefficients


def paper_results() -> dict:
    """data/paper_results.yaml, with the coefficients of data/paper_coefficients.yaml under ``coefficients_ms``."""
    results = yaml.safe_load(resources.files("specfit").joinpath("data/paper_results.yaml").read_text())
    return {**results, "coefficients_ms": paper_coefficients()}
