"""Route sources: the expert routes Ê_{l,v} of the pool nodes that SpecFit's selector reads (Section 3.3).

A source answers ``routes(cycle, pool) -> [n+1, L, k]`` int64 for the root (row 0) and every node of the pool
drafted so far.

- `LiveRoutes` (the atlas build) asks the target itself: one tree forward over root + the whole pool, through
  the offload engine's route recorder, outside the request timer. It keeps each answer as an atlas row.
- `AtlasRoutes` (measured runs) reads those rows back, looking each node up by its content (the tokens it sees).
- `NoisyRoutes` degrades another source to a given route accuracy.
- `specfit.speculative.learned.LearnedRoutes` predicts them from the drafter's state (a trained predictor).

Which source a method reads is its `specfit.speculative.config.RouteSource`; `route_source_for` builds it.
Torch-free: the sources reach the target only through ``cycle.target``.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from specfit.errors import SpecFitError
from specfit.results.records import atlas_row, read_atlas
from specfit.speculative.config import MethodConfig
from specfit.speculative.cycle import Cycle

if TYPE_CHECKING:
    from specfit.selection.pool import CandidatePool

log = logging.getLogger(__name__)

# Path probabilities of a replayed node vs its atlas entry, relative. They are products of up to 5 drafter softmax
# probabilities over target features that a cache state changes in the last bits (bf16 on a GPU: more), so they
# differ by ~1e-7..1e-5 in fp32; 1e-4 flags a real divergence. A larger difference is logged and counted, never
# fatal: the selector reads the run's own probabilities, the atlas's only serve this check.
PROB_RTOL = 1e-4
WARNINGS_PER_KIND = 5  # log the first few misses and probability differences; the counters hold them all


class LiveRoutes:
    """The target's own routes for the whole pool, queried once per cycle outside the timers."""

    full_pool = True  # the pool must be drafted to full depth before the query

    def __init__(self):
        self.rows: list[dict] = []  # atlas rows, one per queried cycle

    def routes(self, cycle: Cycle, pool: CandidatePool) -> np.ndarray:
        with cycle.clock.excluded():
            routes = cycle.target.routes(pool).numpy().astype(np.int64)  # [n+1, L, k]
        self.rows.append(atlas_row(cycle.request_id, cycle.index, cycle.prefix_len, pool, routes))
        return routes


@dataclass
class _Frame:
    """One atlas row seen from the current cycle: ``node[v]`` is the row's node holding run node v, or -1."""

    row: dict
    children: dict[tuple[int, int], int]  # (row node, token) -> child row node
    node: list[int]

    def follow(self, parent: int, token: int) -> int:
        """Map the next run node (child ``token`` of run node ``parent``) into this row."""
        up = self.node[parent]
        node = self.children.get((up, token), -1) if up >= 0 else -1
        self.node.append(node)
        return node


@dataclass
class _CycleMatch:
    """What one cycle's pool resolved to so far (the pool grows level by level; nodes resolve once)."""

    cycle: Cycle
    own: _Frame | None  # the atlas row of this very prefix, when its root is this cycle's
    earlier: list[_Frame] | None = None  # rows of earlier prefixes holding the root; None: not searched yet
    token: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    answer: np.ndarray | None = None  # [cap, L, k] int64: row v node v's routes, for the first len(found) nodes
    found: list[bool] = field(default_factory=list)  # answered from the atlas, not by a fallback

    def put(self, routes: np.ndarray, found: bool) -> None:
        """Answer the next node with ``routes`` [L, k] (rows already answered never change: views of them stay)."""
        v = len(self.found)
        if self.answer is None or v == len(self.answer):
            grown = np.empty((max(32, 2 * v), *routes.shape), dtype=np.int64)
            if self.answer is not None:
                grown[:v] = self.answer
            self.answer = grown
        self.answer[v] = routes
        self.found.append(found)


