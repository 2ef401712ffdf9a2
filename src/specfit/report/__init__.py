"""Stage 7, the report: one HTML page (Jinja2 + matplotlib) and a Markdown twin with the same tables.

Per model and device: decode throughput with and without the expert cache (Figures 2-3), the counters
(Tables 2-3), the cache-size sweep (Figure 4), the theory on recorded pools (Table 5), the calibration fit
(Appendix B), the selection cost and route-noise sensitivity (section 4.6) and the lossless check; per model,
the devices side by side (Table 4) and the paper's headline figures beside this run's. Every timing taken
over an emulated link says so. A missing input empties its section with a note; a malformed one is an error.

The paper's figures sit beside the workload that stands for the paper's on each device: a workload's config key
``paper`` (gsm8k-odd, the RTX 4090's 40 odd-numbered questions, stands for gsm8k), else its own name when it is
one of the paper's (`specfit.report.paper.stand_ins`).

Every decode TPS carries its 95% percentile-bootstrap interval over the run's requests (requests.parquet beside
metrics.json), and every ratio of two runs' TPS a paired bootstrap interval over request ids
(`specfit.intervals`); a ratio whose interval holds 1 reads "tie", never a win.

It reads exactly the files its rule declares (`specfit.report.inputs.Declared`): a file it expects that the rule
does not declare, or that is not on disk, is missing. Paths are relative to the working directory, the workflow
root, which also gives the git commit in the provenance.

spec: the config slice it shows (workloads, models, devices, methods, runs, seed)
inputs: metrics, requests (each decode run's metrics.json and requests.parquet), calibration, points (each fit's
        JSON and probe points), theory (each Table 5 pool's JSON): lists, one --in flag per file
outputs: report (a folder)

Modules: `inputs` (what the report reads, `Inputs` with the intervals), `sections` (per model and device, per
model), `paper` (the paper's roles, figures and the section beside this run), `beyond` (specfit-ca, beyond the
paper, per cell against issue 12's goal, after the throughput section), `render` (figures, provenance,
Jinja2), `page` (tables, sections and how a cell prints).
"""

from __future__ import annotations

import logging

import matplotlib

matplotlib.use("Agg")  # before any submodule imports pyplot

from specfit.io import atomic_path  # noqa: E402
from specfit.report.inputs import load_inputs  # noqa: E402
from specfit.report.page import EMULATED, interval_note  # noqa: E402
from specfit.report.render import Figures, provenance, render  # noqa: E402
from specfit.report.sections import ModelView  # noqa: E402
from specfit.stage import stage_main  # noqa: E402

log = logging.getLogger("specfit.report")


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    data = load_inputs(spec, inputs)
    log.info("%d of %d decode runs have metrics", len(data.metrics), len(data.runs))
    with atomic_path(outputs["report"], directory=True) as folder:
        figures = Figures(folder / "figures")
        parts = [part for model in spec["models"] if any(r.model == model for r in data.runs)
                 for part in ModelView(data, figures, model).parts()]
        render({"title": "SpecFit reproduction report", "provenance": provenance(spec), "parts": parts,
                "emulated": EMULATED, "intervals": interval_note(data.seed)}, folder)


main = stage_main(run)
