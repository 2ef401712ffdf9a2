"""The theory stage on a real SpecFit run (atlas build, measured run with atlas routes, Table 5) and, beyond the
paper, on a real specfit-ca run under its cache-aware cost."""

import json
import os

import pyarrow.parquet as pq
import pytest

from specfit.stages import atlas, decode, theory

DEVICE = os.environ.get("SPECFIT_TEST_DEVICE", "cpu")  # scripts/gpu_check.sh: cuda


def theory_of(files, out, method: str, cost: str, emulate: dict | None = None):
    """Atlas build, measured run and the theory stage on it; returns the measured run's files and the table."""
    spec = {"method": {"name": method}, "slots": 4, "max_inflight": 2, "link": None, "emulate": emulate,
            "torch_device": DEVICE, "dtype": "float32", "limit_tokens": 40, "max_new_tokens": 16, "seed": 0,
            "warmup_tokens": 3, "model": "tiny", "logits_dtype": "model", "verify": "exact"}
    build = {k: out / f"build.{k}" for k in ("atlas", "requests", "cycles", "metrics")}
    atlas.run(spec, files, build)
    measured = {k: out / f"run.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(spec, dict(files, atlas=build["atlas"]), measured)
    table = out / "theory.json"
    theory.run({"beta_multiplier": 2.0, "k_max": 7, "max_depth": 5, "limit_tokens": spec["limit_tokens"],
                "max_new_tokens": spec["max_new_tokens"], "cost": cost},
               {"cycles": measured["cycles"], "requests": measured["requests"], "atlas": build["atlas"],
                "coefficients": files["coefficients"]}, {"theory": table})
    return measured, json.loads(table.read_text())


@pytest.fixture(scope="module")
def run(files, tmp_path_factory):
    return theory_of(files, tmp_path_factory.mktemp("theory"), "specfit", "paper")


@pytest.fixture(scope="module")
def run_ca(files, tmp_path_factory):
    """specfit-ca with a cache-aware fit (hits cheaper than misses) and a drafting fit."""
    out = tmp_path_factory.mktemp("theory_ca")
    coefficients = out / "coefficients.json"
    fit = {"b": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7], "beta_miss": 0.08, "beta_hit": 0.01}
    drafting = {"start_ms": 0.3, "level_ms": 0.2, "select_ms": 0.05}
    coefficients.write_text(json.dumps({**json.loads(files["coefficients"].read_text()), "drafting": drafting,
                                        "cache_aware": {**fit, "without_drafting": fit}}))
    return theory_of(dict(files, coefficients=coefficients), out, "specfit-ca", "cache_aware")


@pytest.fixture(scope="module")
def run_prefetch(files, tmp_path_factory):
    """specfit-prefetch on an emulated device whose copies (50 ms each) outlast a drafted level by far (0.2 ms
    modelled, a few of CPU; tens on a machine loaded with other work), with a drafting fit that budgets two copies
    per level (100.05 ms) and a verify cost so large (b ~ 10 s) that the tiny random drafter's levels still pay:
    prefetched experts are in flight when the next level selects."""
    out = tmp_path_factory.mktemp("theory_prefetch")
    coefficients = out / "coefficients.json"
    fit = {"b": [10000.0 + 0.1 * k for k in range(8)], "beta_miss": 0.8, "beta_hit": 0.01}
    drafting = {"start_ms": 0.3, "level_ms": 100.0, "select_ms": 0.05}
    coefficients.write_text(json.dumps({**json.loads(files["coefficients"].read_text()), "drafting": drafting,
                                        "cache_aware": {**fit, "without_drafting": fit}}))
    emulate = {"name": "test GPU", "fixed_ms": 0.2, "token_ms": 0.01, "expert_ms": 0.01, "copy_ms": 50.0,
               "draft_ms": 0.2}
    return theory_of(dict(files, coefficients=coefficients), out, "specfit-prefetch", "cache_aware", emulate)


