"""Stage decode: one method's timed request stream on the offloaded target (paper Section 4, Appendix B).

The stream itself, its spec, inputs and outputs: `specfit.speculative.stream`; its loading and warm-up:
`specfit.speculative.loading`; its metrics: `specfit.results.summary` (over `specfit.results.metrics`).
"""

from __future__ import annotations

from specfit.planning.stage import stage_main
from specfit.speculative.stream import StreamSpec, run_stream


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    run_stream(StreamSpec.from_dict(spec), inputs, outputs)


main = stage_main(run)

if __name__ == "__main__":
    main()
