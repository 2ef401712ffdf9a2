"""`python -m specfit.bench spread`: the same decode jobs in two runs, how far their throughputs moved."""

import json

import numpy as np
import pytest

from specfit.bench.spread import log_ratios, main
from specfit.results.intervals import CPU_SPREAD, VIRTUAL_SPREAD


def write(root, job, tps, extra=0):
    path = root / job / "metrics.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    device = {"label": "emulated A100"} if "/cpu-a100/" in f"/{job}/" else None  # an emulated device's run
    path.write_text(json.dumps({"tps_dec": tps, "cycles": extra, "device": device}))


def test_log_ratios_of_the_jobs_run_in_both(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for job, (ta, tb) in {"toy/cpu/gsm8k/ar/slots0": (10.0, 11.0), "toy/cpu/gsm8k/eagle3/slots0": (20.0, 19.0),
                          "toy/cpu/gsm8k/specfit/slots0": (30.0, 30.0 * np.exp(0.05))}.items():
        write(a, job, ta)
        write(b, job, tb, extra=1)  # another run: its metrics.json differs
    write(a, "toy/cpu/gsm8k/ar/slots4", 5.0)  # only in the first run
    write(a, "toy/cpu/gsm8k/eagle3/slots4", 7.0)
    write(b, "toy/cpu/gsm8k/eagle3/slots4", 7.0)  # byte-identical: not run again, not a measurement
    r = log_ratios(a, b)
    assert set(r) == {"toy/cpu/gsm8k/ar/slots0", "toy/cpu/gsm8k/eagle3/slots0", "toy/cpu/gsm8k/specfit/slots0"}
    assert r["toy/cpu/gsm8k/ar/slots0"] == pytest.approx(np.log(1.1))
    assert r["toy/cpu/gsm8k/specfit/slots0"] == pytest.approx(0.05)
    main([str(a), str(b), "--show", "1"])
    out = capsys.readouterr().out
    x = np.log([1.1, 0.95, np.exp(0.05)])
    assert f"3 decode jobs run in both: log(TPS {b} / TPS {a}) mean {x.mean():+.4f}, standard deviation " \
           f"{x.std(ddof=1):.4f}" in out
    lines = out.splitlines()
    assert lines[1] == (f"  emulated device, virtual clock: 0 jobs, too few for a standard deviation (assumed: "
                        f"{VIRTUAL_SPREAD})")
    sd = x.std(ddof=1)
    assert lines[3] == f"  timed by the CPU itself: 3 jobs, standard deviation {sd:.4f} (assumed: {CPU_SPREAD})"
    assert lines[4].split() == ["toy/cpu/gsm8k/ar/slots0", f"{np.log(1.1):+.4f}"]


def test_the_spread_of_each_timing_regime(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    moves = {"toy/cpu-a100/gsm8k/ar/slots0": 0.01, "toy/cpu-a100/gsm8k/eagle3/slots0": -0.03,
             "toy/cpu-a100link/gsm8k/ar/slots0": 0.1, "toy/cpu-a100link/gsm8k/eagle3/slots0": -0.2}
    for job, move in moves.items():
        write(a, job, 10.0)
        write(b, job, 10.0 * np.exp(move), extra=1)
    main([str(a), str(b)])
    lines = capsys.readouterr().out.splitlines()
    device, cpu = np.std([0.01, -0.03], ddof=1), np.std([0.1, -0.2], ddof=1)
    assert lines[1].startswith(f"  emulated device, virtual clock: 2 jobs, standard deviation {device:.4f}")
    assert lines[2].startswith("  GPU: 0 jobs")
    assert lines[3].startswith(f"  timed by the CPU itself: 2 jobs, standard deviation {cpu:.4f}")


def test_two_runs_of_the_same_jobs_are_needed(tmp_path):
    write(tmp_path / "a", "toy/cpu/gsm8k/ar/slots0", 10.0)
    with pytest.raises(SystemExit):
        main([str(tmp_path / "a"), str(tmp_path / "b")])
