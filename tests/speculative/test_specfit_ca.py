"""specfit-ca: the cache-aware cost read from the engine, draft-aware depth, skipped drafting; always lossless."""

import copy

import numpy as np
import pyarrow as pa
import pytest
from decode_helpers import decode_prompts

from specfit.engine.offload import make_engine
from specfit.io import write_parquet
from specfit.results.records import ATLAS_SCHEMA, CYCLE_SCHEMA, resident_ids, resident_mask
from specfit.selection.coefficients import DraftCost
from specfit.selection.pool import CandidatePool
from specfit.speculative.config import MethodConfig
from specfit.speculative.methods import SpecFit, SpecFitCA, build_method
from specfit.speculative.routes import AtlasRoutes, LiveRoutes

B = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]
CONFIG = MethodConfig("specfit-ca")


class SharedExpert:
    """A route source that routes every node of the tiny target to experts 0 and 1 in both layers."""

    full_pool = False

    def routes(self, cycle, pool):
        return np.tile(np.array([0, 1]), (pool.n + 1, 2, 1))  # [n+1, L=2, k=2]


def ca(routes, beta_miss=0.05, beta_hit=0.01, level_ms=0.0, b=B):
    """specfit-ca whose drafting costs ``level_ms`` per level (catch-up and level 1 included), selections nothing."""
    return SpecFitCA(CONFIG, b, beta_miss, beta_hit, DraftCost(level_ms, level_ms, 0.0), routes, num_experts=8)


@pytest.fixture(scope="module")
def offloaded(target):
    """The tiny target offloaded with 3 of its 8 experts per layer cached (a copy: other tests use it plain)."""
    model = copy.deepcopy(target)
    return model, make_engine(model, slots=3)


run = decode_prompts


@pytest.fixture(scope="module")
def ar(offloaded, prompts, limits):
    model, engine = offloaded
    return [r.request["output_ids"] for r in run(model, None, build_method({"name": "ar"}), prompts, limits, engine)]


def test_lossless_with_the_cache_live_and_from_its_atlas(offloaded, oracle, prompts, limits, ar, tmp_path):
    model, engine = offloaded
    live = LiveRoutes()
    built = run(model, oracle, ca(live), prompts, limits, engine, ar)
    assert [r.request["output_ids"] for r in built] == ar
    path = tmp_path / "atlas.parquet"
    write_parquet(pa.Table.from_pylist(live.rows, schema=ATLAS_SCHEMA), path)
    measured = run(model, oracle, ca(AtlasRoutes(path)), prompts, limits, engine, ar)
    assert [r.request["output_ids"] for r in measured] == ar
    assert sum(c["accepted"] for r in measured for c in r.cycles) > 0


def test_residency_is_read_from_the_engine_once_per_cycle(offloaded, oracle, prompts, limits, ar, monkeypatch):
    model, engine = offloaded
    reads = []
    real = engine.resident
    monkeypatch.setattr(engine, "resident", lambda: reads.append(1) or real())
    results = run(model, oracle, ca(LiveRoutes()), prompts[:1], limits, engine, ar)
    drafted = sum(1 for c in results[0].cycles if len(c["pool_token"]) > 1)
    assert len(reads) == drafted and drafted > 0


def test_cycle_rows_record_the_residency_specfit_ca_read(offloaded, oracle, prompts, limits, ar, monkeypatch):
    """The ``resident`` column holds, per layer, the experts engine.resident() gave the cycle's selection, and
    survives CYCLE_SCHEMA; a skipped cycle reads it too (off the timers); null where the length limit left nothing to
    decide and for methods that read no cache, which query nothing."""
    model, engine = offloaded
    reads = []
    real = engine.resident
    monkeypatch.setattr(engine, "resident", lambda: reads.append(real()) or reads[-1])
    method = ca(SharedExpert())  # a measured run's source: skipped cycles draft nothing
    method.history.extend([(1.0, 2.0, 1, 0)] * method.MIN_HISTORY)  # speculation has not paid: skip 8 of every 9
    method.committed = lambda cycle, decision, accepted: None  # keep the planted history
    cycles = [c for r in run(model, oracle, method, prompts[:2], limits, engine, ar) for c in r.cycles]
    drafted = [c for c in cycles if len(c["pool_token"]) > 1]
    recorded = [c for c in cycles if c["resident"] is not None]  # drafted and skipped: read once per cycle
    assert 0 < len(drafted) < len(recorded) and len(reads) == len(recorded)
    for c, resident in zip(recorded, reads):
        assert c["resident"] == [np.flatnonzero(layer).tolist() for layer in resident]
        assert len(c["resident"]) == 2 and all(len(layer) <= 3 for layer in c["resident"])
    assert sum(len(layer) for c in drafted for layer in c["resident"]) > 0  # the cache held something
    # only cycles the length limit left without room to draft decide nothing and record nothing
    assert all(c["drafted_levels"] == 0 and len(c["pool_token"]) == 1 for c in cycles if c["resident"] is None)
    table = pa.Table.from_pylist(cycles, schema=CYCLE_SCHEMA)
    for c, back in zip(cycles, table.column("resident").to_pylist()):
        mask = resident_mask(back, 8)
        assert (mask is None and c["resident"] is None) or resident_ids(mask) == c["resident"]
    reads.clear()
    paper = SpecFit(MethodConfig("specfit"), B, 0.05, SharedExpert(), 8)
    for method in (paper, build_method({"name": "ar"})):
        rows = [c for r in run(model, oracle, method, prompts[:1], limits, engine, ar) for c in r.cycles]
        assert rows and all(c["resident"] is None for c in rows)
    assert reads == []


