"""`python -m specfit.bench device`: the device model against the paper's Tables 2-4."""

import pytest

from specfit.bench.device import main
from specfit.engine.paper_gpus import check, counts, derive
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
    # the host's selection: a median of 1.43 ms per summarization cycle over its 2.86 drafted levels (4.6, Table 5)
    assert p["select_ms"] == pytest.approx(1.43 / 2.86) and derive(paper_results(), "rtx4090")["select_ms"] == 0.5


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


def test_proportions_of_runs_and_of_the_paper():
    from specfit.engine.paper_gpus import paper_proportions, proportion_met, run_proportions

    paper = paper_proportions(paper_results(), "summarization")
    assert paper["ar_nocache_over_cache"] == pytest.approx(214.2 / 150.6)
    assert paper["e3_over_ar_cache"] == pytest.approx(371.7 / 150.6)
    assert paper["e3_over_ar_nocache"] == pytest.approx(600.9 / 214.2)
    assert 0.45 < paper["execution_share"] < 0.55 and paper["copy_share"] < 0.10
    emulate = {"expert_ms": 0.5, "copy_ms": 0.4}
    ar = {"ms_per_cycle": 20.0, "experts_per_token": 16, "h2d_per_cycle": 5.0}
    ar0 = {"ms_per_cycle": 30.0}
    e3 = {"ms_per_cycle": 50.0, "draft_ms_per_cycle": 7.0, "drafted_levels_per_cycle": 5.0}
    e30 = {"ms_per_cycle": 90.0}
    toy = run_proportions(ar, ar0, e3, e30, emulate)
    assert toy == pytest.approx({"ar_nocache_over_cache": 1.5, "e3_over_ar_cache": 2.5, "e3_over_ar_nocache": 3.0,
                                 "level_share": 0.07, "execution_share": 0.4, "copy_share": 0.1})
    assert proportion_met("ar_nocache_over_cache", 1.5, 1.42) is True  # within ±15%
    assert proportion_met("e3_over_ar_cache", 3.0, 2.47) is False
    assert proportion_met("level_share", 0.07, 0.068) is True and proportion_met("level_share", 0.11, 0.068) is False
    assert proportion_met("copy_share", 0.1, 0.04) is None  # shown beside the paper's, no goal


def test_main_prints_each_resident_devices_fit(capsys, monkeypatch, root, tmp_path):
    monkeypatch.chdir(root)  # config.yaml with config.resident.yaml: its M5 Max entries, 3 drafter shares per gather
    main([])
    out = capsys.readouterr().out
    for gather in ("pair", "distinct"):
        for name in (f"cpu-m5max-{gather}", f"cpu-m5max-{gather}-halfdraft", f"cpu-m5max-{gather}-doubledraft"):
            assert f"Resident device {name} (M5 Max, {gather} gather" in out
    assert out.count("      8   1104.0     28.13") == 3  # pair mode's width 8: 23 x 6 x 8 reads, per pair device
    errors = [float(line.split()[-1].rstrip("%")) for line in out.splitlines()
              if line.startswith("  ") and line.strip().endswith("%") and "largest" not in line]
    assert len(errors) == 30 and max(map(abs, errors)) < 3.0
    assert "one toy read stands for 8.625" in out and "copies 0" in out
    monkeypatch.chdir(tmp_path)  # no config: no resident device, said so
    main([])
    assert "No resident device: run from the workflow's folder" in capsys.readouterr().out
