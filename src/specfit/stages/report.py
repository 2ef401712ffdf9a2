"""Stage report: one HTML page (Jinja2 + matplotlib) and a Markdown twin with the same tables, per model and
device, then per model across its devices: the sections `specfit.report.sections` lists, from the files the rule
declares (`specfit.report.inputs`). Timings over an emulated link say so; a missing input empties its section with a
note, a malformed one is an error; every decode TPS and ratio carries its bootstrap interval
(`specfit.results.intervals`).

spec: the config slice it shows (workloads, models, devices, methods, runs, seed)
inputs: metrics, requests, calibration, points, theory, predictor, models (the toy's folders): lists, one
    --in flag per file
outputs: report (a folder)
"""

from __future__ import annotations

from specfit.io import atomic_path
from specfit.planning.stage import stage_main
from specfit.report import write


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    with atomic_path(outputs["report"], directory=True) as folder:
        write(spec, inputs, folder)


main = stage_main(run)

if __name__ == "__main__":
    main()
