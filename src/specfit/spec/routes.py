"""Route sources: the expert routes Ê_{l,v} of the pool nodes that SpecFit's selector reads (Section 3.3).

A source answers ``routes(cycle, pool) -> [n+1, L, k]`` int64 for the root (row 0) and every node of the pool
drafted so far.

- `LiveRoutes` (the atlas build) asks the target itself: one tree forward over root + the whole pool, through
  the offload engine's route recorder, outside the request timer. It keeps each answer as an atlas row.
- `AtlasRoutes` (measured runs) reads those rows back and checks that the run drafts what the atlas holds.
- `NoisyRoutes` degrades another source to a given route accuracy.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from specfit.spec.cycle import Cycle
from specfit.spec.pool import CandidatePool
from specfit.stage import SpecFitError

ATLAS_SCHEMA = pa.schema([
    ("request_id", pa.int64()),
    ("cycle", pa.int64()),
    ("prefix_len", pa.int64()),
    ("pool_parent", pa.list_(pa.int64())),
    ("pool_token", pa.list_(pa.int64())),
    ("pool_prob", pa.list_(pa.float64())),
    ("pool_level", pa.list_(pa.int64())),
    ("routes", pa.list_(pa.int64())),  # flattened [n+1, n_layers, top_k]
    ("n_layers", pa.int64()),
    ("top_k", pa.int64()),
])

PROB_RTOL = 1e-6


def atlas_row(cycle: Cycle, pool: CandidatePool, routes: np.ndarray) -> dict:
    """One atlas row: the cycle's prefix, its full pool and the target's routes [n+1, L, k] for it."""
    return {
        "request_id": cycle.request_id,
        "cycle": cycle.index,
        "prefix_len": cycle.prefix_len,
        "pool_parent": list(pool.parent),
        "pool_token": list(pool.token),
        "pool_prob": list(pool.path_prob),
        "pool_level": list(pool.level),
        "routes": routes.reshape(-1).tolist(),
        "n_layers": routes.shape[1],
        "top_k": routes.shape[2],
    }


def atlas_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ATLAS_SCHEMA)


class LiveRoutes:
    """The target's own routes for the whole pool, queried once per cycle outside the timers."""

    full_pool = True  # the pool must be drafted to full depth before the query

    def __init__(self):
        self.rows: list[dict] = []  # atlas rows, one per queried cycle

    def routes(self, cycle: Cycle, pool: CandidatePool) -> np.ndarray:
        with cycle.clock.excluded():
            routes = cycle.target.routes(pool).numpy().astype(np.int64)  # [n+1, L, k]
        self.rows.append(atlas_row(cycle, pool, routes))
        return routes


class AtlasRoutes:
    """Routes read from an atlas; each cycle's prefix and drafted levels must match the atlas row exactly."""

    full_pool = False

    def __init__(self, path):
        self.path = path
        table = pq.read_table(path)
        missing = set(ATLAS_SCHEMA.names) - set(table.column_names)
        if missing:
            raise SpecFitError(f"atlas {path} lacks columns {sorted(missing)}")
        # routes stay numpy ([n+1, L, k] int16): a full atlas holds ~10^8 expert ids
        flat = table.column("routes").combine_chunks()
        values, offsets = flat.values.to_numpy().astype(np.int16), flat.offsets.to_numpy()
        self.rows = {}
        for i, row in enumerate(table.drop_columns(["routes"]).to_pylist()):
            shape = (-1, row["n_layers"], row["top_k"])
            row["routes"] = values[offsets[i] : offsets[i + 1]].reshape(shape)
            self.rows[row["request_id"], row["cycle"]] = row

    def routes(self, cycle: Cycle, pool: CandidatePool) -> np.ndarray:
        where = f"atlas {self.path}, request {cycle.request_id}, cycle {cycle.index}"
        row = self.rows.get((cycle.request_id, cycle.index))
        if row is None:
            raise SpecFitError(f"{where}: no such row; the run has gone past the atlas")
        if row["prefix_len"] != cycle.prefix_len:
            raise SpecFitError(f"{where}: prefix_len {cycle.prefix_len} here, {row['prefix_len']} in the atlas")
        n = pool.n
        drafted = sum(1 for lv in row["pool_level"][1:] if lv <= pool.depth)
        if drafted != n:
            raise SpecFitError(f"{where}: {n} nodes drafted up to level {pool.depth}, the atlas has {drafted}")
        for name, mine, theirs in (
            ("tokens", pool.token, row["pool_token"]),
            ("parents", pool.parent, row["pool_parent"]),
        ):
            if list(mine) != theirs[: n + 1]:
                node = next(v for v, (a, b) in enumerate(zip(mine, theirs)) if a != b)
                raise SpecFitError(f"{where}: pool {name} diverge at node {node}: {mine[node]} vs {theirs[node]}")
        prob = np.asarray(pool.path_prob)
        atlas_prob = np.asarray(row["pool_prob"][: n + 1])
        off = np.abs(prob - atlas_prob) > PROB_RTOL * np.abs(atlas_prob)
        if off.any():
            node = int(np.argmax(off))
            raise SpecFitError(
                f"{where}: path_prob of node {node} is {prob[node]!r} here, {atlas_prob[node]!r} in the atlas"
            )
        return row["routes"][: n + 1].astype(np.int64)  # [n+1, L, k]


class NoisyRoutes:
    """Another source's routes at a given accuracy (route-prediction sensitivity).

    Each routed expert of every node, the root included, is kept with probability ``accuracy`` and otherwise
    replaced by a random expert outside the node's true top-k, the replacements of one node and layer
    distinct. Node v's noise is drawn from (seed, request_id, cycle, v), so it does not depend on how many
    levels were drafted.

    The simulation stands in for a route predictor whose cost the paper estimates apart (Section 4.6), so it runs
    outside the request timer; a node's noisy routes are drawn once per cycle, not again at every level.
    """

    def __init__(self, base, accuracy: float, seed: int, num_experts: int):
        self.base = base
        self.accuracy = accuracy
        self.seed = seed
        self.num_experts = num_experts
        self.full_pool = base.full_pool
        self._cycle: tuple[int, int] | None = None
        self._noisy: list[np.ndarray] = []  # [L, k] per node already drawn in this cycle

    def routes(self, cycle: Cycle, pool: CandidatePool) -> np.ndarray:
        routes = self.base.routes(cycle, pool)  # [n+1, L, k]
        with cycle.clock.excluded():
            if self._cycle != (cycle.request_id, cycle.index):
                self._cycle, self._noisy = (cycle.request_id, cycle.index), []
            for v in range(len(self._noisy), routes.shape[0]):
                self._noisy.append(self._draw(cycle, v, routes[v]))
            return np.stack(self._noisy[: routes.shape[0]])

    def _draw(self, cycle: Cycle, v: int, true: np.ndarray) -> np.ndarray:
        """[L, k] node v's routes, each expert replaced with probability 1 - accuracy by one outside ``true``."""
        L, k = true.shape
        rng = np.random.default_rng((self.seed, cycle.request_id, cycle.index, v))
        replace = rng.random((L, k)) >= self.accuracy  # [L, k]
        keys = rng.random((L, self.num_experts))  # [L, N] random order of the experts
        np.put_along_axis(keys, true, np.inf, axis=1)  # true experts last
        outside = np.argsort(keys, axis=1)[:, :k]  # [L, k] distinct experts outside the true top-k
        return np.where(replace, outside, true)
