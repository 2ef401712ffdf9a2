"""Atlas stage: the route atlas of one SpecFit variant's trajectory (Section 3.3, route information).

SpecFit's decode stream with live routes: every cycle drafts the full pool, the target is queried once for the
routes of root + pool (outside the request timer), and the variant's adaptive rule is replayed on V<=1..V<=5
with those routes (degraded first for the noisy variant, whose trajectory differs). Each cycle leaves one atlas
row (schema `specfit.records.ATLAS_SCHEMA`); measured runs read them back with
`specfit.speculative.routes.AtlasRoutes` and check every cycle against them. The build runs with every expert
resident and no link: it is off the measured cache.

Inputs and spec are the decode stage's for a specfit method; outputs are ``atlas`` and the build's own
``requests``, ``cycles`` and ``metrics`` (diagnostics: its timings include the route queries' copies).
"""

from __future__ import annotations

import dataclasses

from specfit.errors import SpecFitError
from specfit.speculative.stream import StreamSpec, run_stream
from specfit.stage import stage_main

ALL_RESIDENT = 1 << 30  # slots >= num_experts: the cache never evicts


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    spec = StreamSpec.from_dict(spec)
    method = spec.method
    if method.name != "specfit":
        raise SpecFitError(f"an atlas is built for a specfit method, not {method.name!r}")
    if method.route_source.live:
        raise SpecFitError(f"an atlas is built for the routes a measured run reads, not {method.routes!r}")
    build = dataclasses.replace(method, routes=method.route_source.built_by.name)
    run_stream(dataclasses.replace(spec, method=build, slots=ALL_RESIDENT, link=None), inputs, outputs)


main = stage_main(run)

if __name__ == "__main__":
    main()
