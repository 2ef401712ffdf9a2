"""The report: one HTML page (Jinja2 + matplotlib) and a Markdown twin with the same tables, per model and device, then
per model across its devices: the sections `specfit.report.sections` lists, from the files the report stage reads
(`specfit.report.inputs`), with their figures (`specfit.report.figures`: throughput per method, the claims against
the line at 1, the slot sweep, the calibration probes), which both pages embed. Timings over an emulated link say so;
a missing input empties its section with a note, a malformed one is an error; every decode TPS and ratio carries its
bootstrap interval (`specfit.results.intervals`)."""

import logging
from pathlib import Path

from specfit.report.figures import Figures
from specfit.report.inputs import load_inputs
from specfit.report.page import EMULATED, Part, Section, interval_note
from specfit.report.render import provenance, render
from specfit.report.scope import ModelScope
from specfit.report.sections import ACROSS_DEVICES, PER_DEVICE

log = logging.getLogger("specfit.report")


def to_show(sections, scope) -> list[Section]:
    """The listed sections that have something to show for ``scope``, each missing input named once."""
    out = [sec for section in sections if (sec := section(scope)) is not None]
    for sec in out:
        sec.missing = list(dict.fromkeys(sec.missing))
    return out


def parts(model_scope: ModelScope) -> list[Part]:
    """One model's parts of the page: one per device, then one across devices and against the paper."""
    out = []
    for d, scope in model_scope.on.items():
        notes = [f"Main slot count (with-cache runs and fit): {scope.main} per layer."]
        if scope.link_emulated:
            label = next(scope.inputs.metrics[r]["timing_label"] for r in scope.runs if r in scope.inputs.metrics)
            notes.append(f"Timings on this device (tagged “{EMULATED}”): {label}.")
        out.append(Part(f"{model_scope.model} on {d}: {model_scope.spec['devices'][d].get('label') or d}", notes,
                        to_show(PER_DEVICE, scope)))
    out.append(Part(f"{model_scope.model}: across devices and against the paper", [], to_show(ACROSS_DEVICES,
                                                                                              model_scope)))
    return out


def write(spec: dict, inputs: dict, folder: Path) -> list[Part]:
    """The page into ``folder``, its figures in a folder beside it; returns its parts (tests look tables up in them)."""
    data = load_inputs(spec, inputs)
    log.info("%d of %d decode runs have metrics", len(data.metrics), len(data.runs))
    figures = Figures(folder / "figures")
    page = [part for model in spec["models"] if any(r.model == model for r in data.runs)
            for part in parts(ModelScope(data, figures, model))]
    render({"title": "SpecFit reproduction report", "provenance": provenance(spec, data.toy, data.shipped),
            "parts": page, "emulated": EMULATED, "intervals": interval_note(data.seed)}, folder)
    return page