class AtlasRoutes:
    """Routes read back from an atlas, each node looked up by its content.

    A node's routes depend only on the tokens the target sees for it: the committed prefix and the tokens on its
    path from the root (up to the last bits a cache state changes, which can flip a route at a near-tie of the
    router: such a node then differs only in its routes, never in its tokens). Every method commits AR's output,
    so the atlas run and a measured run see the same token sequence ``x``; a cycle at ``prefix_len`` q has root
    ``x[q]`` and carries the output so far (`Cycle.output`). Atlas rows are keyed by (request_id, prefix_len),
    nodes within a row by their token path from the root. What must match:

    - exactly: the request must be in the atlas, else `SpecFitError`; a node is found only by its exact token path,
      and then gets the atlas's routes bit for bit. Rows exist only for cycles the build drafted in (a method may
      verify the root alone), so a cycle's prefix need not have a row; an atlas built for other prompts shows as
      misses.
    - within `PROB_RTOL` (relative): the path probability of a node found in the row of the same prefix. A larger
      difference is logged and counted (``prob_mismatches``), never fatal.
    - nothing else: the drafted count, node ids and parents may differ; cycle indices are not compared.

    A node its own row lacks (a drafting near-tie flipped, which changes that node's token and its subtree, or a
    cycle boundary the atlas run never had because an earlier selection differed) does not abort the run. Only
    then are the earlier rows of the request searched, nearest first: row p < q holds the node if its pool has
    the path ``x[p+1..q]`` (from the cycle's output) followed by the node's token path. Else the node gets the
    routes of its nearest resolved ancestor (the root's if none; a root no row holds gets the root's of the
    nearest earlier row) and counts in ``nodes_missed``. Each node counts once per cycle, however many levels
    re-ask.

    ``rows`` keeps the atlas run's own cycles by (request_id, cycle) for readers of the atlas itself.
    """

    full_pool = False

    def __init__(self, path):
        self.path = path
        self.rows: dict[tuple[int, int], dict] = {}  # (request_id, cycle) -> row: the atlas run's own cycles
        self._at: dict[int, dict[int, dict]] = {}  # request_id -> prefix_len -> row
        for row in read_atlas(path):
            if row["prefix_len"] in self._at.get(row["request_id"], {}):
                raise SpecFitError(f"atlas {path}, request {row['request_id']}, prefix_len {row['prefix_len']}: "
                                   "two rows for one prefix")
            self.rows[row["request_id"], row["cycle"]] = row
            self._at.setdefault(row["request_id"], {})[row["prefix_len"]] = row
        self._prefixes = {r: sorted(rows) for r, rows in self._at.items()}  # request_id -> its prefix_lens
        self._max_level = max((max(r["pool_level"]) for r in self.rows.values()), default=0)
        self._children: dict[tuple[int, int], dict[tuple[int, int], int]] = {}
        self._match: _CycleMatch | None = None
        self._warned: dict[str, int] = {}
        self.reset_counts()

    def reset_counts(self) -> None:
        """Zero the counters (decode does so after its warm-up request)."""
        self.nodes_looked_up = 0  # nodes answered, roots included, each once per cycle
        self.nodes_missed = 0  # of those, answered by a fallback: the atlas lacks their content
        self.nodes_from_earlier_rows = 0  # of those found, found in an earlier row than their cycle's own
        self.prob_mismatches = 0  # found in their own row with a path probability off by more than PROB_RTOL

    def routes(self, cycle: Cycle, pool: CandidatePool) -> np.ndarray:
        match = self._match
        if match is None or match.cycle is not cycle or not _extends(match, pool):
            match = self._match = self._start(cycle, pool)
        for v in range(len(match.found), pool.n + 1):
            self._resolve(match, pool, v)
        return match.answer[: pool.n + 1]  # [n+1, L, k], a view of the cycle's answers

    def _where(self, cycle: Cycle) -> str:
        return f"atlas {self.path}, request {cycle.request_id}, cycle {cycle.index}"

    def _start(self, cycle: Cycle, pool: CandidatePool) -> _CycleMatch:
        """A new cycle: its own row, if any, and its root resolved."""
        rid, q, root = cycle.request_id, cycle.prefix_len, pool.token[0]
        if rid not in self._at:
            raise SpecFitError(f"{self._where(cycle)}: the atlas has no rows for this request "
                               "(built for other prompts?)")
        prefixes = self._prefixes[rid]
        row = self._at[rid].get(q)
        own = _Frame(row, self._children_of(row), [0]) if row is not None and row["pool_token"][0] == root else None
        match = _CycleMatch(cycle, own, token=[root], parent=[-1])
        self.nodes_looked_up += 1
        if own is not None:
            match.put(row["routes"][0], True)
        elif earlier := self._earlier(match):
            self.nodes_from_earlier_rows += 1
            match.put(earlier[0].row["routes"][earlier[0].node[0]], True)
        else:  # a boundary no row holds, or this run's root differs from the atlas's
            # the nearest row at or before q (the first row when the build drafted nothing before q)
            floor = self._at[rid][prefixes[max(bisect.bisect_right(prefixes, q) - 1, 0)]]
            self._miss(f"{self._where(cycle)}: root {root} at prefix_len {q} is in no atlas row; using the routes "
                       f"of the root at prefix_len {floor['prefix_len']}")
            match.put(floor["routes"][0], False)
        return match

    def _earlier(self, match: _CycleMatch) -> list[_Frame]:
        """The rows of earlier prefixes that hold this cycle's root, nearest first, with the nodes resolved so far
        mapped into them; searched once per cycle, and only when a node misses its own row."""
        if match.earlier is None:
            cycle, q = match.cycle, match.cycle.prefix_len
            keep = list(cycle.output[-1 - self._max_level :]) or match.token[:1]  # x[q+1-len(keep) .. q]
            x = {q + 1 - len(keep) + i: t for i, t in enumerate(keep)}
            prefixes = self._prefixes[cycle.request_id]
            first = bisect.bisect_left(prefixes, q - self._max_level)
            match.earlier = []
            for p in reversed(prefixes[first : bisect.bisect_left(prefixes, q)]):
                row = self._at[cycle.request_id][p]
                anchor = _anchor(row, p, q, x)
                if anchor is not None:
                    frame = _Frame(row, self._children_of(row), [anchor])
                    for v in range(1, len(match.token)):
                        frame.follow(match.parent[v], match.token[v])
                    match.earlier.append(frame)
        return match.earlier

    def _resolve(self, match: _CycleMatch, pool: CandidatePool, v: int) -> None:
        """Answer node v > 0 from its own row, else from the first earlier row that holds it, else from its
        nearest resolved ancestor."""
        parent, token = pool.parent[v], pool.token[v]
        node = match.own.follow(parent, token) if match.own is not None else -1
        for frame in match.earlier or ():
            frame.follow(parent, token)
        match.token.append(token)
        match.parent.append(parent)
        self.nodes_looked_up += 1
        if node >= 0:
            match.put(match.own.row["routes"][node], True)
            self._check_prob(match.cycle, v, pool.path_prob[v], match.own.row["pool_prob"][node])
            return
        hit = next((f for f in self._earlier(match) if f.node[v] >= 0), None)
        if hit is not None:
            self.nodes_from_earlier_rows += 1
            match.put(hit.row["routes"][hit.node[v]], True)
            return
        u = parent
        while u > 0 and not match.found[u]:
            u = match.parent[u]
        self._miss(f"{self._where(match.cycle)}: node {v} (token {token}) is in no atlas row; using the routes of "
                   f"node {u}")
        match.put(match.answer[u], False)

    def _check_prob(self, cycle: Cycle, v: int, mine: float, theirs: float) -> None:
        if abs(mine - theirs) > PROB_RTOL * abs(theirs):
            self.prob_mismatches += 1
            self._warn("prob", f"{self._where(cycle)}: path probability of node {v} is {mine!r} here, "
                               f"{theirs!r} in the atlas (counted in prob_mismatches)")

    def _miss(self, message: str) -> None:
        self.nodes_missed += 1
        self._warn("miss", message + " (counted in nodes_missed)")

    def _warn(self, kind: str, message: str) -> None:
        seen = self._warned[kind] = self._warned.get(kind, 0) + 1
        if seen <= WARNINGS_PER_KIND:
            log.warning("%s%s", message, "; further ones are only counted" if seen == WARNINGS_PER_KIND else "")

    def _children_of(self, row: dict) -> dict[tuple[int, int], int]:
        key = (row["request_id"], row["prefix_len"])
        if key not in self._children:
            self._children[key] = {(p, t): v for v, (p, t) in enumerate(zip(row["pool_parent"], row["pool_token"]))
                                   if v > 0}
        return self._children[key]


