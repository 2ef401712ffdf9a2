"""Look-ahead stopping (beyond the paper): whether drafting more levels could pay together where one level alone does
not. The paper's adaptive depth (Section 3.3) stops at the first level whose nodes do not pay by themselves; a chain
through several levels can pay where none of its levels does alone."""

from collections.abc import Callable

from specfit.selection.pool import Pool
from specfit.selection.selectors import Selection


def chain_pays(view: Pool, chosen: Selection, depth: int, max_depth: int, k_cap: int, rate: Callable[[int], float],
               time_of: Callable[[list[int], float], Callable[[int], float]]) -> bool:
    """Whether Ŝ_d (``chosen`` over ``view``, the pool drafted to ``depth`` levels) plus the path to the most probable
    level-d node f, extended by a chain of j = 1, 2, ... nodes through levels d + 1 .. ``max_depth``, predicts a higher
    ratio R̂ / T̂ than Ŝ_d, with at most ``k_cap`` nodes in all.

    The chain's i-th node has path probability p_f · c_{d+1} ··· c_{d+i}, c_l = ``rate(l)`` (the expected conditional
    of a level-l best child), and adds the experts per node that f's own path added (its union over its length);
    ``time_of(base, per_node)`` gives j -> T̂ of the nodes ``base`` and j such chain nodes.
    """
    level, prob, parent = view.level.tolist(), view.path_prob.tolist(), view.parent.tolist()  # scalar work below
    frontier = [v for v in range(1, view.n + 1) if level[v] == depth]
    f = max(frontier, key=lambda v: (prob[v], -v))
    path = []
    v = f
    while v > 0:
        path.append(v)
        v = parent[v]
    base = sorted(set(chosen.nodes) | set(path))
    room = k_cap - len(base)
    if room <= 0:
        return False
    per_node = (view.expert_union(path) - view.expert_union(())) / len(path)  # experts a chain node adds
    reward = 1.0 + sum(prob[u] for u in base)
    p, ratio, time = prob[f], chosen.reward / chosen.time, time_of(base, per_node)
    for j in range(1, min(room, max_depth - depth) + 1):
        p *= rate(depth + j)
        reward += p
        if reward / time(j) > ratio:
            return True
    return False
