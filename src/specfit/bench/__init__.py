"""Benchmarks: commands that print figures measured now (``python -m specfit.bench {engine,link,reproduce,select}``)."""
