import numpy as np

from specfit.spec.cycle import Cycle, Stopwatch
from specfit.spec.pool import CandidatePool
from specfit.spec.routes import NoisyRoutes

L, K, N = 4, 3, 16


class Fixed:
    full_pool = False

    def __init__(self, routes):
        self.value = routes

    def routes(self, cycle, pool):
        return self.value[: pool.n + 1]


def fixture(n=6, seed=0):
    rng = np.random.default_rng(seed)
    routes = np.stack([[rng.permutation(N)[:K] for _ in range(L)] for _ in range(n + 1)])  # [n+1, L, K]
    pool = CandidatePool.root_only(1)
    for v in range(n):
        pool.add(v // 2, v, 0.5)
    return Fixed(routes), pool, Cycle(request_id=3, index=5, prefix_len=10, target=None, clock=Stopwatch())


def test_full_accuracy_keeps_the_routes():
    base, pool, cycle = fixture()
    assert (NoisyRoutes(base, 1.0, seed=0, num_experts=N).routes(cycle, pool) == base.value).all()


def test_zero_accuracy_replaces_every_expert_with_distinct_outsiders():
    base, pool, cycle = fixture()
    noisy = NoisyRoutes(base, 0.0, seed=0, num_experts=N).routes(cycle, pool)
    for v in range(pool.n + 1):
        for layer in range(L):
            row = noisy[v, layer]
            assert len(set(row)) == K and not set(row) & set(base.value[v, layer])


def test_noise_is_seeded_per_request_cycle_and_node():
    base, pool, cycle = fixture()
    a = NoisyRoutes(base, 0.5, seed=7, num_experts=N).routes(cycle, pool)
    assert (a == NoisyRoutes(base, 0.5, seed=7, num_experts=N).routes(cycle, pool)).all()
    assert (a != NoisyRoutes(base, 0.5, seed=8, num_experts=N).routes(cycle, pool)).any()
    kept = (a == base.value).mean()
    assert 0.3 < kept < 0.7
    # a smaller pool (fewer levels drafted) sees the same noise on its nodes
    small = CandidatePool(pool.token[:3], pool.parent[:3], pool.path_prob[:3], pool.level[:3])
    assert (NoisyRoutes(base, 0.5, seed=7, num_experts=N).routes(cycle, small) == a[:3]).all()
