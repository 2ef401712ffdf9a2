"""The complete spec of a toy stage outside the workflow (tests, benchmarks), as the workflow's rules pass it: the
rules' own builder (`specfit.planning.specs.toy`) over config.yaml with the schema's defaults and any overrides.

Its own module, which no stage imports: it reads the config schema through ``specfit.planning``, and a stage that
imported it would have the workflow's code in its code hash (a retrained toy on every edit there).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from specfit.errors import SpecFitError
from specfit.planning import specs
from specfit.planning.config import validate_config

PARTS = ("tokenizer", "target", "drafter")
ROOT = Path(__file__).resolve().parents[3]  # the workflow checkout (this file is src/specfit/toy/spec.py)
CONFIG = ROOT / "config.yaml"
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


def toy_spec(part: str, config: dict | None = None, **overrides) -> dict:
    """The spec the workflow's ``toy_<part>`` rule passes its stage (`specfit.planning.specs.toy`):
    ``config["toy"][part]`` with the schema's defaults filled in, the config's ``seed`` and ``train_threads`` (as
    ``threads``), and ``exclude_question_ids`` (every id a workload evaluates or calibration probes,
    `specfit.planning.matrix.evaluated_question_ids`).

    ``config`` is a workflow config (left unchanged); by default the shipped config.yaml without its ``toy``
    section, so every toy key takes the schema's default. ``overrides`` set keys of ``toy.<part>`` (and ``seed``,
    ``threads``) before validation, so a misspelt or mistyped one is an error here as in the config.
    """
    if part not in PARTS:
        raise SpecFitError(f"no toy part {part!r}: the toy's parts are {', '.join(PARTS)}")
    if not SCHEMA.is_file() or (config is None and not CONFIG.is_file()):
        raise SpecFitError(f"toy_spec reads {SCHEMA} and {CONFIG}: run it from the workflow's checkout")
    if config is None:
        config = yaml.safe_load(CONFIG.read_text())
        config.pop("toy", None)
    config = copy.deepcopy(config)
    for key, top in (("seed", "seed"), ("threads", "train_threads")):
        if key in overrides:
            config[top] = overrides.pop(key)
    config.setdefault("toy", {}).setdefault(part, {}).update(overrides)
    validate_config(config, SCHEMA, ROOT)
    return specs.toy(config, part)
