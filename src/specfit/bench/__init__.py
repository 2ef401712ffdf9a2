"""Benchmarks: commands that print figures measured now, never asserted by a test. ``python -m specfit.bench NAME`` runs
one: ``dag`` (a workflow run's time per rule, from Snakemake's log), ``device`` (the emulated device's cost model
against Tables 2-4), ``engine`` (expert loads and the all-hit overhead), ``hindsight`` (specfit-online with commit
probabilities learned from the questions it decodes, against the hand-tuned tree), ``host`` (SpecFit's host work
per cycle by part, replayed from a finished run's cycles), ``link`` (the toy's emulated
links), ``predictor`` (the learned route predictor's cost), ``proportions`` (the toy's proportions beside the
paper's), ``reproduce`` (a run against the committed reference), ``sampling`` (the host work sampling adds per
cycle at the real vocabulary), ``select`` (the exact search on paper-sized pools),
``spread`` (the same decode jobs in two runs), ``tuned`` (every method against the hand-tuned tree, cell by cell) and
``verdicts`` (two reports' verdicts, cell by cell)."""

import argparse

COMMAND = "python -m specfit.bench"


def parser(module: str, description: str | None = None, raw: bool = False) -> argparse.ArgumentParser:
    """The argument parser of the benchmark module ``module`` (its ``__name__``), its usage line the command a user
    types (``python -m specfit.bench NAME``; argparse would say ``__main__.py``)."""
    formatter = argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter
    return argparse.ArgumentParser(prog=f"{COMMAND} {module.rsplit('.', 1)[-1]}", description=description,
                                   formatter_class=formatter)
