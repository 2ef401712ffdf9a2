from specfit.bench import engine as bench


def test_engine_benchmark_runs_and_reports_goals(capsys):
    """A smoke run of ``python -m specfit.bench engine``; its figures are printed, never asserted."""
    bench.main(["--shapes", "toy", "--loads", "4", "--repeats", "1", "--iters", "10"])
    out = capsys.readouterr().out
    assert "raw copy loop" in out and "all-hit bookkeeping" in out
