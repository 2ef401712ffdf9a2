"""`python -m specfit.bench device`: the device model against the paper's Tables 2-4."""

import pytest

from specfit.bench.device import main
from specfit.paper_device import check, counts, derive
from specfit.paper import paper_results


def test_counters_read_off_table_2():
    c = counts(paper_results(), "a100", "summarization")
    # AR without the cache: 48 layers x top-8 per decode cycle; 241.3 tokens per request, 4,429 prefill copies each
    assert c["ar", "no_cache"]["union"] == 384 == c["ar", "no_cache"]["copies"]
    tokens = 9652 / 40
    prefill = 400.7 * tokens - tokens * 384
    assert c["eagle3", "no_cache"]["union"] == pytest.approx((486.5 * tokens - prefill) / (3823 / 40))
    assert c["eagle3", "cache"]["copies"] == pytest.approx((73.4 * tokens - prefill) / (3823 / 40))
    assert c["eagle3", "cache"]["levels"] == 5 and c["specfit", "cache"]["levels"] == 2.86


def test_a100_parameters_from_its_summarization_rows():
    p = derive(paper_results(), "a100")
    # one drafted level: 21.7% of the 105.9 ms SpecFit saves is drafting, a 44.9% cut of EAGLE-3's five levels
    assert p["draft_ms"] == pytest.approx(0.217 * 105.9 / 0.449 / 5, rel=1e-3)
    assert p["draft_ms"] / 150.6 == pytest.approx(0.068, abs=1e-3)
    # the cached AR step: the fixed part and 384 executed experts (its ~33 copies hide behind its hits)
    assert p["fixed_ms"] + 384 * p["expert_ms"] == pytest.approx(150.6)
    assert 0.15 < p["expert_ms"] < 0.25 and 0.15 < p["copy_ms"] < 0.25


def test_every_cell_within_ten_percent():
    rows = check(paper_results())
    assert len(rows) == 18  # 3 tables x 3 methods x 2 cache modes
    assert max(abs(r["error"]) for r in rows) < 0.10
    fitted = [r for r in rows if r["fitted"] and r["mode"] == "cache"]
    assert all(abs(r["error"]) < 1e-9 for r in fitted)


def test_main_prints_the_table_and_the_toys_parameters(capsys):
    main(["--step-ms", "20"])
    out = capsys.readouterr().out
    assert "largest error" in out and "toy: emulate: {name: A100, fixed_ms: 9.83" in out
