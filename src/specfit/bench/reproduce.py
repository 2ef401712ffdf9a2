"""``python -m specfit.bench reproduce``: does this run of the workflow reproduce the committed reference run?

An emulated device runs on a virtual clock (docs/device.md), so a run of the default DAG should give the same report
on any machine. The reference (``reports/reference/toy.json``, written from one run with ``--write``) holds each
decode job's counters (requests, output tokens, cycles, host-to-device copies, experts executed, selected nodes,
accepted nodes), the sha256 of its outputs (and of each request's), its decode TPS with its interval, and every
verdict of the claims tables (``claims/{model}/{device}``, by row key). Without ``--write`` it compares this run to
the reference job by job (a counter that differs with this run's change, e.g. ``cycles +1``) and prints the summary
against the goals: every counter identical where the outputs are,
every TPS within 1% (host work, such as selection, still adds its measured time to the virtual clock), every verdict
identical, and every job and claim on both sides. The first two are asked of the jobs an emulated device's virtual
clock timed; a wall-clock job (a link-only device: the CPU's own regime) is shown without a goal. It exits with
status 1 when a goal is missed. Outputs that differ
are shown (the first request whose output differs) but are no goal by themselves.

    python -m specfit.bench reproduce                    # this run (data/decode, reports/all) against the reference
    python -m specfit.bench reproduce --write            # make this run the reference
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from specfit import bench
from specfit.bench.verdicts import read_tables
from specfit.errors import SpecFitError
from specfit.io import atomic_path
from specfit.numerics import cpu_name
from specfit.planning.paths import REPORT, RUN_FILES
from specfit.provenance import git_head
from specfit.results.intervals import virtual
from specfit.results.records import CYCLE_SCHEMA, REQUEST_SCHEMA, read_table

REFERENCE = "reports/reference/toy.json"
DECODE = "data/decode"
COUNTERS = ("n_requests", "output_tokens", "cycles", "h2d_transfers", "experts_executed", "selected_nodes",
            "accepted")
TPS_KEYS = ("tps_dec", "tps_dec_low", "tps_dec_high")
TOLERANCE = 0.01  # relative TPS difference still counted as reproduced


def sha256(value) -> str:
    """The sha256 of ``value`` written as JSON."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


def job_record(folder: str | os.PathLike) -> dict:
    """One decode job's counters, output hashes, TPS and timing label; ``outputs`` (request id -> output ids) stays in
    memory only (`write_reference` leaves it out)."""
    folder = Path(folder)
    requests = read_table(folder / "requests.parquet", REQUEST_SCHEMA, "requests",
                          columns=["request_id", "output_ids", "n_output", "h2d_transfers"]).to_pylist()
    cycles = read_table(folder / "cycles.parquet", CYCLE_SCHEMA, "cycles", columns=["selected", "accepted"])
    metrics = json.loads((folder / "metrics.json").read_text())
    outputs = {r["request_id"]: r["output_ids"] for r in sorted(requests, key=lambda r: r["request_id"])}
    counters = {
        "n_requests": len(requests),
        "output_tokens": sum(r["n_output"] for r in requests),
        "cycles": cycles.num_rows,
        "h2d_transfers": sum(r["h2d_transfers"] for r in requests),  # prefill included
        "experts_executed": metrics.get("experts_executed"),  # absent in runs older than the counter
        "selected_nodes": sum(len(s) for s in cycles.column("selected").to_pylist()),
        "accepted": sum(cycles.column("accepted").to_pylist()),
    }
    return {"counters": counters, "outputs_sha256": sha256([[i, ids] for i, ids in outputs.items()]),
            "request_sha256": {str(i): sha256(ids) for i, ids in outputs.items()},
            **{k: metrics.get(k) for k in TPS_KEYS}, "timing_label": metrics.get("timing_label"),
            "virtual_clock": virtual(metrics), "outputs": outputs}


def collect(decode_root: str | os.PathLike) -> dict[str, dict]:
    """Job (its folder relative to ``decode_root``, e.g. ``toy/cpu-a100/gsm8k/specfit/slots12``) -> `job_record`, for
    every folder that holds a decode run's files (`specfit.planning.paths.RUN_FILES`)."""
    root = Path(decode_root)
    return {str(path.parent.relative_to(root)): job_record(path.parent) for path in sorted(root.rglob("metrics.json"))
            if all((path.parent / name).is_file() for name in RUN_FILES)}


def run_jobs(decode_root: str | os.PathLike) -> dict[str, dict]:
    """`collect`, refusing a folder without decode jobs."""
    jobs = collect(decode_root)
    if not jobs:
        raise SpecFitError(f"no decode jobs under {decode_root} (folders with {', '.join(RUN_FILES)}): run the "
                           "workflow first (snakemake --cores 1 reports/all), or give --decode")
    return jobs