def _extends(match: _CycleMatch, pool: CandidatePool) -> bool:
    """Whether ``pool`` agrees with the nodes ``match`` resolved (a level more, or fewer levels)."""
    m = min(len(match.token), len(pool.token))
    return match.token[:m] == pool.token[:m] and match.parent[:m] == pool.parent[:m]


def _anchor(row: dict, p: int, q: int, x: dict[int, int]) -> int | None:
    """The node of ``row`` (at prefix_len p < q) that holds position q of the sequence ``x``, or None.

    That node sits at level q - p with token ``x[q]``, and its ancestors carry ``x[p+1..q-1]``; children of one
    node carry distinct tokens, so at most one node fits.
    """
    tokens, parents, levels = row["pool_token"], row["pool_parent"], row["pool_level"]
    if x.get(p) != tokens[0]:  # the sequence left the atlas's at p (or the cycle does not reach back to p)
        return None
    for u in range(1, len(tokens)):
        if levels[u] != q - p or tokens[u] != x.get(q):
            continue
        a = parents[u]
        while a > 0 and x.get(p + levels[a]) == tokens[a]:
            a = parents[a]
        if a == 0:
            return u
    return None


def find_source(source, kind: type):
    """The source of type ``kind`` that ``source`` is or reads (under `NoisyRoutes`), or None."""
    while source is not None and not isinstance(source, kind):
        source = getattr(source, "base", None)
    return source


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
        self._cycle: Cycle | None = None  # the cycle the draws below belong to (a warm-up request has the same ids)
        self._noisy: list[np.ndarray] = []  # [L, k] per node already drawn in this cycle

    def routes(self, cycle: Cycle, pool: CandidatePool) -> np.ndarray:
        routes = self.base.routes(cycle, pool)  # [n+1, L, k]
        with cycle.clock.excluded():
            if self._cycle is not cycle:
                self._cycle, self._noisy = cycle, []
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