def test_without_residency_and_costs_it_is_the_papers_specfit(target, oracle, prompts, limits):
    """No engine (nothing resident), β_miss = β, no level cost, drafting every cycle: the same cycles as SpecFit."""
    from specfit.speculative.methods import SpecFit

    ar_out = [r.request["output_ids"] for r in run(target, None, build_method({"name": "ar"}), prompts, limits, None)]
    paper = run(target, oracle, SpecFit(MethodConfig("specfit"), B, 0.05, LiveRoutes(), 8), prompts, limits, None,
                ar_out)
    mine = ca(LiveRoutes(), beta_miss=0.05, beta_hit=0.3)
    mine.MIN_HISTORY = 10**9  # never skip
    ours = run(target, oracle, mine, prompts, limits, None, ar_out)
    for p, o in zip(paper, ours):
        assert [c["selected"] for c in o.cycles] == [c["selected"] for c in p.cycles]
        assert [c["drafted_levels"] for c in o.cycles] == [c["drafted_levels"] for c in p.cycles]


def test_a_level_that_cannot_pay_is_not_drafted():
    """ΔR = min(w², K)·p_max <= ρ_d·(c - Δb) stops drafting even when the selection holds a level-d node."""
    pool = CandidatePool([5])
    for token, prob in ((6, 0.2), (7, 0.1)):
        pool.add(0, token, prob)
    routes = np.zeros((3, 1, 1), dtype=np.int64)  # [3, 1 layer, top-1]: one shared expert, F = 1 always
    view = pool.view(routes, num_experts=8)
    b = [1.0] * 8  # Δb = 0
    cheap, dear = ca(None, level_ms=0.0, b=b), ca(None, level_ms=10.0, b=b)
    for method in (cheap, dear):
        chosen = method.choose(view, 1)
        assert chosen.nodes == (1, 2)  # both level-1 nodes pay for themselves: the paper's rule would draft on
    assert cheap.draft_on(view, cheap.choose(view, 1), 1)  # c = 0: the paper's rule
    chosen = dear.choose(view, 1)  # ρ = 1.3 / (1 + 10 + 0.05) = 0.118; ΔR = 4 · 0.2 = 0.8 <= ρ · 10 = 1.18
    assert chosen.time == pytest.approx(1.0 + 10.0 + 0.05) and not dear.draft_on(view, chosen, 1)


def test_skipping_drafting_when_speculation_has_not_paid(target, drafter, prompts, limits):
    """A history in which drafted cycles committed 1 token each at twice the root-only time: cycles verify the root
    alone, every PROBE_EVERY + 1-th drafts; the drafter then catches up on every skipped token in one pass and
    drafts exactly the pool a fresh prefill of the same prefix drafts. The output is AR's."""
    import torch

    from specfit.speculative.draft import draft_level
    from specfit.speculative.request import Limits, Session

    ar_out = [r.request["output_ids"] for r in run(target, None, build_method({"name": "ar"}), prompts, limits, None)]
    method = ca(SharedExpert(), level_ms=0.0)  # a measured run's source (not live): skipped cycles draft nothing
    method.history.extend([(1.0, 2.0, 1, 0)] * method.MIN_HISTORY)
    method.committed = lambda cycle, decision, accepted: None  # keep the planted history
    result = run(target, drafter, method, prompts[:1], limits, None)[0]
    assert result.request["output_ids"] == ar_out[0]
    pools = [len(c["pool_token"]) - 1 for c in result.cycles]
    every = method.PROBE_EVERY
    assert pools[:every] == [0] * every and pools[every] > 0
    probe = result.cycles[every]
    prefix = prompts[0] + result.request["output_ids"][: every + 1]  # the prompt, then the output up to the root
    fresh = Session(target, drafter, prefix[:-1], Limits(10_000, 10_000, frozenset()))
    with torch.inference_mode():
        fresh.prefill()
        assert fresh.output == [prefix[-1]]  # the target's own next token: the probe cycle's root
        pool = CandidatePool.root_only(prefix[-1])
        for _ in range(max(probe["pool_level"])):  # live routes draft the whole pool
            draft_level(drafter, fresh.state, pool)
    assert probe["pool_token"] == pool.token
    assert probe["pool_prob"] == pytest.approx(pool.path_prob, rel=1e-5)


