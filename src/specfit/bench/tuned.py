"""``python -m specfit.bench tuned``: every method of a finished run against EAGLE-3 at the tree a user tunes by hand.

For each cell of the config's decode matrix (model, device, workload, slots) that holds a run of kind eagle3-tuned,
it prints every method's decode TPS with its interval, its ratio to the tuned tree, to the best baseline of the
cell (the fastest of AR, EAGLE-3, EAGLE-3 tuned and the paper's SpecFit) and to EAGLE-3 at the paper's tree (where
the cell runs it), each with its paired-bootstrap interval
and verdict (`specfit.results.intervals.ratio_interval`: a ratio whose interval holds 1 is a tie), and where the time
went: committed tokens, verified draft nodes and drafted levels per cycle, and host selection time per cycle. It
reads the decode outputs (requests.parquet, metrics.json) and measures nothing; it times nothing.

    python -m specfit.bench tuned --configfile config.selection.yaml
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from specfit import bench
from specfit.errors import SpecFitError
from specfit.io import read_json
from specfit.planning.config import SCHEMA, add_configfile_option, load_config
from specfit.planning.matrix import decode_runs, method_kind
from specfit.report.scope import Roles
from specfit.results.intervals import process_spread, ratio_interval
from specfit.speculative.kinds import EAGLE3, EAGLE3_TUNED


def ratio_text(r: dict) -> str:
    return f"{r['value']:.3f}× [{r['low']:.3f}, {r['high']:.3f}] {r['verdict']}"


def finished(run) -> tuple[dict, list[dict]] | None:
    """A decode run's metrics and requests, None where it has not finished."""
    if not Path(run.file("metrics.json")).is_file():
        return None
    return read_json(run.file("metrics.json")), pq.read_table(run.file("requests.parquet")).to_pylist()


def cell_rows(config: dict, runs: list) -> list[str]:
    """The lines of one cell: a row per method, in config order."""
    found = {run.method: done for run in runs if (done := finished(run))}
    tuned = [m for m in found if method_kind(config, m).name == EAGLE3_TUNED.name]
    if not tuned:
        return []
    base = [m for m in found if m in Roles.of(config).baselines]  # the best of them is the bar
    best = max(base, key=lambda m: found[m][0]["tps_dec"])
    eagle3 = next((m for m in found if method_kind(config, m).name == EAGLE3.name), None)  # the paper's tree
    lines = [f"{'method':<24}{'kind':<16}{'TPS_dec [95%]':<26}{'/ tuned tree':<32}{f'/ best baseline ({best})':<40}"
             + f"{f'/ {eagle3} (paper tree)' if eagle3 else '':<32}" + TIME_HEADER]
    for method in sorted(found, key=list(config["methods"]).index):
        metrics, requests = found[method]
        cells = []
        for other in (tuned[0], best, eagle3):
            if other == method or other is None:
                cells.append("-" if other else "")
                continue
            spread = process_spread(metrics, found[other][0])
            cells.append(ratio_text(ratio_interval(requests, found[other][1], spread=spread)))
        tps = f"{metrics['tps_dec']:.2f} [{metrics['tps_dec_low']:.2f}, {metrics['tps_dec_high']:.2f}]"
        lines.append(f"{method:<24}{method_kind(config, method).name:<16}{tps:<26}{cells[0]:<32}{cells[1]:<40}"
                     + f"{cells[2]:<32}" + time_columns(metrics))
    return lines


TIME_HEADER = f"{'commit/cyc':>11}{'verified/cyc':>13}{'levels/cyc':>11}{'select ms/cyc':>14}"


def time_columns(metrics: dict) -> str:
    """Where a run's time went (`TIME_HEADER`): committed tokens, verified draft nodes, drafted levels and host
    selection ms per cycle."""
    return (f"{metrics['committed_per_cycle']:>11.2f}{metrics.get('draft_nodes_per_cycle', 0.0):>13.2f}"
            f"{metrics.get('drafted_levels_per_cycle', 0.0):>11.2f}{metrics.get('select_ms_per_cycle', 0.0):>14.2f}")


def matrix_cells(module: str, doc: str, argv: list[str] | None) -> tuple[dict, dict[tuple, list]]:
    """A benchmark's config (``--configfile``, over config.yaml) and its decode runs by cell: (model, device,
    workload, slots) -> runs."""
    parser = bench.parser(module, doc.split("\n\n")[0])
    add_configfile_option(parser)
    args = parser.parse_args(argv)
    config = load_config("config.yaml", SCHEMA, *(args.configfile or []))
    cells = defaultdict(list)
    for run in decode_runs(config):
        cells[run.model, run.device, run.workload, run.slots].append(run)
    return config, cells


def main(argv: list[str] | None = None) -> None:
    config, cells = matrix_cells(__name__, __doc__, argv)
    shown = 0
    for (model, device, workload, slots), runs in sorted(cells.items()):
        lines = cell_rows(config, runs)
        if not lines:
            continue
        shown += 1
        label = read_json(runs[0].file("metrics.json")).get("timing_label", "") if Path(
            runs[0].file("metrics.json")).is_file() else ""
        print(f"\n{model} on {device}, {workload}, {slots} slots ({label})")
        print("\n".join(lines))
    if not shown:
        raise SpecFitError("no finished cell holds a run of kind eagle3-tuned: add one to the config's runs and run "
                           "`snakemake --cores 1 reports/all` (with the same --configfile) first")


if __name__ == "__main__":
    main()
