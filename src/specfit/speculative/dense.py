"""The paper's thesis as an ablation (kind specfit-dense): SpecFit's selection under the cost of a dense model."""

from __future__ import annotations

from specfit.errors import SpecFitError
from specfit.io import read_json
from specfit.speculative.config import MethodConfig
from specfit.speculative.methods import SpecFit


class SpecFitDense(SpecFit):
    """The paper's thesis as an ablation: SpecFit's selection (Eq. 5, the exact search) and adaptive depth under the
    cost a dense model would have, T̂(S) = b'_|S| with β = 0, b' refitted by NNLS on the same calibration probes
    without the expert-union column (the calibration's ``dense`` fit, `specfit.selection.coefficients.fit_dense`).
    It reads no routes: every subtree of a size costs the same, whichever experts it activates."""

    asks_routes = False

    def __init__(self, config: MethodConfig, b, num_experts: int):
        super().__init__(config, b, 0.0, None, num_experts)

    @classmethod
    def from_inputs(cls, config, inputs, seed, num_experts):
        if "coefficients" not in inputs:
            raise SpecFitError(f"method {config.name} needs the `coefficients` input (the calibration's dense fit)")
        dense = read_json(inputs["coefficients"]).get("dense")
        if dense is None:
            raise SpecFitError(f"{inputs['coefficients']}: no dense fit, as a calibration without probe points (the "
                               f"paper's preset coefficients) has none; method {config.name} refits b_k on the "
                               "probes: calibrate with devices.<device>.coefficients: fit")
        return cls(config, dense["b"], num_experts)