def test_built_from_coefficients(tmp_path):
    import json

    (tmp_path / "c.json").write_text(json.dumps({
        "b": B, "beta": 0.2,
        "drafting": {"start_ms": 0.9, "level_ms": 0.6, "select_ms": 0.1, "r2": 0.9, "n_points": 10},
        "cache_aware": {"b": [3.0] * 8, "beta_miss": 0.4, "beta_hit": 0.02, "r2": 0.95,
                        "without_drafting": {"b": [2.0] * 8, "beta_miss": 0.3, "beta_hit": 0.01}}}))
    (tmp_path / "p.json").write_text(json.dumps({"b": B, "beta": 0.2, "cache_aware": None,
                                                 "drafting": None}))
    fit = build_method({"name": "specfit-ca", "routes": "live"}, {"coefficients": tmp_path / "c.json"}, 0, 8)
    assert (fit.beta_miss, fit.beta_hit, fit.drafting, list(fit.b)) == (0.3, 0.01, DraftCost(0.9, 0.6, 0.1), [2.0] * 8)
    preset = build_method({"name": "specfit-ca", "routes": "live"}, {"coefficients": tmp_path / "p.json"}, 0, 8)
    assert (preset.beta_miss, preset.beta_hit, preset.drafting) == (0.2, 0.2, DraftCost(0.0, 0.0, 0.0))
    assert isinstance(preset, SpecFit)


def test_an_atlas_build_records_the_cycles_it_verifies_the_root_alone_in(target, drafter, prompts, limits):
    """Measured runs skip in other cycles than the build (their cache differs): the build drafts and records a
    pool in every cycle, skipped or not, while verifying the root alone where the method says so."""
    ar_out = [r.request["output_ids"] for r in run(target, None, build_method({"name": "ar"}), prompts, limits, None)]
    live = LiveRoutes()
    method = ca(live, level_ms=0.0)
    method.history.extend([(1.0, 2.0, 1, 0)] * method.MIN_HISTORY)
    method.committed = lambda cycle, decision, accepted: None  # keep the planted history: skip 8 of every 9
    result = run(target, drafter, method, prompts[:1], limits, None)[0]
    assert result.request["output_ids"] == ar_out[0]
    drafted = [c for c in result.cycles if len(c["pool_token"]) > 1]
    assert len(live.rows) == len(drafted) >= len(result.cycles) - 1  # every cycle with room for a level
    skipped = [c for c in drafted if c["drafted_levels"] == 0]  # drafted and recorded, the root verified alone
    assert len(skipped) >= method.PROBE_EVERY and all(c["selected"] == [] for c in skipped)


def test_probes_back_off_while_drafting_does_not_pay_and_reset_when_it_does():
    """Skipped cycles before each probe: PROBE_EVERY, then doubling up to MAX_PROBE_EVERY while the probes commit
    nothing; a probe after which drafting pays brings back PROBE_EVERY."""
    from specfit.speculative.cycle import Cycle
    from specfit.speculative.methods import Decision

    method = ca(None)
    method.history.extend([(1.0, 2.0, 1, 0)] * method.HISTORY)  # drafting took twice the time for the same token

    def cycles(n, accepted):
        drafted = []
        for i in range(n):
            if method.wants_draft(Cycle(0, i, 0, [0])):  # no target: no cache to read
                drafted.append(i)
                method._last = (1.0, 1.0, 1)  # T̂(∅), T̂(Ŝ) of verification, one level (drafting is free here)
                method.committed(None, Decision((1,), 1), accepted)
        return drafted

    drafted = cycles(300, accepted=0)
    gaps = [b - a - 1 for a, b in zip([-1] + drafted, drafted)]
    assert gaps == [8, 16, 32, 64, 64, 64][: len(gaps)] and len(gaps) == 6
    assert method.probe_every == method.MAX_PROBE_EVERY
    method.history.extend([(1.0, 1.0, 1, 3)] * method.HISTORY)  # the text turned predictable: 4 tokens per cycle
    method.skipped = method.probe_every  # the next cycle probes, and drafting pays after it
    assert cycles(5, accepted=3) == [0, 1, 2, 3, 4]
    assert method.probe_every == method.PROBE_EVERY


