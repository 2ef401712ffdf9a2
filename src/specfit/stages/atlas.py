"""Stage atlas: the route atlas of one SpecFit variant's trajectory (Section 3.3, route information).

SpecFit's decode stream with live routes: every cycle drafts the full pool, the target is queried once for the
routes of root + pool (outside the request timer), and the variant's adaptive rule is replayed on V<=1..V<=5
with those routes (degraded first for the noisy variant, whose trajectory differs). Each cycle leaves one atlas
row (schema `specfit.results.records.ATLAS_SCHEMA`); measured runs read them back with
`specfit.speculative.routes.AtlasRoutes`, node by node by content. The build runs with the spec's slots (the rule
gives the device's with-cache slot count: an atlas must be buildable on the device whose runs read it, and
making all 48 x 128 experts of Qwen3-30B-A3B resident takes 54 GiB) and no link: it is off the measured cache.
Routes come from the target's own routers whatever the cache holds.

Inputs and spec are the decode stage's for a specfit method; outputs are ``atlas`` and the build's own
``requests``, ``cycles`` and ``metrics`` (diagnostics: its timings include the route queries' copies).
"""

from __future__ import annotations

import dataclasses

from specfit.errors import SpecFitError
from specfit.planning.stage import stage_main
from specfit.speculative.kinds import kind, routed
from specfit.speculative.stream import StreamSpec, run_stream


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    spec = StreamSpec.from_dict(spec)
    method = spec.method
    if not kind(method.name).reads_routes:
        raise SpecFitError(f"an atlas is built for a method that reads routes ({', '.join(routed())}), "
                           f"not {method.name!r}")
    if method.route_source.live:
        raise SpecFitError(f"an atlas is built for the routes a measured run reads, not {method.routes!r}")
    build = dataclasses.replace(method, routes=method.route_source.built_by.name)
    run_stream(dataclasses.replace(spec, method=build, link=None), inputs, outputs)


main = stage_main(run)

if __name__ == "__main__":
    main()
