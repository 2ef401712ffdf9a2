"""A stage's command line: ``python -m specfit.stages.<name> --spec JSON --in k=path --out k=path``, which every rule
reaches through ``python -m specfit.launch <name> ...`` (`specfit.launch`).

Each stage module has ``run(spec, inputs, outputs)`` and ``main = stage_main(run)``. ``spec`` is the rule's
slice of the config (a dict), ``inputs`` and ``outputs`` map the rule's named files to paths; a name given more
than once (a rule's list input) maps to a list of paths (`paths_of`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable

from specfit import numerics
from specfit.errors import SpecFitError

Run = Callable[[dict, dict, dict], None]


def _pairs(items: list[str] | None, flag: str) -> dict[str, str | list[str]]:
    """name=path pairs; a name given more than once maps to the list of its paths, in order."""
    out: dict[str, str | list[str]] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag} expects name=path, got {item!r}")
        if key in out:
            out[key] = [*([out[key]] if isinstance(out[key], str) else out[key]), value]
        else:
            out[key] = value
    return out


def paths_of(files: dict, name: str) -> list[str]:
    """The paths given for ``name`` as a list: none, one or many (a rule's list input)."""
    value = files.get(name, [])
    return [value] if isinstance(value, str) else list(value)


def stage_main(run: Run, trains: bool = False) -> Callable[[list[str] | None], None]:
    """The stage's command line. ``trains``: the stage trains weights (the toy, the route predictor) and keeps the
    training arithmetic `specfit.numerics` pins; every other stage times or evaluates with `numerics.for_timing`."""

    def main(argv: list[str] | None = None) -> None:
        parser = argparse.ArgumentParser(description=(run.__module__ or "").strip())
        parser.add_argument("--spec", default="{}", help="the rule's config slice, as JSON")
        parser.add_argument("--in", dest="inputs", action="append", metavar="NAME=PATH")
        parser.add_argument("--out", dest="outputs", action="append", metavar="NAME=PATH")
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        if not trains:
            numerics.for_timing()
        try:
            run(json.loads(args.spec), _pairs(args.inputs, "--in"), _pairs(args.outputs, "--out"))
        except SpecFitError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    main.trains = trains  # the stage launcher (`specfit.launch`) runs a training stage in a process of its own
    return main