def test_online_calibration_lookahead_and_no_skipping_stay_lossless(offloaded, oracle, prompts, limits, ar):
    """specfit-ca with every option beyond the paper: AR's tokens, every cycle drafts, and the calibration counted
    the verified nodes whose parent was committed."""
    model, engine = offloaded
    config = MethodConfig("specfit-ca", calibration="online", lookahead=True, skip=False)
    method = SpecFitCA(config, B, 0.05, 0.01, DraftCost(0.0, 0.0, 0.0), SharedExpert(), num_experts=8)
    method.drafting_pays = lambda: False  # skipping would verify the root alone from the fifth cycle on
    results = run(model, oracle, method, prompts, limits, engine, ar)
    assert [r.request["output_ids"] for r in results] == ar
    cycles = [c for r in results for c in r.cycles if r is results[-1]]
    assert all(len(c["pool_token"]) > 1 for c in cycles[:-1])  # drafted every cycle (the last may have no room)
    trials = method.calibration.trials.sum()
    assert trials >= sum(1 for c in cycles if c["selected"]) and method.calibration.accepted.sum() > 0


@pytest.mark.parametrize("lookahead", [False, True])
def test_lookahead_drafts_on_where_a_chain_pays_and_no_level_does(lookahead):
    """No subtree of level 1 beats the root alone (1.9 / 1.95 < 1: the paper's rule stops); the level-1 node and one
    more below it, at the expected rate 1/2, would reach (1 + 0.9 + 0.45) / 2.1 > 1."""
    pool = CandidatePool([5])
    pool.add(0, 6, 0.9)
    pool.add(0, 7, 0.05)
    b = [1.0, 1.95, 2.1, 2.2, 2.2, 2.2, 2.2, 2.2]
    method = SpecFit(MethodConfig("specfit", lookahead=lookahead), b, 0.0, SharedExpert(), 8)
    view = method.view(None, pool)
    chosen = method.choose(view, 1)
    assert chosen.nodes == ()
    assert method.draft_on(view, chosen, 1) is lookahead


def test_each_kind_has_its_own_defaults_and_an_entry_overrides_them():
    from specfit.speculative.online import SpecFitOnline

    def online(**options):
        return SpecFitOnline(MethodConfig("specfit-online", **options), B, 0.05, 0.01, DraftCost(0.0, 0.0, 0.0),
                             SharedExpert(), num_experts=8)

    mine = online()
    assert mine.calibration is not None and mine.option("lookahead") and not mine.option("skip")
    plain = online(calibration="none", lookahead=False, skip=True)
    assert plain.calibration is None and not plain.option("lookahead") and plain.option("skip")
    assert ca(None).option("skip") and ca(None).calibration is None and not ca(None).option("lookahead")
    paper = SpecFit(MethodConfig("specfit"), B, 0.05, SharedExpert(), 8)
    assert paper.calibration is None and not paper.option("lookahead")


class CountingRoutes(SharedExpert):
    """`SharedExpert`, counting the calls."""

    def __init__(self):
        self.calls = 0

    def routes(self, cycle, pool):
        self.calls += 1
        return super().routes(cycle, pool)


@pytest.mark.parametrize(("beta_miss", "beta_hit", "asked"), [(0.0, 8.9e-16, False), (0.0, 0.01, True),
                                                                (0.05, 0.0, True)])
def test_a_learned_source_is_asked_nothing_when_the_cost_has_no_expert_term(beta_miss, beta_hit, asked):
    """A resident device's per-pair gather fits β = 0 (NNLS leaves ~1e-16): routes cannot change the cost there, so
    the selector predicts none (host work for nothing), and selects as it would with them, up to exact ties."""
    source = CountingRoutes()
    config = MethodConfig("specfit-ca", routes="learned", k_max=4)
    method = SpecFitCA(config, B, beta_miss, beta_hit, DraftCost(0.0, 0.0, 0.0), source, num_experts=8)
    pool = CandidatePool.root_only(5)
    for token, prob in ((6, 0.9), (7, 0.05)):
        pool.add(0, token, prob)
    pool.add(1, 8, 0.8)
    chosen = method.select(None, pool, final=True)
    assert method.asks_routes is asked and (source.calls > 0) is asked
    assert chosen.nodes == (1, 3)  # p 0.9 and 0.72 pay; 0.05 does not
    atlas = SpecFitCA(CONFIG, B, beta_miss, beta_hit, DraftCost(0.0, 0.0, 0.0), CountingRoutes(), num_experts=8)
    assert atlas.asks_routes  # an atlas source is always asked (the paper's measurement, the atlas build)
