"""`python -m specfit.bench select`: the plain-Python reference agrees with the cache-aware selector, and the
benchmark runs end to end on a couple of pools."""

import numpy as np

from specfit.bench import select as bench
from specfit.selection import Pool, select_specfit_ca


def test_reference_selects_what_the_kernel_selects():
    rng = np.random.default_rng(3)
    for _ in range(5):
        parent, prob, routes = bench.paper_pool(rng, depth=4, layers=6, experts=16, top_k=2)
        resident = bench.random_residency(rng, layers=6, experts=16, slots=6)
        for beta_hit in (0.0, 0.02):
            b = np.array([1.0, 1.05, 1.1, 1.12, 1.2, 1.25, 1.3, 1.33])
            sel = select_specfit_ca(Pool(parent, prob, routes, 16, resident), b, 0.1, beta_hit)
            assert bench.reference_ca(parent, prob, routes, resident, b, 0.1, beta_hit) == (
                sel.nodes, sel.reward, sel.union, sel.misses, sel.time
            )


def test_benchmark_runs(capsys):
    bench.main(["--pools", "2", "--repeats", "2", "--reference-repeats", "1"])
    out = capsys.readouterr().out
    assert "same subtree and figures on all 2 pools" in out
    assert "speedup, reference" in out
