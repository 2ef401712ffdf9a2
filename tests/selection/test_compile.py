"""The selector's numba kernels are compiled before a stream times anything: `compile_kernels` reaches every
specialization a selection runs, so no selection compiles (seconds on a fresh checkout) inside a timed cycle."""

import numpy as np

from specfit.selection import Pool
from specfit.selection.pool import _encode_resident, _encode_routes, _parents_precede
from specfit.selection.search import RATIO, RATIO_CA, _popcount, _search_words, compile_kernels, search

KERNELS = (_encode_resident, _encode_routes, _parents_precede, _popcount, _search_words)


def test_every_specialization_a_selection_runs_is_compiled_beforehand():
    compile_kernels()
    compiled = {k.py_func.__name__: len(k.signatures) for k in KERNELS}
    rng = np.random.default_rng(0)
    # an atlas's routes: read-only and strided, as a view of a table read from Parquet
    routes = rng.integers(0, 16, (9, 4, 4))[:, :, ::2].copy()
    atlas = np.repeat(routes, 2, axis=2)[:, :, ::2]
    atlas.flags.writeable = False
    parent, prob = np.array([-1, 0, 0, 1, 1, 2, 2, 3, 3]), np.linspace(1.0, 0.1, 9)
    resident = rng.random((4, 16)) < 0.5
    in_flight = np.where(resident, rng.random((4, 16)), 0.0)
    b = np.linspace(1.0, 2.0, 9)
    for r in (routes, atlas):
        for pool, objective in ((Pool(parent, prob, r, 16), RATIO), (Pool(parent, prob, r, 16, resident), RATIO_CA),
                                (Pool(parent, prob, r, 16, resident, in_flight), RATIO_CA)):
            nodes, *_ = search(pool, 7, objective, b, 0.3, beta_hit=0.05)
            assert nodes and nodes == tuple(sorted(nodes))
    assert {k.py_func.__name__: len(k.signatures) for k in KERNELS} == compiled
