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
        for name in ("resident_words", "in_flight_words"):
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

    def expert_union(self, nodes) -> int:
        """F(S) of Eq. 4: sum over layers of |E_l(s) ∪ ⋃_{v in S} E_l(v)|, the root's experts included."""
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
def _encode_routes(routes, num_experts):
    """One pass over routes [n+1, L, top_k] setting bit e of layer l's words for each expert id e."""
    n1, layers, top_k = routes.shape
    per_layer = (num_experts + WORD_BITS - 1) // WORD_BITS
    words = np.zeros((n1, layers * per_layer), dtype=np.uint64)  # [n+1, L * per_layer]
    for v in range(n1):
        for layer in range(layers):
            for j in range(top_k):
                e = routes[v, layer, j]
                if e >= num_experts:
                    raise ValueError("expert id out of range")
                if e >= 0:
                    w = layer * per_layer + e // WORD_BITS
                    words[v, w] |= np.uint64(1) << np.uint64(e % WORD_BITS)
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
