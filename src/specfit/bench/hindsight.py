"""``python -m specfit.bench hindsight``: how far better commit probabilities could take specfit-online against the
tree a user tunes by hand.

specfit-online calibrates the drafter's probabilities online, from the verifications its stream has seen so far
(`specfit.selection.calibration`). This asks what it would do with the best such calibration there is: for each
cell of the config's matrix with a finished run of kind eagle3-tuned and one of kind specfit-online, it

1. decodes the cell's evaluated prompts with EAGLE-3 verifying its whole pool (specfit-online's depth and width),
   so that every drafted node whose parent is committed is a trial, and counts them as the online calibration does
   (`OnlineCalibration.observe`): the target's acceptance by draft level and bin of the drafter's conditional q
   (once per model, workload and pool: acceptance depends on neither the device nor the cache), and prints it;
2. decodes them again with specfit-online, its calibration starting from those counts: commit probabilities learned
   in hindsight from the very questions it decodes. Not a deployable method (it reads outcomes of evaluated
   questions), but an upper proxy of what calibrating the drafter's confidence can give the selection; the
   output stays AR's, as the calibration changes only which nodes are verified.

It prints both specfit-online runs against the tuned tree with the paired-bootstrap interval
(`specfit.results.intervals.ratio_interval`), and where the time went. It decodes now, on this machine: host
time counts on the virtual clock, so run it on a quiet machine.

    python -m specfit.bench hindsight --configfile config.resident.yaml
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from specfit.bench.tuned import TIME_HEADER, finished, matrix_cells, ratio_text, time_columns
from specfit.errors import SpecFitError
from specfit.io import read_json
from specfit.planning import specs
from specfit.planning.matrix import DecodeRun, decode_inputs, method_config, method_kind
from specfit.results.intervals import process_spread, ratio_interval
from specfit.selection.calibration import EDGES, OnlineCalibration
from specfit.speculative.config import MethodConfig
from specfit.speculative.kinds import EAGLE3, EAGLE3_TUNED, SPECFIT_ONLINE
from specfit.speculative.stream import StreamSpec, run_stream

SHOWN_LEVELS = 3  # acceptance is printed for draft levels 1..3


def whole_pool(method: MethodConfig) -> MethodConfig:
    """EAGLE-3 at ``method``'s pool, verifying all of it: w nodes at level 1 and w² at each level after."""
    w, d = method.top_k_expand, method.max_depth
    return MethodConfig(name=EAGLE3.name, max_depth=d, top_k_expand=w, k_max=w + (d - 1) * w * w)


def decode(spec: dict, inputs: dict, folder: Path, prepare=None) -> tuple[dict, list[dict], list[dict]]:
    """One decode stream into ``folder``: its metrics, requests and cycles."""
    out = {name: folder / f"{name}.{ext}" for name, ext in
           (("requests", "parquet"), ("cycles", "parquet"), ("metrics", "json"))}
    run_stream(StreamSpec.from_dict(spec), inputs, out, prepare)
    return (read_json(out["metrics"]), pq.read_table(out["requests"]).to_pylist(),
            pq.read_table(out["cycles"]).to_pylist())


def acceptance(config: dict, run: DecodeRun, folder: Path) -> dict[str, np.ndarray]:
    """The counts of step 1 for ``run``'s model, workload and pool (`OnlineCalibration.counts`)."""
    method = method_config(config, run.method)
    spec = specs.decode(config, run.model, run.device, run.workload, run.method, run.slots)
    spec["method"] = vars(whole_pool(method))
    inputs = {k: v for k, v in decode_inputs(config, run).items() if k in ("prompts", "target", "drafter")}
    return counts_of(decode(spec, inputs, folder)[2], method.max_depth)


def counts_of(cycles: list[dict], max_depth: int) -> dict[str, np.ndarray]:
    """What an online calibration of ``max_depth`` levels learns from the recorded ``cycles``, in their order."""
    calibration = OnlineCalibration(max_depth)
    for c in cycles:
        if c["selected"]:
            calibration.observe(c["pool_parent"], c["pool_prob"], c["pool_level"], c["selected"], c["accepted_path"])
    return calibration.counts()


def start_calibration(counts: dict[str, np.ndarray]):
    """A ``prepare`` of `run_stream`: the loaded method's online calibration starts from ``counts``."""

    def prepare(loaded):
        calibration = getattr(loaded.method, "calibration", None)
        if calibration is None:
            raise SpecFitError(f"method {loaded.method.name}: no online calibration to start (calibration: online)")
        loaded.method.calibration = OnlineCalibration(calibration.max_depth, calibration.prior, start=counts)

    return prepare