def test_table_5_on_recorded_pools(run):
    measured, table = run
    cycles = sorted(pq.read_table(measured["cycles"]).to_pylist(), key=lambda c: (c["request_id"], c["cycle"]))
    assert table["cycles"] == len(cycles) > 0  # every cycle, root-only ones at the length limit included
    assert table["empty_pool_cycles"] == sum(len(c["pool_parent"]) == 1 for c in cycles)
    # the selector rerun on each recorded pool with the atlas routes reproduces every recorded selection
    assert table["recorded_selection_differs_pct"] == 0.0
    assert 0.0 <= table["gap_pct"] <= table["bound_pct"] + 1e-9
    assert table["theta"] <= table["lambda_star"]
    assert table["union_per_reward_2beta"] <= table["union_per_reward_beta"] + 1e-9
    levels = [c["drafted_levels"] for c in cycles]
    assert table["drafted_levels_mean"] == pytest.approx(sum(levels) / len(levels))
    # at most 16 new tokens: the last cycles of a request may draft at most (room - 1) levels
    caps, position = [], {}
    for c in cycles:
        start = position.get(c["request_id"], 0)
        position[c["request_id"]] = start + c["committed"]
        caps.append(max(0, min(5, 16 - (start + 1) - 1, 40 - c["prefix_len"] - 2)))
    assert table["length_limited_cycles"] == sum(cap < 5 for cap in caps) > 0
    assert all(lv <= cap for lv, cap in zip(levels, caps))
    stopped = sum(lv < cap for lv, cap in zip(levels, caps))
    assert table["stopped_early_pct"] == pytest.approx(100 * stopped / len(levels))


def test_table_5_under_the_cache_aware_cost(run_ca):
    measured, table = run_ca
    cycles = pq.read_table(measured["cycles"]).to_pylist()
    assert table["cost"] == "cache_aware" and (table["beta_miss"], table["beta_hit"], table["drafting"]) == (
        0.08, 0.01, {"start_ms": 0.3, "level_ms": 0.2, "select_ms": 0.05})
    assert table["cycles"] == len(cycles) > 0
    drafted = [c for c in cycles if len(c["pool_parent"]) > 1]
    assert drafted and all(c["resident"] is not None for c in drafted)
    assert table["empty_pool_cycles"] == len(cycles) - len(drafted)
    # skipped cycles record the residency too; only those the length limit left without room record none
    assert table["cycles_without_residency"] == sum(c["resident"] is None for c in cycles) > 0
    assert all(c["drafted_levels"] == 0 for c in cycles if c["resident"] is None)
    assert table["atlas_nodes_missed"] == 0  # the skipped cycles' roots too are in the atlas
    # the recorded residency, intercepts b_k + D(d) and coefficients reproduce every selection specfit-ca made
    assert table["recorded_selection_differs_pct"] == 0.0
    assert 0.0 <= table["gap_pct"] <= table["bound_pct"] + 1e-9
    assert table["theta"] <= table["lambda_star"]
    assert 0.0 <= table["misses_per_reward_beta"] <= table["union_per_reward_beta"]


def test_accepted_paths_extend_past_the_verified_subtree():
    # root 0 -> 1 -> 3 matches the continuation [a, c]; only node 1 was verified
    path = theory.accepted_path_in_pool([-1, 0, 0, 1, 1], [9, 10, 11, 12, 13], [10, 12, 99])
    assert path == (1, 3)
    assert theory.committed((1,), path) == 2 and theory.committed((1, 3), path) == 3


def test_table_5_under_the_prefetching_cost_with_the_copies_in_flight(run_prefetch):
    measured, table = run_prefetch
    cycles = pq.read_table(measured["cycles"]).to_pylist()
    metrics = json.loads(measured["metrics"].read_text())
    assert metrics["prefetch"]["issued"] > 0
    flying = [c for c in cycles if c["in_flight"] is not None]
    assert flying, "no cycle selected while a prefetched copy was in flight"
    for c in flying:  # per layer one fraction per resident expert, some of a copy still to come
        assert [len(f) for f in c["in_flight"]] == [len(r) for r in c["resident"]]
        assert all(0.0 <= x <= 1.0 for f in c["in_flight"] for x in f) and any(x > 0 for f in c["in_flight"] for x in f)
    assert table["cost"] == "cache_aware" and table["cycles"] == len(cycles)
    # the recorded residency and copies in flight, with the method's cost, reproduce every selection it made
    assert table["recorded_selection_differs_pct"] == 0.0
    assert 0.0 <= table["gap_pct"] <= table["bound_pct"] + 1e-9
