"""`python -m specfit.bench dag`: a run's time per rule, read from a Snakemake log."""

import pytest

from specfit.bench import dag
from specfit.errors import SpecFitError

LOG = """Building DAG of jobs...
[Fri Dec  4 10:16:48 2026]
localrule extract:
    input: data/raw/spec_bench/question.jsonl
    jobid: 2
    wildcards: model=toy, workload=gsm8k
Shell command: python -m specfit.launch extract ...
[Fri Dec  4 10:16:53 2026]
Finished jobid: 2 (Rule: extract)
1 of 3 steps (33%) done
[Fri Dec  4 10:16:53 2026]
localrule decode:
    jobid: 1
[Fri Dec  4 10:17:09 2026]
Finished jobid: 1 (Rule: decode)
[Fri Dec  4 10:17:09 2026]
rule decode:
    jobid: 4
[Fri Dec  4 10:17:21 2026]
Finished jobid: 4 (Rule: decode)
[Fri Dec  4 10:17:21 2026]
localrule report:
    jobid: 0
"""


def test_jobs_per_rule_with_their_times(tmp_path, capsys):
    log = tmp_path / "run.snakemake.log"
    log.write_text(LOG)
    found = dag.jobs(LOG.splitlines())
    assert [(j.rule, j.end is not None) for j in found] == [("extract", True), ("decode", True), ("decode", True),
                                                           ("report", False)]
    assert [(j.end - j.start).total_seconds() for j in found[:3]] == [5.0, 16.0, 12.0]
    dag.main([str(log)])
    out = capsys.readouterr().out
    assert "3 jobs finished" in out
    assert "decode                     2      0.5    14.0  84.8%" in out  # 28 s of the 33 s span
    assert "span, first job's start to last job's end: 0.6 min" in out


def test_no_log_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecFitError, match=r"no Snakemake log under .*\.snakemake/log: run the workflow"):
        dag.main([])