def acceptance_lines(counts: dict[str, np.ndarray]) -> list[str]:
    """Acceptance per level and q bin: taken / trials, for the bins that had trials."""
    lines = []
    for level in range(1, min(SHOWN_LEVELS, len(counts["trials"]) - 1) + 1):
        cells = [f"[{EDGES[b]:.2f}: {int(counts['accepted'][level, b])}/{int(n)}]"
                 for b, n in enumerate(counts["trials"][level]) if n]
        taken = counts["accepted"][level].sum() / max(counts["trials"][level].sum(), 1)
        lines.append(f"  level {level} ({taken:.2f} taken): " + " ".join(cells))
    return lines


def hindsight_run(config: dict, run: DecodeRun, counts: dict[str, np.ndarray], folder: Path):
    """Step 2: ``run`` again, its online calibration starting from ``counts``."""
    spec = specs.decode(config, run.model, run.device, run.workload, run.method, run.slots)
    return decode(spec, decode_inputs(config, run), folder, start_calibration(counts))


def versus(metrics: dict, requests: list[dict], tuned: tuple[dict, list[dict]]) -> dict:
    """A run against the tuned tree: the paired ratio with its interval and verdict."""
    return ratio_interval(requests, tuned[1], spread=process_spread(metrics, tuned[0]))


def row(name: str, metrics: dict, ratio: dict | None) -> str:
    tps = f"{metrics['tps_dec']:.2f} [{metrics['tps_dec_low']:.2f}, {metrics['tps_dec_high']:.2f}]"
    return f"{name:<44}{tps:<26}{'-' if ratio is None else ratio_text(ratio):<32}" + time_columns(metrics)


def main(argv: list[str] | None = None) -> None:
    config, matrix = matrix_cells(__name__, __doc__, argv)
    cells = {cell: {(method_kind(config, r.method).name, r.method): r for r in runs} for cell, runs in matrix.items()}
    counted: dict[tuple, dict[str, np.ndarray]] = {}
    verdicts = defaultdict(int)
    with tempfile.TemporaryDirectory(prefix="hindsight-") as tmp:
        for (model, device, workload, slots), runs in sorted(cells.items()):
            tuned = next((finished(r) for (k, _), r in runs.items() if k == EAGLE3_TUNED.name), None)
            online = [(r, done) for (k, _), r in sorted(runs.items()) if k == SPECFIT_ONLINE.name
                      and (done := finished(r))]
            if tuned is None or not online:
                continue
            for run, as_run in online:
                method = method_config(config, run.method)
                key = (model, workload, method.max_depth, method.top_k_expand)
                if key not in counted:
                    counted[key] = acceptance(config, run, Path(tempfile.mkdtemp(dir=tmp)))
                    print(f"\n{model}, {workload}: the target's acceptance of drafted nodes whose parent it committed, "
                          f"by draft level and bin of the drafter's conditional q ([q from: taken/trials]; EAGLE-3 "
                          f"verifying its whole depth {method.max_depth}, width {method.top_k_expand} pool)")
                    print("\n".join(acceptance_lines(counted[key])))
                print(f"\n{model} on {device}, {workload}, {slots} slots ({tuned[0].get('timing_label', '')})")
                print(f"{'method':<44}{'TPS_dec [95%]':<26}{'/ tuned tree':<32}" + TIME_HEADER)
                print(row("eagle3-tuned", tuned[0], None))
                print(row(f"{run.method} (as run)", as_run[0], versus(*as_run, tuned)))
                metrics, requests, _ = hindsight_run(config, run, counted[key], Path(tempfile.mkdtemp(dir=tmp)))
                ratio = versus(metrics, requests, tuned)
                print(row(f"{run.method}, calibrated in hindsight", metrics, ratio))
                verdicts[ratio["verdict"]] += 1
    if not verdicts:
        raise SpecFitError("no finished cell holds runs of kinds eagle3-tuned and specfit-online: add them to the "
                           "config's runs and run `snakemake --cores 1 reports/all` (with the same --configfile) first")
    tally = ", ".join(f"{verdicts[v]} {v}" for v in ("faster", "tie", "slower"))
    print(f"\ncalibrated in hindsight, against the tuned tree: {tally} of {sum(verdicts.values())} cells")


if __name__ == "__main__":
    main()
