"""``python -m specfit.bench dag [LOG]``: how long a workflow run took, per rule, from Snakemake's own log.

Reads one run's log (default: the newest under ``.snakemake/log/`` of the working directory), where Snakemake dates
every job's start and end, and prints each rule's jobs, their summed and mean wall time and their share of the run,
then the run's span from its first job's start to its last job's end. Nothing is re-run: time a cold run with
``snakemake --cores 1 reports/all`` from a fresh clone, then run this beside it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from specfit import bench
from specfit.errors import SpecFitError
from specfit.numerics import cpu_name

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
RULE = re.compile(r"^(?:local)?rule (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+)")


@dataclass
class Job:
    rule: str
    start: datetime
    end: datetime | None = None


def jobs(lines: list[str]) -> list[Job]:
    """Each job the log shows starting, with its end where the log shows it finished."""
    out: dict[str, Job] = {}
    stamp = rule = None
    for line in lines:
        if m := STAMP.match(line):
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := RULE.match(line):
            rule = m.group(1)
        elif (m := JOBID.match(line)) and rule is not None and stamp is not None:
            out[m.group(1)] = Job(rule, stamp)
            rule = None
        elif (m := FINISHED.match(line)) and m.group(1) in out:
            out[m.group(1)].end = stamp
    return list(out.values())


def newest_log(root: Path) -> Path:
    logs = sorted((root / ".snakemake" / "log").glob("*.snakemake.log"))
    if not logs:
        raise SpecFitError(f"no Snakemake log under {root / '.snakemake' / 'log'}: run the workflow there first, or "
                           "give the log's path")
    return logs[-1]


def main(argv: list[str] | None = None) -> None:
    parser = bench.parser(__name__, __doc__, raw=True)
    parser.add_argument("log", nargs="?", type=Path, help="a Snakemake log (default: the newest in .snakemake/log)")
    args = parser.parse_args(argv)
    log = args.log or newest_log(Path.cwd())
    done = [j for j in jobs(log.read_text().splitlines()) if j.end is not None]
    if not done:
        raise SpecFitError(f"{log} shows no finished job")
    by_rule: dict[str, list[float]] = defaultdict(list)
    for j in done:
        by_rule[j.rule].append((j.end - j.start).total_seconds())
    span = (max(j.end for j in done) - min(j.start for j in done)).total_seconds()
    print(f"{log}: {len(done)} jobs finished, on {cpu_name()} (this machine; the log does not name the CPU it ran on)")
    print(f"{'rule':22s} {'jobs':>5s} {'minutes':>8s} {'s/job':>7s} {'share':>6s}")
    for rule, times in sorted(by_rule.items(), key=lambda kv: -sum(kv[1])):
        print(f"{rule:22s} {len(times):5d} {sum(times) / 60:8.1f} {sum(times) / len(times):7.1f} "
              f"{100 * sum(times) / span:5.1f}%")
    print(f"span, first job's start to last job's end: {span / 60:.1f} min (timestamps to the second)")