def route_source_for(config: MethodConfig, inputs: dict, seed: int, num_experts: int):
    """The route source ``config.routes`` names, over the decode rule's ``inputs`` (the atlas or predictor to read)."""
    source = config.route_source
    if source.learned:
        if "predictor" not in inputs:
            raise SpecFitError(f"method {config.name} with 'learned' routes needs the `predictor` input (trained by "
                               "the predictor rule)")
        from specfit.speculative.learned import LearnedRoutes  # torch: only the decode of a learned run loads it

        return LearnedRoutes(inputs["predictor"])
    if source.live:
        routes = LiveRoutes()
    elif "atlas" not in inputs:
        raise SpecFitError(f"method {config.name} with {source.name!r} routes needs the `atlas` input (built by the "
                           "atlas rule)")
    else:
        routes = AtlasRoutes(inputs["atlas"])
    return NoisyRoutes(routes, config.accuracy, seed, num_experts) if source.noisy else routes


def predictor_cost(hidden_size: int, num_layers: int, num_experts: int) -> dict:
    """Parameters and multiply-adds x 2 (FLOP) of one node's prediction, at any model's size."""
    params = (2 * hidden_size + 1) * num_layers * num_experts
    return {"params": params, "flop_per_node": 2 * (2 * hidden_size) * num_layers * num_experts}
