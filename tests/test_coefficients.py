"""NNLS calibration fit (Appendix B) and the paper's presets."""

import numpy as np
import pytest

from specfit.coefficients import fit_nnls, predict_ms, preset


def test_nnls_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    b = np.array([142.2, 147.5, 150.5, 152.3, 152.7, 163.2, 155.2, 156.1])
    beta = 0.2107
    k = np.repeat(np.arange(8), 18)  # 144 points, as the paper's protocol gives
    union = rng.integers(100, 900, size=k.size)
    y = predict_ms(b, beta, k, union)
    fit = fit_nnls(k, union, y)
    np.testing.assert_allclose(fit.b, b, rtol=1e-9)
    assert fit.beta == pytest.approx(beta, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.rmse_ms < 1e-9 and fit.n_points == 144


def test_nnls_keeps_coefficients_nonnegative():
    k = np.array([0, 0, 1, 1, 2, 2])
    union = np.array([10, 20, 30, 40, 50, 60])
    y = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])  # time falling with F: least squares would want beta < 0
    fit = fit_nnls(k, union, y, sizes=3)
    assert fit.beta == 0.0 and min(fit.b) >= 0.0
    np.testing.assert_allclose(fit.b, [4.5, 2.5, 0.5])  # each size's mean once beta is pinned at 0
    assert fit.r2 < 1.0


def test_noisy_fit_reports_r2_and_residuals():
    rng = np.random.default_rng(1)
    k = np.repeat(np.arange(8), 18)
    union = rng.integers(10, 60, size=k.size)
    y = predict_ms(np.linspace(5, 9, 8), 0.4, k, union) + rng.normal(0, 0.5, size=k.size)
    fit = fit_nnls(k, union, y)
    assert 0.9 < fit.r2 < 1.0
    assert fit.beta == pytest.approx(0.4, abs=0.02)
    assert 0.3 < fit.rmse_ms < 0.7 and fit.max_abs_residual_ms >= fit.rmse_ms


def test_paper_presets():
    a100 = preset("paper-a100", cache=True)
    assert a100["beta"] == 0.210715513 and a100["b"][0] == 142.214 and len(a100["b"]) == 8
    assert preset("paper-rtx4090", cache=False)["beta"] == 0.781593955
    with pytest.raises(ValueError, match="unknown coefficient preset 'h100'"):
        preset("h100", cache=True)
