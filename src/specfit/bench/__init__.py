"""Benchmarks: commands that print figures measured now, never asserted by a test. ``python -m specfit.bench NAME``
runs one: ``dag`` (a workflow run's time per rule, from Snakemake's log), ``device`` (the emulated device's cost model
against Tables 2-4), ``engine`` (expert loads and the all-hit overhead), ``link`` (the toy's emulated links),
``predictor`` (the learned route predictor's cost), ``proportions`` (the toy's proportions beside the paper's),
``reproduce`` (a run against the committed reference), ``select`` (the exact search on paper-sized pools), ``spread``
(the same decode jobs in two runs) and ``verdicts`` (two reports' verdicts, cell by cell)."""
