"""NNLS calibration fit (Appendix B) and the paper's presets."""

import numpy as np
import pytest

from specfit.selection.coefficients import fit_nnls, fit_nnls_ca, predict_ca_ms, predict_ms, preset


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


def ca_points(rng, with_hits=True):
    """Calibration-like points: two repeats per probe, the second finding more of the union resident."""
    k = np.repeat(np.arange(8), 18)  # 144 probes
    union = rng.integers(100, 900, size=k.size)
    hits = rng.integers(0, union // 2) if with_hits else np.zeros_like(union)
    second = np.minimum(union, hits + rng.integers(0, 200, size=k.size)) if with_hits else hits
    return np.tile(k, 2), np.concatenate([union - hits, union - second]), np.concatenate([hits, second])


def test_nnls_ca_recovers_known_coefficients():
    b = np.array([142.2, 147.5, 150.5, 152.3, 152.7, 163.2, 155.2, 156.1])
    k, misses, hits = ca_points(np.random.default_rng(0))
    y = predict_ca_ms(b, 0.61, 0.045, k, misses, hits)
    fit = fit_nnls_ca(k, misses, hits, y)
    np.testing.assert_allclose(fit.b, b, rtol=1e-9)
    assert fit.beta_miss == pytest.approx(0.61, rel=1e-9) and fit.beta_hit == pytest.approx(0.045, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.rmse_ms < 1e-9 and fit.n_points == 288
    assert fit.beta_miss_identified and fit.beta_hit_identified
    assert set(fit.as_dict()) >= {"b", "beta_miss", "beta_hit", "r2", "rmse_ms", "n_points", "beta_hit_identified"}


def test_nnls_ca_explains_what_the_union_cannot():
    """Times that depend on copies, not on the union: the paper's model misses what the cache-aware one fits."""
    rng = np.random.default_rng(2)
    k, misses, hits = ca_points(rng)
    y = predict_ca_ms(np.linspace(5, 9, 8), 0.4, 0.0, k, misses, hits) + rng.normal(0, 0.5, size=k.size)
    fit = fit_nnls_ca(k, misses, hits, y)
    assert fit.r2 > 0.99 and fit.beta_miss == pytest.approx(0.4, abs=0.01) and fit.beta_hit < 0.01
    assert fit_nnls(k, misses + hits, y).r2 < 0.9


def test_nnls_ca_without_hits_leaves_beta_hit_unidentified():
    """No cache: every expert is a miss, H = 0; the fit runs, β_hit comes out 0 and says it means nothing."""
    rng = np.random.default_rng(3)
    k, misses, hits = ca_points(rng, with_hits=False)
    b = np.linspace(20, 30, 8)
    y = predict_ca_ms(b, 0.78, 0.0, k, misses, hits)
    fit = fit_nnls_ca(k, misses, hits, y)
    np.testing.assert_allclose(fit.b, b, rtol=1e-9)
    assert fit.beta_miss == pytest.approx(0.78, rel=1e-9) and fit.beta_hit == 0.0
    assert fit.beta_miss_identified and not fit.beta_hit_identified
    # the same points as the paper's model: M = F, so both fits agree
    paper = fit_nnls(k, misses, y)
    assert paper.beta == pytest.approx(fit.beta_miss) and paper.r2 == pytest.approx(fit.r2)


def test_nnls_ca_keeps_coefficients_nonnegative():
    k = np.array([0, 0, 1, 1, 2, 2])
    misses, hits = np.array([10, 20, 30, 40, 50, 60]), np.array([5, 1, 7, 2, 9, 3])
    y = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])  # time falling with M: least squares would want β_miss < 0
    fit = fit_nnls_ca(k, misses, hits, y, sizes=3)
    assert fit.beta_miss == 0.0 and fit.beta_hit >= 0.0 and min(fit.b) >= 0.0
    with pytest.raises(ValueError, match="probe sizes must lie in 0..2"):
        fit_nnls_ca([3], [1], [1], [1.0], sizes=3)


def test_paper_presets():
    a100 = preset("paper-a100", cache=True)
    assert a100["beta"] == 0.210715513 and a100["b"][0] == 142.214 and len(a100["b"]) == 8
    assert preset("paper-rtx4090", cache=False)["beta"] == 0.781593955
    with pytest.raises(ValueError, match="unknown coefficient preset 'h100'"):
        preset("h100", cache=True)


def test_draft_cost_and_its_fit():
    from specfit.selection.coefficients import DraftCost, fit_drafting

    cost = DraftCost(start_ms=0.7, level_ms=0.4, select_ms=0.1)
    assert [cost(d) for d in range(4)] == pytest.approx([0.0, 0.8, 1.3, 1.8])
    assert cost.next_level_ms == pytest.approx(cost(3) - cost(2))
    assert DraftCost.of({"drafting": None}) == DraftCost(0.0, 0.0, 0.0)  # the paper's presets: drafting is free
    levels = np.array([1, 1, 2, 3, 5])
    start, level, r2 = fit_drafting(levels, 0.7 + 0.4 * (levels - 1))
    assert (start, level, r2) == pytest.approx((0.7, 0.4, 1.0))
