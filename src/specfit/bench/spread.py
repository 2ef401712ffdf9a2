"""``python -m specfit.bench spread A B``: how far the same decode jobs, run twice in their own processes, moved.

``A`` and ``B`` are two copies of the workflow's ``data/decode`` folder from two runs of the same decode jobs (e.g.
``snakemake --cores 1 reports/all --forcerun decode`` after copying ``data/decode`` aside). For every job both
hold, the log ratio of its decode TPS (metrics.json's ``tps_dec``) in B over A; it prints each job's, their mean,
standard deviation and largest, then the standard deviation of the jobs an emulated device's virtual clock timed,
of a GPU's and of those the CPU timed itself. These are what `specfit.results.intervals.VIRTUAL_SPREAD`,
`PROCESS_SPREAD` and `CPU_SPREAD` stand for: the spread a ratio of two runs timed in different processes carries on top
of the bootstrap over requests.

    python -m specfit.bench spread /tmp/run1/data/decode data/decode
"""

import json
from pathlib import Path

import numpy as np

from specfit import bench
from specfit.results.intervals import CPU_SPREAD, PROCESS_SPREAD, VIRTUAL_SPREAD, cpu_timed, virtual


def cpu_timed_jobs(a: Path, jobs) -> set[str]:
    """The jobs (folders under ``a``) whose timings the CPU took itself (`specfit.results.intervals.cpu_timed`)."""
    return {job for job in jobs if cpu_timed(json.loads((a / job / "metrics.json").read_text()))}


def log_ratios(a: Path, b: Path) -> dict[str, float]:
    """Job (its folder under ``a``) -> log(TPS in b / TPS in a), for the jobs whose metrics.json both hold and differ
    (a byte-identical one was not run again: a job the second run did not schedule)."""
    out = {}
    for path in sorted(a.rglob("metrics.json")):
        other = b / path.relative_to(a)
        if other.is_file() and other.read_bytes() != path.read_bytes():
            ta, tb = (json.loads(p.read_text())["tps_dec"] for p in (path, other))
            if ta and tb:
                out[str(path.parent.relative_to(a))] = float(np.log(tb / ta))
    return out


def main(argv=None) -> None:
    parser = bench.parser(__name__, __doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="data/decode of the first run")
    parser.add_argument("b", type=Path, help="data/decode of the second run")
    parser.add_argument("--show", type=int, default=10, help="the jobs that moved most, how many to list")
    args = parser.parse_args(argv)
    ratios = log_ratios(args.a, args.b)
    if len(ratios) < 2:
        parser.error(f"{args.a} and {args.b} hold {len(ratios)} decode jobs run in both: two runs of the same jobs "
                     "needed")
    x = np.array(list(ratios.values()))
    print(f"{len(x)} decode jobs run in both: log(TPS {args.b} / TPS {args.a}) mean {x.mean():+.4f}, standard "
          f"deviation {x.std(ddof=1):.4f} (PROCESS_SPREAD: {PROCESS_SPREAD}), largest |log ratio| "
          f"{np.abs(x).max():.4f}")
    cpu = cpu_timed_jobs(args.a, ratios)
    on_virtual = {job for job in ratios if virtual(json.loads((args.a / job / "metrics.json").read_text()))}
    for name, jobs, assumed in (("emulated device, virtual clock", on_virtual, VIRTUAL_SPREAD),
                                ("GPU", set(ratios) - cpu - on_virtual, PROCESS_SPREAD),
                                ("timed by the CPU itself", cpu, CPU_SPREAD)):
        y = np.array([ratios[j] for j in sorted(jobs)])
        sd = f"standard deviation {y.std(ddof=1):.4f}" if len(y) > 1 else "too few for a standard deviation"
        print(f"  {name}: {len(y)} jobs, {sd} (assumed: {assumed})")
    for job, r in sorted(ratios.items(), key=lambda kv: -abs(kv[1]))[: args.show]:
        print(f"  {job:60s} {r:+.4f}")


if __name__ == "__main__":
    main()
