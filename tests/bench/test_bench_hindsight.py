"""`python -m specfit.bench hindsight`'s parts: EAGLE-3 verifying a whole pool makes every drafted node whose parent
is committed a trial, and a decode whose online calibration starts from those counts stays AR's."""

import json

import numpy as np

from specfit.bench.hindsight import counts_of, decode, start_calibration, whole_pool
from specfit.speculative.config import MethodConfig
from specfit.speculative.stream import StreamSpec, run_stream


def spec(name, **method):  # a tiny decode stream (as tests/test_decode.py's)
    return {"method": {"name": name, **method}, "slots": 4, "max_inflight": 2, "link": None, "emulate": None,
            "torch_device": "cpu", "dtype": "float32", "limit_tokens": 40, "max_new_tokens": 12, "seed": 0,
            "warmup_tokens": 3, "model": "tiny", "logits_dtype": "model", "verify": "exact"}


def test_the_whole_pool_is_the_papers_18_nodes_at_depth_5_width_2():
    pool = whole_pool(MethodConfig("specfit-online", max_depth=5, top_k_expand=2, k_max=16))
    assert (pool.name, pool.max_depth, pool.top_k_expand, pool.k_max) == ("eagle3", 5, 2, 18)
    assert whole_pool(MethodConfig("specfit-online", max_depth=3, top_k_expand=4)).k_max == 4 + 2 * 16


def test_every_drafted_node_is_verified_and_counted_and_a_started_calibration_stays_lossless(files, tmp_path):
    inputs = {k: files[k] for k in ("prompts", "target", "drafter")}
    _, ar_requests, _ = decode(spec("ar"), inputs, tmp_path / "ar")
    method = whole_pool(MethodConfig("specfit-online", max_depth=3, top_k_expand=2))
    _, _, cycles = decode(dict(spec("eagle3"), method=vars(method)), inputs, tmp_path / "whole")
    trials = 0
    for c in cycles:
        drafted = list(range(1, len(c["pool_parent"])))
        assert c["selected"] == drafted  # the whole pool, every cycle
        committed = {0, *c["accepted_path"]}
        trials += sum(c["pool_parent"][v] in committed for v in drafted)
    counts = counts_of(cycles, method.max_depth)
    assert counts["trials"].sum() == trials > 0
    assert counts["accepted"].sum() == sum(len(c["accepted_path"]) for c in cycles)

    # the selector reads the target's own routes as it goes (no atlas or predictor for the tiny pair)
    online = spec("specfit-online", max_depth=3, top_k_expand=2, k_max=7, routes="live")
    started = []

    def prepare(loaded):
        start_calibration(counts)(loaded)
        started.append(loaded.method.calibration)

    out = {name: tmp_path / f"hindsight.{name}.{ext}" for name, ext in
           (("requests", "parquet"), ("cycles", "parquet"), ("metrics", "json"), ("atlas", "parquet"))}
    run_stream(StreamSpec.from_dict(online), dict(files, reference=tmp_path / "ar" / "requests.parquet"), out, prepare)
    metrics = json.loads(out["metrics"].read_text())
    assert metrics["lossless"]["n_identical"] == len(ar_requests) == 2
    assert all(np.array_equal(started[0].start[k], counts[k]) for k in counts)  # what its reset returns to
