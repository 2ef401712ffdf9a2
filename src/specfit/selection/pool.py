"""The candidate pool V of one cycle (Section 2), in one vocabulary: node 0 is the root s, nodes 1..n the draft
nodes, each parent before its children; ``token``, ``parent``, ``path_prob`` (p_v) and ``level`` (depth: 0 for
the root) per node. Records store them as the columns pool_token, pool_parent, pool_prob, pool_level.

- `CandidatePool`: the pool as the drafter grows it, level by level (Python lists).
- `Pool`: the selector's frozen view of it, with every node's expert routes and their bitmaps, and the experts
  resident in each layer's cache when the cycle selects (for the cache-aware cost).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numba import njit

from specfit.selection.calibration import EDGES, calibrated_rows

WORD_BITS = 64


@dataclass
class CandidatePool:
    """The root s (index 0) and draft nodes 1..n as drafted so far; lists are indexed by node id.

    Node ids are assigned level by level, so the nodes of V<=d are a prefix of V.
    """

    token: list[int]  # target-vocab ids
    parent: list[int] = field(default_factory=lambda: [-1])
    path_prob: list[float] = field(default_factory=lambda: [1.0])  # p_v, product of the draft conditionals on its path
    level: list[int] = field(default_factory=lambda: [0])

    @classmethod
    def root_only(cls, root: int) -> CandidatePool:
        return cls(token=[root])

    @property
    def n(self) -> int:
        """|V|, the draft nodes (the root excluded)."""
        return len(self.token) - 1

    @property
    def depth(self) -> int:
        return self.level[-1]

    def add(self, parent: int, token: int, prob: float) -> int:
        """Append a child of ``parent`` drafted with conditional probability ``prob``; returns its id."""
        self.token.append(token)
        self.parent.append(parent)
        self.path_prob.append(self.path_prob[parent] * prob)
        self.level.append(self.level[parent] + 1)
        return self.n

    def view(self, routes: np.ndarray | None = None, num_experts: int = 1, resident: np.ndarray | None = None,
             in_flight: np.ndarray | None = None, path_prob: np.ndarray | None = None) -> Pool:
        """The selector's view; without ``routes`` [n+1, L, k] it carries no experts (probability rules).

        ``resident`` [L, N] bool marks the experts each layer's cache holds (None: nothing resident), ``in_flight``
        [L, N] the fraction of a resident expert's copy still to come (None: every resident expert has landed).
        ``path_prob`` [n+1] replaces the drafter's p_v (calibrated ones, `specfit.selection.calibration`).
        """
        if routes is None:
            routes = np.empty((self.n + 1, 0, 1), dtype=np.int64)  # [n+1, 0 layers, 1]
        probs = np.asarray(self.path_prob) if path_prob is None else path_prob
        pool = Pool(np.asarray(self.parent), probs, routes, num_experts, resident, in_flight)
        pool.__dict__["level"] = np.asarray(self.level, dtype=np.int64)  # [n+1] known: no walk up the parents
        return pool


class GrowingPool:
    """The selector's view of one cycle's pool as the drafter grows it, level by level (`SpecFit.view`): each
    `extend` appends the nodes drafted since the last call (parent, level, path probability and encoded routes) to
    arrays kept for the cycle and returns a `Pool` over them. Nothing already encoded is encoded again, the
    residency is encoded once while it stays the same array, and the `Pool` equals `CandidatePool.view` of the same
    arguments, array for array.

    The route rows and path probabilities of nodes already seen must not change within the cycle (route sources and
    the online calibration only append).
    """

    def __init__(self, num_experts: int, capacity: int = 32):
        self.num_experts = num_experts
        self.n1 = 0  # nodes (root included) appended so far
        self.parent = np.empty(capacity, dtype=np.int64)  # [cap]
        self.level = np.empty(capacity, dtype=np.int64)  # [cap]
        self.drafted = np.empty(capacity, dtype=np.float64)  # [cap] the drafter's p_v
        self.prob = np.empty(capacity, dtype=np.float64)  # [cap] what the selector reads: p_v, or calibrated p̃_v
        self.words: np.ndarray | None = None  # [cap, L * W] uint64, allocated with the first routes
        self._no_counts = np.zeros((1, 1))  # the calibration counts' stand-in where there is no calibration
        self._no_routes = np.empty((capacity, 0, 1), dtype=np.int64)  # routes of no layer, for views without experts
        self._resident: tuple[object, np.ndarray | None] = (None, None)  # (the residency, its words)

    def _grow(self, rows: int) -> None:
        for name in ("parent", "level", "drafted", "prob", "words", "_no_routes"):
            old = getattr(self, name)
            if old is not None:
                new = np.empty((max(rows, 2 * len(old)), *old.shape[1:]), dtype=old.dtype)
                new[: self.n1] = old[: self.n1]
                setattr(self, name, new)

    def extend(self, pool: CandidatePool, routes: np.ndarray | None = None, resident: np.ndarray | None = None,
               in_flight: np.ndarray | None = None, calibration=None) -> Pool:
        """The view of ``pool`` [n+1 nodes] after appending its nodes since the last call: ``routes`` [n+1, L, k]
        (None: no experts), ``resident`` and ``in_flight`` [L, N] as `CandidatePool.view` reads them, and
        ``calibration`` (an `specfit.selection.calibration.OnlineCalibration`, or None for the drafter's p_v)."""
        start, end = self.n1, pool.n + 1
        if end > len(self.parent):
            self._grow(end)
        parent, level, drafted = self.parent, self.level, self.drafted
        for v in range(start, end):  # a level's few nodes: scalar stores beat three list-to-array conversions
            parent[v], level[v], drafted[v] = pool.parent[v], pool.level[v], pool.path_prob[v]
        if routes is None:
            routes = self._no_routes[:end]  # [n+1, 0 layers, 1]
        elif routes.ndim != 3 or routes.shape[0] != end:
            raise ValueError(f"routes must be [{end}, L, top_k], got {routes.shape}")
        else:
            routes = np.require(routes, np.int64, ("C", "W"))  # the kernels' one layout (`Pool.words`)
        row_words = routes.shape[1] * ((self.num_experts + WORD_BITS - 1) // WORD_BITS)
        encode_from = start
        if self.words is None or self.words.shape[1] != row_words:
            self.words = np.zeros((len(self.parent), row_words), dtype=np.uint64)
            encode_from = 0  # (the cycle's first routes: encode every row)
        if calibration is None:
            counts = (self._no_counts, self._no_counts, 0.0, 0)
        else:
            counts = (calibration.accepted, calibration.trials, calibration.prior, calibration.max_depth)
        if not _extend_rows(parent, level, drafted, self.prob, self.words, routes, start, encode_from, end,
                            self.num_experts, calibration is not None, *counts, EDGES):
            raise ValueError("every draft node needs a parent with a smaller id: 0 <= parent[v] < v")
        self.n1 = end
        return Pool.encoded(parent[:end], self.prob[:end], routes, self.num_experts, self.words[:end], level[:end],
                            resident, in_flight, self._resident_words(resident))

    def _resident_words(self, resident: np.ndarray | None) -> np.ndarray | None:
        if resident is None:
            return None
        if self._resident[0] is not resident:
            self._resident = (resident, _encode_resident(np.asarray(resident, dtype=np.bool_),
                                                         (self.num_experts + WORD_BITS - 1) // WORD_BITS))
        return self._resident[1]


@dataclass(frozen=True, eq=False)
class Pool:
    """Root s (node 0) and draft nodes 1..n, each parent before its children: parent[v] < v.

    routes[v, l] lists the experts E_l(v) of node v in MoE layer l. A repeated id counts once and a
    negative id is padding, so rows may route to fewer than top_k experts (the root may route to none).
    resident[l, e] is True when expert e sits in layer l's cache as the cycle selects (None: nothing resident);
    in_flight[l, e] in [0, 1] is the fraction of a resident expert's copy still to come (a prefetch in flight; None:
    none). Only the cache-aware cost reads them: it charges an expert in flight β_hit + in_flight·(β_miss − β_hit).
    """

    parent: np.ndarray  # [n+1] int64, parent[0] = -1 for the root s
    path_prob: np.ndarray  # [n+1] float64 path probabilities p_v; path_prob[0] is ignored
    routes: np.ndarray  # [n+1, L, top_k] int expert ids per node and layer
    num_experts: int  # N experts per layer
    resident: np.ndarray | None = None  # [L, N] bool, expert e resident in layer l's cache; None = none resident
    in_flight: np.ndarray | None = None  # [L, N] float64 in [0, 1], copy left of a resident expert; None = none

    def __post_init__(self):
        self._check_nodes()
        self._check_residency()

    @classmethod
    def encoded(cls, parent: np.ndarray, path_prob: np.ndarray, routes: np.ndarray, num_experts: int, words, level,
                resident: np.ndarray | None = None, in_flight: np.ndarray | None = None,
                resident_words: np.ndarray | None = None) -> Pool:
        """A pool over arrays already checked and encoded (`GrowingPool`): ``parent`` [n+1] int64 with parents
        first, ``path_prob`` [n+1] float64, ``routes`` [n+1, L, k] and their ``words`` and ``level``; the residency is
        checked as the constructor checks it, and ``resident_words`` are its encoding when the caller has it."""
        pool = object.__new__(cls)
        pool.__dict__.update(parent=parent, path_prob=path_prob, routes=routes, num_experts=num_experts,
                             resident=resident, in_flight=in_flight, words=words, level=level)
        if resident is not None or in_flight is not None:
            pool._check_residency()
        if resident_words is not None and pool.resident is not None:
            pool.__dict__["resident_words"] = resident_words
        return pool

    def _check_nodes(self) -> None:
        parent = np.asarray(self.parent, dtype=np.int64)
        path_prob = np.asarray(self.path_prob, dtype=np.float64)
        routes = np.asarray(self.routes)
        if parent.ndim != 1 or parent.shape[0] == 0 or parent[0] != -1:
            raise ValueError("parent[0] must be -1: node 0 is the root s")
        n = parent.shape[0] - 1
        if not _parents_precede(parent):
            raise ValueError("every draft node needs a parent with a smaller id: 0 <= parent[v] < v")
        if path_prob.shape != (n + 1,) or routes.ndim != 3 or routes.shape[0] != n + 1:
            raise ValueError(f"path_prob must be [{n + 1}] and routes [{n + 1}, L, top_k]")
        object.__setattr__(self, "parent", parent)
        object.__setattr__(self, "path_prob", path_prob)
        object.__setattr__(self, "routes", routes)

    def _check_residency(self) -> None:
        routes = self.routes
        if self.resident is not None:
            resident = np.asarray(self.resident, dtype=np.bool_)
            if resident.shape != (routes.shape[1], self.num_experts):
                raise ValueError(f"resident must be [L={routes.shape[1]}, N={self.num_experts}], got {resident.shape}")
            object.__setattr__(self, "resident", resident)
        if self.in_flight is not None:
            in_flight = np.asarray(self.in_flight, dtype=np.float64)
            if self.resident is None or in_flight.shape != self.resident.shape:
                raise ValueError("in_flight needs a residency of the same shape [L, N]")
            if np.any((in_flight < 0) | (in_flight > 1)) or np.any((in_flight > 0) & ~self.resident):
                raise ValueError("in_flight holds fractions in [0, 1] of resident experts' copies")
            object.__setattr__(self, "in_flight", in_flight if np.any(in_flight > 0) else None)

    @property
    def n(self) -> int:
        """|V|, the number of draft nodes (the root excluded)."""
        return self.parent.shape[0] - 1

    @property
    def words_per_layer(self) -> int:
        """W = ceil(N / 64) uint64 words per layer in `words` and `resident_words`."""
        return (self.num_experts + WORD_BITS - 1) // WORD_BITS

    @cached_property
    def words(self) -> np.ndarray:
        """Expert bitmaps B_v of Algorithm 1: [n+1, L * ceil(N / 64)] uint64, layer l in its own words."""
        # one layout for the kernel (C-contiguous, writable: an atlas's routes come read-only from Arrow), so that it
        # runs the one specialization `specfit.selection.search.compile_kernels` compiled before any timing
        return _encode_routes(np.require(self.routes, np.int64, ("C", "W")), self.num_experts)

    @cached_property
    def resident_words(self) -> np.ndarray:
        """The resident experts R_l as one row of `words`: [L * ceil(N / 64)] uint64, all zero without residency."""
        if self.resident is None:
            return np.zeros(self.routes.shape[1] * self.words_per_layer, dtype=np.uint64)
        return _encode_resident(self.resident, self.words_per_layer)

    @cached_property
    def in_flight_words(self) -> tuple[np.ndarray, np.ndarray]:
        """The experts in flight as a row of `words` [L * ceil(N / 64)] uint64, and the fraction of each bit
        [L * ceil(N / 64) * 64] float64 (0 outside them); requires ``in_flight``."""
        per_layer = self.words_per_layer
        weights = np.zeros((self.routes.shape[1], per_layer * WORD_BITS))  # [L, W * 64]
        weights[:, : self.num_experts] = self.in_flight
        return _encode_resident(self.in_flight > 0, per_layer), weights.reshape(-1)

    @cached_property
    def level(self) -> np.ndarray:
        """[n+1] int64 depth of each node: 0 for the root s, 1 for its children, ..."""
        level = np.zeros(self.n + 1, dtype=np.int64)
        for v in range(1, self.n + 1):
            level[v] = level[self.parent[v]] + 1
        return level

    def prefix(self, n: int) -> Pool:
        """The pool of draft nodes 1..n, sharing this pool's arrays, residency and encoded bitmaps."""
        if not 0 <= n <= self.n:
            raise ValueError(f"prefix of {n} nodes from a pool of {self.n}")
        end = n + 1
        sub = Pool(self.parent[:end], self.path_prob[:end], self.routes[:end], self.num_experts, self.resident,
                   self.in_flight)
        for name in ("words", "level"):  # computed once per cycle, not once per level
            if name in self.__dict__:
                sub.__dict__[name] = self.__dict__[name][:end]
        for name in ("resident_words", "in_flight_words", "root_counts"):
            if name in self.__dict__:
                sub.__dict__[name] = self.__dict__[name]
        return sub

    def upto_level(self, depth: int) -> Pool:
        """V_{<=d} of adaptive depth (Section 3.3): the nodes of the first d levels, which must be a prefix."""
        n = int(np.count_nonzero(self.level[1:] <= depth))
        if np.any(self.level[1 : n + 1] > depth):
            raise ValueError("node ids are not in level order, so V_<=d is not a prefix of V")
        return self.prefix(n)

    def _union_words(self, nodes) -> np.ndarray:
        return np.bitwise_or.reduce(self.words[[0, *nodes]], axis=0)  # [L * words per layer]

    @cached_property
    def root_counts(self) -> tuple[int, int]:
        """F and M of the root alone (S = ∅): what every cycle's root-only time reads."""
        words = self.words[0]
        return _bit_count(words), _bit_count(words & ~self.resident_words)

    def expert_union(self, nodes) -> int:
        """F(S) of Eq. 4: sum over layers of |E_l(s) ∪ ⋃_{v in S} E_l(v)|, the root's experts included."""
        if not len(nodes):
            return self.root_counts[0]
        return _bit_count(self._union_words(nodes))

    def in_flight_left(self, nodes) -> float:
        """P(S): the copy fractions still to come of the experts of F(S) in flight (0 when none is)."""
        if self.in_flight is None:
            return 0.0
        flight, weights = self.in_flight_words
        bits = np.unpackbits((self._union_words(nodes) & flight).astype("<u8").view(np.uint8), bitorder="little")
        return float(weights[bits.astype(bool)].sum())

    def expert_misses(self, nodes) -> int:
        """M(S): sum over layers of |U_l(S) \\ R_l|, the experts of F(S) not resident (copies of the verify forward)."""
        if not len(nodes):
            return self.root_counts[1]
        return _bit_count(self._union_words(nodes) & ~self.resident_words)

    def cache_aware_time(self, nodes, b_k: float, beta_miss: float, beta_hit: float, union: int | None = None,
                         misses: int | None = None) -> float:
        """T̂_CA(S) = b_|S| + β_miss M(S) + β_hit H(S) + (β_miss − β_hit) P(S), in float64 term by term as the
        search kernels compute it; ``b_k`` is the intercept for |S| (with any drafting cost in it), ``union`` and
        ``misses`` F(S) and M(S) when the caller has them."""
        union = self.expert_union(nodes) if union is None else union
        misses = self.expert_misses(nodes) if misses is None else misses
        time = float(b_k) + float(beta_miss) * misses + float(beta_hit) * (union - misses)
        if self.in_flight is not None:
            time += (float(beta_miss) - float(beta_hit)) * self.in_flight_left(nodes)
        return time


def _bit_count(words: np.ndarray) -> int:
    return int.from_bytes(words.tobytes(), "little").bit_count()


@njit(cache=True)
def _parents_precede(parent):
    """0 <= parent[v] < v for every draft node v."""
    for v in range(1, parent.shape[0]):
        if not 0 <= parent[v] < v:
            return False
    return True


@njit(cache=True)
def _extend_rows(parent, level, drafted, prob, words, routes, start, encode_from, end, num_experts, calibrate,
                 accepted, trials, prior, max_depth, edges):
    """`GrowingPool.extend` in one call: check the parents of rows start..end-1, fill their path probabilities (the
    drafter's, or calibrated by `specfit.selection.calibration.calibrated_rows`) and encode routes encode_from..end-1.
    False where a parent does not precede its node."""
    if parent[0] != -1:
        return False
    for v in range(max(start, 1), end):
        if not 0 <= parent[v] < v:
            return False
    if calibrate:
        calibrated_rows(parent, drafted, level, prob, start, end, accepted, trials, prior, max_depth, edges)
    else:
        for v in range(start, end):
            prob[v] = drafted[v]
    _encode_routes_into(words, routes, encode_from, end, num_experts)
    return True


@njit(cache=True)
def _encode_routes_into(words, routes, start, end, num_experts):
    """words[start:end] = the bitmaps of routes[start:end] [., L, top_k] (rows 0..start-1 stay as encoded)."""
    layers, top_k = routes.shape[1], routes.shape[2]
    per_layer = (num_experts + WORD_BITS - 1) // WORD_BITS
    for v in range(start, end):
        for w in range(words.shape[1]):
            words[v, w] = 0
        for layer in range(layers):
            for j in range(top_k):
                e = routes[v, layer, j]
                if e >= num_experts:
                    raise ValueError("expert id out of range")
                if e >= 0:
                    w = layer * per_layer + e // WORD_BITS
                    words[v, w] |= np.uint64(1) << np.uint64(e % WORD_BITS)


@njit(cache=True)
def _encode_routes(routes, num_experts):
    """One pass over routes [n+1, L, top_k] setting bit e of layer l's words for each expert id e."""
    n1, layers = routes.shape[0], routes.shape[1]
    words = np.zeros((n1, layers * ((num_experts + WORD_BITS - 1) // WORD_BITS)), dtype=np.uint64)  # [n+1, L * W]
    _encode_routes_into(words, routes, 0, n1, num_experts)
    return words


@njit(cache=True)
def _encode_resident(resident, per_layer):
    """resident [L, N] bool as [L * per_layer] uint64 words, each word ORed in a register (no branch per bit)."""
    layers, num_experts = resident.shape
    words = np.empty(layers * per_layer, dtype=np.uint64)
    for layer in range(layers):
        for w in range(per_layer):
            acc = np.uint64(0)
            for k in range(min(WORD_BITS, num_experts - w * WORD_BITS)):
                acc |= np.uint64(resident[layer, w * WORD_BITS + k]) << np.uint64(k)
            words[layer * per_layer + w] = acc
    return words