def claim_verdicts(tables_json_path: str | os.PathLike) -> dict[str, str]:
    """``"{table id}:{row key}"`` -> the cell under "Verdict", for every claims table (``claims/{model}/{device}``) of a
    report's tables.json."""
    out = {}
    for t in read_tables(Path(tables_json_path)):
        if t["id"].startswith("claims/"):
            column = t["header"].index("Verdict")
            out.update({f"{t['id']}:{row['key']}": row["cells"][column] for row in t["rows"]})
    return out


def write_reference(decode_root, tables_json, out_path) -> dict:
    """Write the reference file of a run: its jobs (without per-request outputs), its claims' verdicts and what made
    it; atomically. Returns what it wrote."""
    jobs = {job: {k: v for k, v in record.items() if k != "outputs"} for job, record in run_jobs(decode_root).items()}
    reference = {"jobs": jobs, "verdicts": claim_verdicts(tables_json),
                 "made_with": {"cpu": cpu_name(), "commit": git_head()}}
    with atomic_path(out_path) as tmp:
        tmp.write_text(json.dumps(reference, sort_keys=True, indent=1) + "\n")
    return reference


def first_divergence(reference: dict, this: dict) -> dict | None:
    """Where two records of one job first differ in their outputs: the lowest request id whose output sha256 differs
    (or that one side lacks) and, where both records hold that request's output ids, the first token position that
    differs; None when every request's output is the same."""
    ref, ours = reference["request_sha256"], this["request_sha256"]
    differ = sorted(int(i) for i in ref.keys() | ours.keys() if ref.get(i) != ours.get(i))
    if not differ:
        return None
    first = differ[0]
    a, b = (r.get("outputs", {}).get(first) for r in (reference, this))
    position = None
    if a is not None and b is not None:
        position = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"request_id": first, "position": position, "requests": differ}


def compare_job(reference: dict, this: dict) -> dict:
    """One job of this run against the reference's: counters (those both sides hold), outputs, decode TPS."""
    both = [k for k in COUNTERS if reference["counters"].get(k) is not None and this["counters"].get(k) is not None]
    differ = [k for k in both if reference["counters"][k] != this["counters"][k]]
    ref_tps, tps = reference["tps_dec"], this["tps_dec"]
    rel = tps / ref_tps - 1 if ref_tps and tps is not None else None
    divergence = first_divergence(reference, this) if reference["outputs_sha256"] != this["outputs_sha256"] else None
    return {"counters_identical": not differ, "counters_differing": differ,
            "counter_changes": {k: this["counters"][k] - reference["counters"][k] for k in differ},  # this - ref
            "counters_not_compared": [k for k in COUNTERS if k not in both],
            "outputs_identical": reference["outputs_sha256"] == this["outputs_sha256"],
            "first_divergence": divergence, "tps_dec": tps, "tps_dec_reference": ref_tps, "tps_rel_diff": rel,
            "within_1pct": rel is not None and abs(rel) <= TOLERANCE,
            "virtual": reference["virtual_clock"] and this["virtual_clock"]}


def compare(reference: dict, jobs: dict[str, dict], verdicts: dict[str, str]) -> dict:
    """This run (`collect`, `claim_verdicts`) against a reference (`write_reference`'s file, read): per job
    `compare_job`, the jobs and claims either side lacks, the verdicts that changed (reference, this) and the
    summary against the goals."""
    ref_jobs, ref_verdicts = reference["jobs"], reference["verdicts"]
    per_job = {job: compare_job(ref_jobs[job], jobs[job]) for job in sorted(ref_jobs.keys() & jobs.keys())}
    goal_jobs = [c for c in per_job.values() if c["virtual"]]  # timed on a virtual clock
    same_outputs = [c for c in goal_jobs if c["outputs_identical"]]
    timed = [c for c in goal_jobs if c["tps_rel_diff"] is not None]
    claims = sorted(ref_verdicts.keys() & verdicts.keys())
    changed = {k: [ref_verdicts[k], verdicts[k]] for k in claims if ref_verdicts[k] != verdicts[k]}
    summary = {
        "jobs_compared": len(per_job),
        "jobs_virtual": len(goal_jobs),
        "outputs_identical": [sum(c["outputs_identical"] for c in per_job.values()), len(per_job)],
        "counters_identical": [sum(c["counters_identical"] for c in same_outputs), len(same_outputs)],
        "tps_within_1pct": [sum(c["within_1pct"] for c in goal_jobs), len(goal_jobs)],
        "largest_abs_tps_diff": max((abs(c["tps_rel_diff"]) for c in timed), default=None),
        "verdicts_identical": [len(claims) - len(changed), len(claims)],
    }
    return {"jobs": per_job, "jobs_missing": sorted(ref_jobs.keys() - jobs.keys()),
            "jobs_extra": sorted(jobs.keys() - ref_jobs.keys()), "verdicts_changed": changed,
            "verdicts_missing": sorted(ref_verdicts.keys() - verdicts.keys()),
            "verdicts_extra": sorted(verdicts.keys() - ref_verdicts.keys()), "summary": summary}


