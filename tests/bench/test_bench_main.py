"""`python -m specfit.bench NAME`: each benchmark's usage names the command a user types, and bad input (here a
log of a run that failed before any job finished) is one line on stderr with exit status 2, not a traceback."""

import pytest

from specfit.bench import __main__ as bench_main


@pytest.mark.parametrize("name", bench_main.BENCHMARKS)
def test_usage_names_the_command(name, capsys):
    with pytest.raises(SystemExit) as done:
        bench_main.main([name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m specfit.bench {name} ")


def test_a_failed_run_s_log_is_one_line(tmp_path, capsys):
    log = tmp_path / "failed.snakemake.log"
    log.write_text("Building DAG of jobs...\n[Fri Dec  4 10:16:48 2026]\nlocalrule extract:\n    jobid: 2\n"
                   "[Fri Dec  4 10:16:50 2026]\nError in rule extract:\n")
    with pytest.raises(SystemExit) as done:
        bench_main.main(["dag", str(log)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: {log} shows no finished job\n"
