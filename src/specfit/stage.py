"""The command line every workflow rule calls: ``python -m specfit.<stage> --spec JSON --in k=path --out k=path``.

Each stage module has ``run(spec, inputs, outputs)`` and ``main = stage_main(run)``. ``spec`` is the rule's
slice of the config (a dict), ``inputs`` and ``outputs`` map the rule's named files to paths.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Callable

Run = Callable[[dict, dict, dict], None]


class SpecFitError(Exception):
    """A user-facing error: bad input, a missing file, a model that does not fit. Printed without a traceback."""


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag} expects name=path, got {item!r}")
        out[key] = value
    return out


def stage_main(run: Run) -> Callable[[list[str] | None], None]:
    def main(argv: list[str] | None = None) -> None:
        parser = argparse.ArgumentParser(description=(run.__module__ or "").strip())
        parser.add_argument("--spec", default="{}", help="the rule's config slice, as JSON")
        parser.add_argument("--in", dest="inputs", action="append", metavar="NAME=PATH")
        parser.add_argument("--out", dest="outputs", action="append", metavar="NAME=PATH")
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        try:
            run(json.loads(args.spec), _pairs(args.inputs, "--in"), _pairs(args.outputs, "--out"))
        except SpecFitError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    return main