def goals(result: dict) -> dict[str, bool]:
    """The goals a reproduction meets, by what they ask."""
    s = result["summary"]
    return {"every counter identical where the outputs are": s["counters_identical"][0] == s["counters_identical"][1],
            "every TPS within 1%": s["tps_within_1pct"][0] == s["tps_within_1pct"][1],
            "every verdict identical": s["verdicts_identical"][0] == s["verdicts_identical"][1],
            "every job and claim on both sides": not any(result[k] for k in (
                "jobs_missing", "jobs_extra", "verdicts_missing", "verdicts_extra"))}


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def tps_text(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_result(result: dict, made_with: dict) -> None:
    width = max((len(job) for job in result["jobs"]), default=3)
    print(f"{'job':{width}s}  {'counters identical':34s}  {'outputs identical':36s}  {'TPS this':>9s}  "
          f"{'reference':>9s}  {'diff':>8s}")
    for job, c in result["jobs"].items():
        counters = yes(c["counters_identical"])
        if c["counters_differing"]:  # by how much this run's differ from the reference's
            changes = c["counter_changes"]
            counters += " (" + ", ".join(f"{k} {changes[k]:+d}" for k in c["counters_differing"]) + ")"
        outputs = yes(c["outputs_identical"])
        if (d := c["first_divergence"]) is not None:
            at = "" if d["position"] is None else f", token {d['position']}"
            outputs += f" (request {d['request_id']}{at}; {len(d['requests'])} differ)"
        rel = "-" if c["tps_rel_diff"] is None else f"{100 * c['tps_rel_diff']:+.2f}%"
        print(f"{job:{width}s}  {counters:34s}  {outputs:36s}  {tps_text(c['tps_dec']):>9s}  "
              f"{tps_text(c['tps_dec_reference']):>9s}  {rel:>8s}"
              + ("" if c["virtual"] else "  (wall clock: no goal)"))
    for key, what in (("jobs_missing", "jobs of the reference missing from this run"),
                      ("jobs_extra", "jobs of this run not in the reference"),
                      ("verdicts_missing", "claims of the reference missing from this run"),
                      ("verdicts_extra", "claims of this run not in the reference")):
        if result[key]:
            print(f"{what}: {', '.join(result[key])}")
    s = result["summary"]
    if result["verdicts_changed"]:
        for claim, (ref, this) in result["verdicts_changed"].items():
            print(f"verdict changed: {claim}: {ref} -> {this}")
    else:
        print(f"all {s['verdicts_identical'][1]} verdicts identical")
    largest = s["largest_abs_tps_diff"]
    counts = {"every counter identical where the outputs are": f"{s['counters_identical'][0]} / "
              f"{s['counters_identical'][1]} virtual-clock jobs with identical outputs",
              "every TPS within 1%": f"{s['tps_within_1pct'][0]} / {s['tps_within_1pct'][1]} virtual-clock jobs, "
              f"largest "
              f"|difference| {'-' if largest is None else f'{100 * largest:.2f}%'}",
              "every verdict identical": f"{s['verdicts_identical'][0]} / {s['verdicts_identical'][1]} claims",
              "every job and claim on both sides": f"{s['jobs_compared']} jobs compared"}
    # not a goal: decode stages run MKL's own kernels for the CPU (`specfit.numerics.for_timing`), and another CPU may
    # round a near tie between two tokens the other way
    print(f"outputs identical: {s['outputs_identical'][0]} / {s['outputs_identical'][1]} jobs")
    print(f"goals ({s['jobs_compared']} jobs compared, {s['jobs_virtual']} of them on a virtual clock):")
    for goal, met in goals(result).items():
        print(f"  {goal}: {yes(met)} ({counts[goal]})")
    print(f"reference made on: {made_with.get('cpu')} (commit {made_with.get('commit')}); this machine: {cpu_name()}")


def main(argv=None) -> None:
    parser = bench.parser(__name__, __doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=Path(REFERENCE), help="the reference file")
    parser.add_argument("--decode", type=Path, default=Path(DECODE), help="the run's data/decode")
    parser.add_argument("--tables", type=Path, default=Path(REPORT) / "tables.json", help="the run's report tables")
    parser.add_argument("--write", action="store_true", help="write the reference from this run instead")
    args = parser.parse_args(argv)
    try:
        if args.write:
            written = write_reference(args.decode, args.tables, args.reference)
            print(f"wrote {args.reference}: {len(written['jobs'])} decode jobs of {args.decode}, "
                  f"{len(written['verdicts'])} claims of {args.tables}")
            return
        if not args.reference.is_file():
            raise SystemExit(f"no reference at {args.reference}: give --reference, or make one from a run with "
                             "`python -m specfit.bench reproduce --write`")
        reference = json.loads(args.reference.read_text())
        result = compare(reference, run_jobs(args.decode), claim_verdicts(args.tables))
    except SpecFitError as e:
        raise SystemExit(str(e)) from None
    print_result(result, reference["made_with"])
    if not all(goals(result).values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
