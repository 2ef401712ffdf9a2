import torch

from specfit.selection.pool import CandidatePool
from specfit.speculative.config import MethodConfig
from specfit.speculative.draft import draft_level, frontier
from specfit.speculative.methods import build_method
from specfit.speculative.request import Limits, Session, decode_request


def draft_pool(target, drafter, prefix, levels=5):
    """Prefill ``prefix`` from scratch and draft ``levels`` levels of the pool."""
    session = Session(target, drafter, prefix, Limits(10_000, 10_000, frozenset()))
    with torch.inference_mode():
        session.prefill()
        pool = CandidatePool.root_only(session.output[-1])
        for _ in range(levels):
            draft_level(drafter, session.state, pool)
    return pool, session.state


def test_pool_shape(target, drafter, prompts):
    pool, state = draft_pool(target, drafter, prompts[2])
    assert pool.n == 18
    assert pool.level == [0, 1, 1] + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4  # ids level by level
    assert all(pool.parent[v] < v for v in range(1, 19))
    for d in range(1, 5):  # each level expands the 2 most probable nodes of the one before
        level = [v for v in range(1, 19) if pool.level[v] == d]
        best = sorted(level, key=lambda v: (-pool.path_prob[v], v))[:2]
        assert sorted({pool.parent[v] for v in range(1, 19) if pool.level[v] == d + 1}) == sorted(best)
    for v in range(1, 19):
        siblings = [u for u in range(1, 19) if pool.parent[u] == pool.parent[v]]
        assert len(siblings) == 2 and len({pool.token[u] for u in siblings}) == 2
        assert 0 < pool.path_prob[v] < pool.path_prob[pool.parent[v]]
        assert drafter.t2d[pool.token[v]]  # a target id the draft vocabulary holds
    # the drafter cache: committed rows, then one row per expanded node
    assert state.cache.get_seq_length() == len(prompts[2]) + 8


def test_level_one_is_the_top2_of_the_root(target, drafter, prompts):
    pool, state = draft_pool(target, drafter, prompts[0], levels=1)
    probs = torch.softmax(state.logits.float(), -1)
    top = probs.topk(2)
    assert pool.token[1:] == drafter.to_target_ids(top.indices).tolist()
    assert pool.path_prob[1:] == torch.Tensor.tolist(top.values.double())
    assert frontier(pool, 2) == [1, 2]


def test_draft_state_is_consistent_across_cycles(target, drafter, prompts, limits):
    """The pool of every cycle equals the pool drafted from scratch on that cycle's committed prefix."""
    prompt = prompts[1]
    result = decode_request(
        target, drafter, build_method(MethodConfig("eagle3")), prompt, request_id=0, question_id=0, limits=limits
    )
    output = result.request["output_ids"]
    for c in result.cycles[1:6]:
        prefix = prompt + output[: c["prefix_len"] - len(prompt)]
        pool, _ = draft_pool(target, drafter, prefix, levels=max(c["pool_level"]))
        assert pool.token == c["pool_token"] and pool.parent == c["pool_parent"]
        torch.testing.assert_close(torch.tensor(pool.path_prob), torch.tensor(c["pool_prob"]), rtol=1e-5, atol=1e-7)
