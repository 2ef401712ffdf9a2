import torch

from specfit.selection.pool import CandidatePool
from specfit.speculative.request import Limits, Session
from specfit.speculative.tree import path_matrix, tree_mask

NO_LIMITS = Limits(10_000, 10_000, frozenset())


def sequential_logits(model, tokens):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]  # [V]


def random_pool(root, n_levels=3, seed=0):
    """A binary pool: every node of the previous level gets two children with random tokens."""
    g = torch.Generator().manual_seed(seed)
    pool = CandidatePool.root_only(root)
    last = [0]
    for _ in range(n_levels):
        last = [pool.add(p, int(torch.randint(0, 256, (1,), generator=g)), 0.5) for p in last for _ in range(2)]
    return pool


def path(pool, v):
    nodes = []
    while v > 0:
        nodes.append(v)
        v = pool.parent[v]
    return nodes[::-1]


def test_mask_shows_each_row_its_path():
    parent = [-1, 0, 0, 1, 2, 3]
    assert path_matrix(parent).int().tolist() == [
        [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0], [1, 0, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1],
    ]
    mask = tree_mask(parent, 3, torch.float32)
    assert mask.shape == (1, 1, 6, 9)
    assert (mask[0, 0, :, :3] == 0).all() and mask[0, 0, 3, 4].item() == 0 and mask[0, 0, 3, 5].item() == float("-inf")


def test_tree_forward_gives_each_node_its_sequential_logits(target, prompts):
    prompt = prompts[1]
    session = Session(target, None, prompt, NO_LIMITS)
    with torch.inference_mode():
        session.prefill()
        pool = random_pool(session.output[0])
        logits, _ = session.target.forward(pool.token, pool.parent, pool.level)  # [n+1, V]
    for v in range(pool.n + 1):
        expected = sequential_logits(target, prompt + [pool.token[u] for u in [0, *path(pool, v)]])
        torch.testing.assert_close(logits[v], expected, atol=2e-5, rtol=1e-5)


def test_verify_accepts_the_greedy_path_and_prunes_the_cache(target, prompts):
    """A pool whose main path is the target's greedy continuation, with wrong siblings and a subtree under them."""
    prompt = prompts[0]
    greedy, sequence = [], list(prompt)
    for _ in range(5):
        sequence.append(int(sequential_logits(target, sequence).argmax()))
    greedy = sequence[len(prompt):]  # root, then 4 more
    pool = CandidatePool.root_only(greedy[0])
    a = pool.add(0, (greedy[1] + 1) % 256, 0.4)  # wrong sibling first, so ids do not follow the path
    b = pool.add(0, greedy[1], 0.6)
    pool.add(a, greedy[2], 0.3)  # the right token under a wrong parent
    c = pool.add(b, greedy[2], 0.5)
    d = pool.add(c, greedy[3], 0.4)
    pool.add(c, (greedy[3] + 7) % 256, 0.1)
    session = Session(target, None, prompt, NO_LIMITS)
    with torch.inference_mode():
        session.prefill()
        verdict = session.verify(pool, tuple(range(1, pool.n + 1)), {})
        session.commit(pool, verdict, {})
        assert verdict.accepted == [b, c, d] and verdict.next_root == greedy[4]
        assert session.target.prefix_len == len(prompt) + 4
        assert session.output == greedy
        # decoding on from the pruned cache continues the greedy sequence
        logits, _ = session.target.forward([greedy[4]])
    torch.testing.assert_close(logits[-1], sequential_logits(target, sequence), atol=2e-5, rtol=1e-5)


def test_selected_subtree_only(target, prompts):
    """Verifying a subtree that leaves out the accepted path's continuation stops the path there."""
    prompt = prompts[0]
    session = Session(target, None, prompt, NO_LIMITS)
    with torch.inference_mode():
        session.prefill()
        root = session.output[0]
        nxt = int(session.target.forward([root])[0][-1].argmax())
        session.target.cache.crop(-1)
        pool = CandidatePool.root_only(root)
        v = pool.add(0, nxt, 0.9)
        pool.add(v, 3, 0.5)
        verdict = session.verify(pool, (v,), {})
    assert verdict.accepted == [v] and verdict.kept == [0, 1] and verdict.past_len == len(prompt)
