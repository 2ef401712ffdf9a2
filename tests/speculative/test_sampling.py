"""Sampling at T > 0: coupled sampling commits AR's tokens at the seed for every method; rejection sampling keeps
AR's distribution (and the test that says so fails on a verifier known to be wrong); bad parameters are refused."""

import dataclasses
import math
import os
import re
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from specfit.errors import SpecFitError
from specfit.planning import specs
from specfit.planning.config import SCHEMA, load_config
from specfit.speculative.config import MethodConfig
from specfit.speculative.methods import SpecFit, build_method
from specfit.speculative.request import decode_request
from specfit.speculative.routes import LiveRoutes
from specfit.speculative.sampler import Noise, gumbel, rejection_path, warp
from specfit.speculative.sampling import Sampling

B = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]


def decode_all(target, drafter, method, prompts, limits, seed_offset=0):
    return [decode_request(target, drafter, method, prompt, request_id=i, question_id=100 + i + seed_offset,
                           limits=limits).request["output_ids"] for i, prompt in enumerate(prompts)]


SETTINGS = [  # temperature, top_p, top_k, seed
    (1.0, 1.0, 0, 0), (0.8, 0.95, 0, 7), (0.6, 1.0, 20, 3), (1.3, 0.9, 50, 11),
]


@pytest.mark.parametrize("temperature,top_p,top_k,seed", SETTINGS)
def test_coupled_sampling_commits_ars_tokens_for_every_method(target, drafter, prompts, limits, temperature, top_p,
                                                               top_k, seed):
    s = Sampling(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    sampled = dataclasses.replace(limits, sampling=s)
    ar = decode_all(target, None, build_method({"name": "ar"}), prompts, sampled)
    assert ar != decode_all(target, None, build_method({"name": "ar"}), prompts, limits)  # it does sample
    for method in (build_method({"name": "eagle3"}), SpecFit(MethodConfig("specfit"), B, 0.05, LiveRoutes(), 8)):
        assert decode_all(target, drafter, method, prompts, sampled) == ar


def test_noise_drawn_ahead_is_the_noise_drawn_in_place(target, drafter, prompts, limits, monkeypatch):
    """Noise.ahead draws the next cycle's positions in a worker thread while the device verifies: the same numbers,
    and a decode reads them from the worker."""
    s = Sampling(temperature=0.8, top_p=0.95, seed=7)
    ahead = Noise(s, 3, 500)
    ahead.ahead(range(4, 9))
    assert all(torch.equal(ahead.gumbel(p), gumbel(7, 3, p, 500)) for p in range(2, 11))
    assert not ahead._drawing  # every position drawn ahead was read from the worker
    sampled = dataclasses.replace(limits, sampling=s)
    taken = []
    result = Future.result

    def counted(self, timeout=None):
        taken.append(self)
        return result(self, timeout)

    monkeypatch.setattr(Future, "result", counted)
    with_worker = decode_all(target, drafter, build_method({"name": "eagle3"}), prompts, sampled)
    assert len(taken) > len(prompts)  # positions past each request's first cycle came from the worker
    monkeypatch.setattr(Noise, "ahead", lambda self, positions: None)
    assert decode_all(target, drafter, build_method({"name": "eagle3"}), prompts, sampled) == with_worker


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_draws_noise_ahead_in_a_worker_of_its_own():
    """The stage server forks its jobs: a child must not inherit the parent's noise worker, whose thread it lacks
    (a draw handed to it would never run)."""
    s = Sampling(temperature=1.0, seed=1)
    parent = Noise(s, 0, 100)
    parent.ahead([1])
    parent.gumbel(1)  # the parent's worker exists
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its drawn-ahead noise arrives, and is the noise
        child = Noise(s, 0, 100)
        child.ahead([2])
        try:
            os._exit(0 if torch.equal(child._drawing[2].result(timeout=10), gumbel(1, 0, 2, 100)) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_coupled_sampling_is_a_function_of_the_seed(target, prompts, limits):
    ar = build_method({"name": "ar"})
    at = [dataclasses.replace(limits, sampling=Sampling(temperature=1.0, seed=seed)) for seed in (1, 1, 2)]
    a, b, c = (decode_all(target, None, ar, prompts, x) for x in at)
    assert a == b and a != c


def test_coupled_sampling_in_bf16(target, drafter, prompts, limits):
    bf16, dbf16 = target.to(torch.bfloat16), drafter.to(torch.bfloat16)
    try:
        sampled = dataclasses.replace(limits, sampling=Sampling(temperature=0.9, top_p=0.95, seed=5))
        ar = decode_all(bf16, None, build_method({"name": "ar"}), prompts, sampled)
        assert decode_all(bf16, dbf16, build_method({"name": "eagle3"}), prompts, sampled) == ar
    finally:
        target.to(torch.float32), drafter.to(torch.float32)


def test_the_oracle_drafter_is_accepted_under_coupled_sampling(target, oracle, prompts, limits):
    """A drafter that proposes AR's sampled continuation is accepted: the verify's rule is AR's."""
    sampled = dataclasses.replace(limits, sampling=Sampling(temperature=1.0, seed=4))
    ar = decode_all(target, None, build_method({"name": "ar"}), prompts, sampled)
    oracle.sequence = prompts[0] + ar[0]
    r = decode_request(target, oracle, build_method({"name": "eagle3"}), prompts[0], request_id=0, question_id=100,
                       limits=sampled)
    assert r.request["output_ids"] == ar[0]
    assert sum(c["accepted"] for c in r.cycles) > len(ar[0]) // 2


def test_warp_keeps_the_top_k_and_the_nucleus():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.isfinite(warp(logits, Sampling(temperature=1.0, top_k=2))).tolist() == [[True, True] + [False] * 3]
    p = logits.softmax(-1)[0]  # 0.636, 0.234, 0.086, ...
    kept = torch.isfinite(warp(logits, Sampling(temperature=1.0, top_p=0.8)))[0].tolist()
    assert kept == [True, True, False, False, False] and p[0] < 0.8 <= p[0] + p[1]
    assert torch.isfinite(warp(logits, Sampling(temperature=1.0, top_p=0.5)))[0].tolist() == [True] + [False] * 4


def test_the_gumbel_max_rule_samples_the_distribution():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    s = Sampling(temperature=1.0, seed=0)
    n = 4000
    counts = Counter(Noise(s, key, 4).sample(p.log()[None], [0])[0] for key in range(n))
    assert tv(counts, n, p) < 0.02


# rejection sampling


def tv(counts: Counter, n: int, p: torch.Tensor) -> float:
    return 0.5 * sum(abs(counts.get(i, 0) / n - float(p[i])) for i in range(len(p)))


def rejection_first_tokens(residual: bool, n: int):
    """The token after the root under rejection verification of a fixed two-level tree, over ``n`` seeds."""
    p_root = torch.tensor([0.4, 0.35, 0.2, 0.05])  # the target at the root
    p_child = {1: torch.tensor([0.7, 0.1, 0.1, 0.1]), 2: torch.tensor([0.1, 0.1, 0.1, 0.7])}
    children = {0: [1, 2]}
    token = [0, 1, 0]  # node 1 drafts token 1 (the drafter's best), node 2 token 0
    out = Counter()
    for key in range(n):
        noise = Noise(Sampling(temperature=1.0, sampling="rejection"), key, 4)
        path, nxt = rejection_path(children, token, {0: p_root, **p_child}, noise, 0, {0: 0, 1: 1, 2: 1}, residual)
        out[token[path[0]] if path else nxt] += 1
    return out, p_root


def test_rejection_verification_keeps_the_targets_distribution_and_a_wrong_one_fails():
    n = 4000
    right, p = rejection_first_tokens(True, n)
    wrong, _ = rejection_first_tokens(False, n)
    assert tv(right, n, p) < 0.02
    assert tv(wrong, n, p) > 0.1  # no residual: the drafted tokens come too often


def second_tokens(target, drafter, prompt, limits, seeds, first):
    """The second output token of each seed whose first is ``first``, counted, and how many seeds those were."""
    method = build_method({"name": "eagle3" if drafter is not None else "ar"})
    out = Counter()
    for seed in seeds:
        r = decode_request(target, drafter, method, prompt, request_id=0, question_id=0,
                           limits=dataclasses.replace(limits, sampling=dataclasses.replace(limits.sampling, seed=seed)))
        ids = r.request["output_ids"]
        if ids[0] == first:
            out[ids[1]] += 1
    return out, sum(out.values())


def test_rejection_sampling_on_the_toy_keeps_the_targets_distribution(target, oracle, prompts, limits, monkeypatch):
    """The second output token over 1000 fixed seeds, where the first is AR's greedy one (there the oracle's drafts
    are in the target's top-k): AR's sampler and EAGLE-3 under rejection sampling both within a total-variation
    bound of the target's distribution, and the verifier without the residual correction outside it."""
    import specfit.speculative.request as request  # the verify reads rejection_path from there

    prompt = prompts[0]
    s = Sampling(temperature=1.0, top_k=3, sampling="rejection")
    sampled = dataclasses.replace(limits, max_new_tokens=3, sampling=s)  # 3: the first cycle drafts
    greedy = decode_all(target, None, build_method({"name": "ar"}), [prompt], limits)[0]
    oracle.sequence = prompt + greedy  # drafts greedy[1] first, then greedy[1] + 1
    with torch.inference_mode():
        p = warp(target(torch.tensor([prompt + greedy[:1]])).logits[0, -1], s).softmax(-1)  # [V]
    assert float(p[greedy[1]]) < 0.9  # the drafts are often rejected: the residual matters
    seeds = range(1000)
    for drafter in (None, oracle):
        counts, n = second_tokens(target, drafter, prompt, sampled, seeds, greedy[0])
        assert n > 200 and tv(counts, n, p) < 0.06, (drafter, tv(counts, n, p))
    right = request.rejection_path
    monkeypatch.setattr(request, "rejection_path", lambda *a: right(*a, residual=False))
    counts, n = second_tokens(target, oracle, prompt, sampled, seeds, greedy[0])
    assert tv(counts, n, p) > 0.1, tv(counts, n, p)


# refusals


@pytest.mark.parametrize("keys,message", [
    ({"temperature": -0.1}, "temperature must be a finite number >= 0"),
    ({"temperature": math.inf}, "temperature must be a finite number >= 0"),
    ({"temperature": math.nan}, "temperature must be a finite number >= 0"),
    ({"temperature": 1.0, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"temperature": 1.0, "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"temperature": 1.0, "top_k": -1}, "top_k must be an integer >= 0"),
    ({"temperature": 1.0, "seed": 1.5}, "seed must be an integer"),
    ({"temperature": 1.0, "sampling": "nucleus"}, "sampling 'nucleus' is not one of coupled, rejection"),
    ({"sampling": "rejection"}, "sampling 'rejection' needs temperature > 0"),
])
def test_bad_sampling_parameters_are_refused(keys, message):
    with pytest.raises(SpecFitError, match=message):
        Sampling(**keys)


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("keys,message", [
    ({"temperature": -1}, "temperature"),
    ({"temperature": ".inf"}, "workloads.summarization.temperature': temperature must be a finite number"),
    ({"temperature": 1, "top_p": 0}, "top_p"),
    ({"temperature": 1, "top_k": -3}, "top_k"),
    ({"temperature": 1, "seed": 1.5}, "seed"),
    ({"temperature": 1, "sampling": "nucleus"}, "nucleus"),
    ({"sampling": "rejection"}, "workloads.summarization.sampling': sampling 'rejection' needs temperature > 0"),
])
def test_bad_sampling_keys_are_refused_at_config_load(tmp_path, keys, message):
    body = ", ".join(f"{k}: {v}" for k, v in keys.items())
    (tmp_path / "overlay.yaml").write_text(f"workloads:\n  summarization: {{{body}}}\n")
    with pytest.raises(SpecFitError, match=re.escape(message)):
        load_config(ROOT / "config.yaml", ROOT / SCHEMA, tmp_path / "overlay.yaml", check_files=False)


def test_a_greedy_workloads_decode_spec_has_no_sampling_and_a_sampled_one_does(tmp_path):
    config = load_config(ROOT / "config.yaml", ROOT / SCHEMA, check_files=False)
    assert "sampling" not in specs._limits(config, "summarization")  # T = 0: the spec of before, the same jobs
    (tmp_path / "overlay.yaml").write_text("workloads:\n  summarization: {temperature: 1, top_p: 0.9, seed: 3}\n")
    config = load_config(ROOT / "config.yaml", ROOT / SCHEMA, tmp_path / "overlay.yaml", check_files=False)
    assert specs._limits(config, "summarization")["sampling"] == {"temperature": 1, "top_p": 0.9, "top_k": 0,
                                                                  "seed": 3, "sampling": "coupled"}


def test_the_cli_refuses_bad_flags_by_name_and_never_claims_identity_under_rejection():
    from specfit.cli import parser, sampling_keys, summary

    args = parser().parse_args(["generate", "--temperature", "1", "--top-p", "0", "x"])
    with pytest.raises(SpecFitError, match=re.escape("--top-p: top_p must be in (0, 1]")):
        sampling_keys(args)
    args = parser().parse_args(["generate", "--sampling", "rejection", "x"])
    with pytest.raises(SpecFitError, match="--sampling: sampling 'rejection' needs temperature > 0"):
        sampling_keys(args)
    record = {"method": "eagle3", "routes": None, "model": "toy", "device": "d", "slots": 4, "n_output_tokens": 3,
              "tps_dec": 1.0, "timing_label": "wall", "committed_per_cycle": 1.0, "draft_nodes_per_cycle": 1.0,
              "select_ms_per_cycle": 0.1, "h2d_per_token": 0.0}
    for guarantee, identical, says in [("tokens", True, "identical output"), ("tokens", False, "OUTPUT DIFFERS"),
                                       ("distribution", True, "tokens may differ")]:
        text = summary({**record, "compare": {"identical": identical, "guarantee": guarantee, "tps_dec": 1.0,
                                              "speedup": 1.0}})
        assert says in text and (guarantee == "tokens" or "identical" not in text)


def test_the_nucleus_read_from_the_top_tokens_is_the_sorted_one():
    """`warp`'s nucleus (read from the most likely tokens, widened while a row keeps them all) keeps what sorting the
    whole row keeps, on peaked and flat rows; a tie with the last kept token is kept too."""
    torch.manual_seed(0)
    V = 5000
    logits = torch.cat([torch.randn(3, V) * 8, torch.randn(3, V) * 0.1])  # peaked rows (few kept), flat (thousands)
    for top_p in (0.3, 0.9, 0.999):
        kept = torch.isfinite(warp(logits, Sampling(temperature=0.7, top_p=top_p)))
        probs, order = (logits / 0.7).softmax(-1).sort(-1, descending=True)
        reference = ((probs.cumsum(-1) - probs) < top_p).scatter(-1, order, (probs.cumsum(-1) - probs) < top_p)
        assert torch.equal(kept, reference), top_p
        assert kept[3:].sum(-1).min() > 256  # the flat rows made it widen past its first candidates
    tied = torch.tensor([[2.0, 1.0, 1.0, 0.0]])  # 0.48, 0.18, 0.18, 0.06: 0.6 ends inside the first 1.0
    assert torch.isfinite(warp(tied, Sampling(temperature=1.0, top_p=0.6)))[0].tolist() == [True, True, True, False]


def test_coupled_commit_probabilities_are_the_drafters_noised_distribution():
    """`Noise.draft`: the children are the top-k of the warped scores plus the position's noise, and each one's
    commit probability is softmax(scores + noise) there; with a noise that makes a token the clear winner, its
    probability is near 1 even where the tempered q of it is small."""
    s = Sampling(temperature=1.0, seed=3)
    noise = Noise(s, 0, 6)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0]])  # a 4-token draft vocabulary
    target_ids = torch.tensor([0, 2, 4, 5])
    probs, ids = noise.draft(logits, 1, target_ids, 2)
    noised = logits + noise.gumbel(1)[target_ids]
    assert ids[0].tolist() == noised[0].topk(2).indices.tolist()
    assert torch.allclose(probs[0], noised[0].softmax(-1)[ids[0]])
    noise._gumbel[2] = torch.tensor([0.0, 0, 0, 0, 0, 30.0])  # the noise favours target id 5 (draft id 3) by far
    probs, ids = noise.draft(logits, 2, target_ids, 1)
    assert ids.tolist() == [[3]] and probs.item() > 0.99 > 0.1 > logits.softmax(-1)[0, 3]


def test_rejection_commit_probabilities_are_the_tempered_warped_q_at_greedys_children():
    """`Noise.proposals`: greedy's top-k children, each with its warped, tempered q (0 outside the nucleus), the
    drafter's estimate of the target's p(x), which is each child's chance to be accepted under EAGLE's verify."""
    logits = torch.tensor([[3.0, 2.0, 0.0, -1.0]])
    s = Sampling(temperature=0.5, top_p=0.9, sampling="rejection")
    probs, ids = Noise(s, 0, 4).proposals(logits, 3)
    assert ids.tolist() == [[0, 1, 2]]  # as greedy drafts them
    q = (logits / 0.5).softmax(-1)[0]  # 0.867, 0.117, ...: the nucleus at 0.9 keeps the first two
    kept = q[:2] / q[:2].sum()
    assert torch.allclose(probs[0], torch.tensor([kept[0], kept[1], 0.0]))
