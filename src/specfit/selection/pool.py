"""The candidate pool V of one cycle: parents, path probabilities and expert routes (Section 2)."""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

WORD_BITS = 64


@dataclass(frozen=True, eq=False)
class Pool:
    """Root s (node 0) and draft nodes 1..n, each parent before its children: parent[v] < v.

    routes[v, l] lists the experts E_l(v) of node v in MoE layer l. A repeated id counts once and a
    negative id is padding, so rows may route to fewer than top_k experts (the root may route to none).
    """

    parent: np.ndarray  # [n+1] int64, parent[0] = -1 for the root s
    prob: np.ndarray  # [n+1] float64 path probabilities p_v; prob[0] is ignored
    routes: np.ndarray  # [n+1, L, top_k] int expert ids per node and layer
    num_experts: int  # N experts per layer

    def __post_init__(self):
        parent = np.asarray(self.parent, dtype=np.int64)
        prob = np.asarray(self.prob, dtype=np.float64)
        routes = np.asarray(self.routes)
        n = parent.shape[0] - 1
        if n < 0 or parent[0] != -1:
            raise ValueError("parent[0] must be -1: node 0 is the root s")
        if not all(0 <= u < v for v, u in enumerate(parent[1:].tolist(), start=1)):
            raise ValueError("every draft node needs a parent with a smaller id: 0 <= parent[v] < v")
        if prob.shape != (n + 1,) or routes.ndim != 3 or routes.shape[0] != n + 1:
            raise ValueError(f"prob must be [{n + 1}] and routes [{n + 1}, L, top_k]")
        object.__setattr__(self, "parent", parent)
        object.__setattr__(self, "prob", prob)
        object.__setattr__(self, "routes", routes)

    @property
    def n_nodes(self) -> int:
        """|V|, the number of draft nodes (the root excluded)."""
        return self.parent.shape[0] - 1

    @cached_property
    def words(self) -> np.ndarray:
        """Expert bitmaps B_v of Algorithm 1: [n+1, L * ceil(N / 64)] uint64, layer l in its own words."""
        return _encode_routes(self.routes.astype(np.int64, copy=False), self.num_experts)

    @cached_property
    def levels(self) -> np.ndarray:
        """[n+1] int64 depth of each node: 0 for the root s, 1 for its children, ..."""
        levels = np.zeros(self.n_nodes + 1, dtype=np.int64)
        for v in range(1, self.n_nodes + 1):
            levels[v] = levels[self.parent[v]] + 1
        return levels

    def with_levels(self, levels) -> "Pool":
        """This pool, told its node depths (the drafter knows them): no walk up the parents to find them."""
        self.__dict__["levels"] = np.asarray(levels, dtype=np.int64)  # [n+1]
        return self

    def prefix(self, n_nodes: int) -> "Pool":
        """The pool of draft nodes 1..n_nodes, sharing this pool's arrays and encoded bitmaps."""
        if not 0 <= n_nodes <= self.n_nodes:
            raise ValueError(f"prefix of {n_nodes} nodes from a pool of {self.n_nodes}")
        end = n_nodes + 1
        sub = Pool(self.parent[:end], self.prob[:end], self.routes[:end], self.num_experts)
        for name in ("words", "levels"):  # computed once per cycle, not once per level
            if name in self.__dict__:
                sub.__dict__[name] = self.__dict__[name][:end]
        return sub

    def upto_level(self, depth: int) -> "Pool":
        """V_{<=d} of adaptive depth (Section 3.3): the nodes of the first d levels, which must be a prefix."""
        n_nodes = int(np.count_nonzero(self.levels[1:] <= depth))
        if np.any(self.levels[1 : n_nodes + 1] > depth):
            raise ValueError("node ids are not in level order, so V_<=d is not a prefix of V")
        return self.prefix(n_nodes)

    def expert_union(self, nodes) -> int:
        """F(S) of Eq. 4: sum over layers of |E_l(s) ∪ ⋃_{v in S} E_l(v)|, the root's experts included."""
        union = np.bitwise_or.reduce(self.words[[0, *nodes]], axis=0)  # [L * words per layer]
        return int.from_bytes(union.tobytes(), "little").bit_count()


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
