"""``python -m specfit.bench NAME [args]``: run one benchmark and print its figures."""

import importlib
import sys

from specfit import numerics
from specfit.errors import SpecFitError

BENCHMARKS = ("dag", "decode", "device", "engine", "exact", "hindsight", "host", "link", "predictor", "proportions",
              "reproduce", "sampling", "select", "spread", "tuned", "verdicts")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHMARKS:
        sys.exit(f"usage: python -m specfit.bench {{{','.join(BENCHMARKS)}}} [options]")
    numerics.for_timing()  # timed as the decode stages time (specfit.planning.stage.stage_main)
    try:
        importlib.import_module(f"specfit.bench.{argv[0]}").main(argv[1:])
    except SpecFitError as err:  # bad input (a missing log, a run not made yet): one line, as `specfit generate`
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
