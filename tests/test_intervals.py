"""Bootstrap intervals of decode TPS and of TPS ratios, and the fresh / repeated 4-gram split of cycles."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from specfit.results.intervals import PROCESS_SPREAD, products_ratio_interval, ratio_interval, tps_interval, verdict
from specfit.results.ngrams import cycle_kinds, seen_before, split, stream_split


def request(rid, n_output, t_decode, t_prefill=0.5):
    return {"request_id": rid, "n_output": n_output, "t_request_s": t_prefill + t_decode, "t_prefill_s": t_prefill}


def stream(rng, n=30, scale=1.0):
    """Requests of very different lengths: decode tokens 5..200, 20-60 ms per token."""
    tokens = rng.integers(5, 200, n)
    return [request(i, int(k) + 1, float(k * rng.uniform(0.02, 0.06) * scale)) for i, k in enumerate(tokens)]


# ------------------------------------------------------------------------------------ tps_interval
def test_tps_value_is_decode_tps_of_stream_metrics():
    rows = [request(0, 11, 1.5, t_prefill=0.5), request(1, 5, 0.75, t_prefill=0.25)]
    out = tps_interval(rows)
    assert out["value"] == pytest.approx((16 - 2) / (1.5 + 0.75))
    assert out["n"] == 2
    assert out["low"] <= out["value"] <= out["high"]
    # resamples are {0,0}, {0,1}, {1,1}: 10/1.5, 14/2.25 and 4/0.75; the 95% interval spans most of that range
    assert 4 / 0.75 <= out["low"] < 14 / 2.25 < out["high"] <= 10 / 1.5


def test_tps_one_request_collapses_and_empty_is_an_error():
    out = tps_interval([request(7, 21, 2.0)])
    assert out == {"value": 10.0, "low": 10.0, "high": 10.0, "n": 1}
    with pytest.raises(ValueError, match="at least one request"):
        tps_interval([])
    with pytest.raises(ValueError, match="decode time"):
        tps_interval([request(0, 3, 0.0)])


def test_tps_is_deterministic_for_a_seed():
    rows = stream(np.random.default_rng(1))
    assert tps_interval(rows, seed=3) == tps_interval(rows, seed=3)
    assert tps_interval(rows, seed=3) != tps_interval(rows, seed=4)
    narrow, wide = tps_interval(rows, level=0.5), tps_interval(rows, level=0.99)
    assert wide["low"] < narrow["low"] < narrow["value"] < narrow["high"] < wide["high"]


def test_tps_interval_covers_the_true_throughput():
    """Streams of 40 requests from a population whose TPS is E[tokens] / E[seconds] = 1 / E[s per token] = 25."""
    rng = np.random.default_rng(0)
    hits, trials = 0, 300
    for t in range(trials):
        k = 1 + rng.poisson(40, 40)
        rows = [request(i, int(k[i]) + 1, float(k[i] * rng.uniform(0.02, 0.06))) for i in range(40)]
        ci = tps_interval(rows, seed=t, n_boot=500)
        hits += ci["low"] <= 25.0 <= ci["high"]
    assert 0.88 <= hits / trials <= 0.99, hits / trials


# ------------------------------------------------------------------------------------ ratio_interval
def test_identical_runs_tie_at_one():
    rows = stream(np.random.default_rng(2))
    out = ratio_interval(rows, list(reversed(rows)))  # matched by request_id, not by order
    assert out == {"value": 1.0, "low": 1.0, "high": 1.0, "n": 30, "verdict": "tie"}


def test_a_run_twice_as_fast_on_every_request():
    slow = stream(np.random.default_rng(3))
    fast = [dict(r, t_request_s=r["t_prefill_s"] + (r["t_request_s"] - r["t_prefill_s"]) / 2) for r in slow]
    out = ratio_interval(fast, slow)
    assert out["value"] == pytest.approx(2.0, rel=1e-12)
    assert out["low"] == pytest.approx(2.0, rel=1e-12) and out["high"] == pytest.approx(2.0, rel=1e-12)
    assert out["verdict"] == "faster" and out["n"] == 30
    back = ratio_interval(slow, fast)
    assert back["value"] == pytest.approx(0.5) and back["verdict"] == "slower"


def test_noisy_runs_whose_interval_spans_one_tie():
    base = stream(np.random.default_rng(4))
    # half the requests 25% slower, half 25% faster on the clock (same length): the total time is the same
    other = [dict(r, t_request_s=r["t_prefill_s"] + (r["t_request_s"] - r["t_prefill_s"]) * (0.75 if i % 2 else 1.25))
             for i, r in enumerate(base)]
    out = ratio_interval(other, base)
    assert out["low"] < 1.0 < out["high"]
    assert out["verdict"] == "tie"
    assert 0.9 < out["value"] < 1.1


def test_a_spread_between_processes_widens_the_interval_in_quadrature():
    """A run 3% faster on every request: faster with no spread; timed in two processes whose log ratio has sd
    PROCESS_SPREAD, the interval is value * exp(±1.96 * PROCESS_SPREAD) (the bootstrap's own width is 0), so 1.03
    becomes a tie."""
    slow = stream(np.random.default_rng(6))
    fast = [dict(r, t_request_s=r["t_prefill_s"] + (r["t_request_s"] - r["t_prefill_s"]) / 1.03) for r in slow]
    assert ratio_interval(fast, slow)["verdict"] == "faster"
    out = ratio_interval(fast, slow, spread=PROCESS_SPREAD)
    half = 1.959964 * PROCESS_SPREAD
    assert out["low"] == pytest.approx(1.03 * np.exp(-half), rel=1e-6)
    assert out["high"] == pytest.approx(1.03 * np.exp(half), rel=1e-6)
    assert out["verdict"] == "tie"
    twice = ratio_interval([dict(r, t_request_s=r["t_prefill_s"] + (r["t_request_s"] - r["t_prefill_s"]) / 2)
                            for r in slow], slow, spread=PROCESS_SPREAD)
    assert twice["verdict"] == "faster"  # a real difference survives


def test_pairing_removes_the_spread_between_prompts():
    """10% faster on every prompt, ±1% noise: each run's own interval is wide, the paired ratio's is narrow."""
    rng = np.random.default_rng(5)
    base = stream(rng, n=25)
    fast = [dict(r, t_request_s=r["t_prefill_s"] + (r["t_request_s"] - r["t_prefill_s"]) / 1.1
                 * rng.uniform(0.99, 1.01)) for r in base]
    a, b = tps_interval(fast), tps_interval(base)
    assert a["low"] < b["high"]  # the two runs' intervals overlap
    out = ratio_interval(fast, base)
    assert 1.08 < out["low"] < out["value"] < out["high"] < 1.12
    assert out["verdict"] == "faster"


def test_ratio_matches_requests_by_id_and_checks_its_inputs():
    num = [request(0, 11, 1.0), request(1, 21, 1.0), request(5, 9, 1.0)]
    den = [request(1, 11, 1.0), request(0, 6, 1.0), request(2, 99, 1.0)]
    out = ratio_interval(num, den, seed=1)
    assert out["n"] == 2  # ids 0 and 1
    assert out["value"] == pytest.approx((10 + 20) / (10 + 5))
    # resamples: {0,0} 10/5, {0,1} 30/15, {1,1} 20/10: every resample says 2
    assert out["low"] == pytest.approx(2.0) and out["high"] == pytest.approx(2.0) and out["verdict"] == "faster"
    assert ratio_interval(num, den, seed=1) == out
    one = ratio_interval([request(3, 11, 2.0)], [request(3, 11, 1.0)])
    assert one == {"value": 0.5, "low": 0.5, "high": 0.5, "n": 1, "verdict": "slower"}
    with pytest.raises(ValueError, match="no request_id in common"):
        ratio_interval([request(0, 5, 1.0)], [request(1, 5, 1.0)])
    with pytest.raises(ValueError, match="no request_id in common"):
        ratio_interval([], [])
    with pytest.raises(ValueError, match="appears twice"):
        ratio_interval([request(0, 5, 1.0), request(0, 6, 1.0)], [request(0, 5, 1.0)])


def ratio_of_ratios_interval(a, b, c, d, **kw):
    return products_ratio_interval([a, d], [b, c], **kw)


def test_a_ratio_of_ratios_pairs_all_four_runs():
    """(a / b) / (c / d): the gain a / b is 1.3x on every prompt, c / d 1.2x, each run's own time ±30% per prompt
    (the same prompt slow for all four): the ratio of the gains is 1.3 / 1.2 with a narrow interval, on the ids all
    four hold; the spread of runs timed apart widens it as in `ratio_interval`."""
    rng = np.random.default_rng(7)
    d = stream(rng, n=20)

    def faster(rows, x, noise=0.0):
        return [dict(r, t_request_s=r["t_prefill_s"] + (r["t_request_s"] - r["t_prefill_s"]) / x
                     * rng.uniform(1 - noise, 1 + noise)) for r in rows]

    b = faster(d, 0.9, 0.01)
    a, c = faster(b, 1.3, 0.01), faster(d, 1.2, 0.01)
    out = ratio_of_ratios_interval(a, b, c, d, seed=3)
    assert out["n"] == 20
    assert out["value"] == pytest.approx(ratio_interval(a, b)["value"] / ratio_interval(c, d)["value"])
    assert 1.3 / 1.2 * 0.97 < out["low"] < out["value"] < out["high"] < 1.3 / 1.2 * 1.03
    assert out["verdict"] == "faster"
    assert ratio_of_ratios_interval(c, d, a, b, seed=3)["verdict"] == "slower"
    wide = ratio_of_ratios_interval(a, b, c, d, seed=3, spread=2 ** 0.5 * PROCESS_SPREAD)
    assert wide["low"] < out["low"] and wide["high"] > out["high"] and wide["value"] == out["value"]
    assert ratio_of_ratios_interval(a[:5], b, c, d[2:])["n"] == 3  # ids 2, 3, 4
    with pytest.raises(ValueError, match="present in all runs"):
        ratio_of_ratios_interval(a[:2], b, c, d[2:])


def test_verdict_needs_the_whole_interval_on_one_side():
    assert verdict(1.01, 1.2) == "faster"
    assert verdict(0.97, 1.09) == "tie"
    assert verdict(1.0, 1.2) == "tie"
    assert verdict(0.8, 0.99) == "slower"


def test_the_helpers_do_not_import_torch():
    code = "import sys, specfit.results.intervals, specfit.results.ngrams; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------ fresh vs repeated 4-grams
PROMPT = [10, 11, 12, 13, 9]  # P = 5; it holds the output's first 4-gram, which must not count
#          0   1   2   3   4   5   6   7   8   9  10   output position
OUTPUT = [10, 11, 12, 13, 10, 11, 12, 13, 14, 10, 11]
# a cycle with prefix_len L commits from output position L - P + 1 (output[0] is prefill's; the root is not
# in the KV cache at the cycle's start): positions 1-2, 3, 4-6, 7-9, 10
CYCLES = [{"prefix_len": 5, "committed": 2}, {"prefix_len": 7, "committed": 1}, {"prefix_len": 8, "committed": 3},
          {"prefix_len": 11, "committed": 3}, {"prefix_len": 14, "committed": 1}]


def test_seen_before_marks_4grams_that_already_ended_earlier():
    assert seen_before(OUTPUT) == [False] * 7 + [True] + [False] * 3
    assert seen_before([5] * 6) == [False, False, False, False, True, True]  # overlapping repeats count


def repeat_split(prompt_ids, output_ids, cycles):
    return split(cycle_kinds(prompt_ids, output_ids, cycles), [c["committed"] for c in cycles])


def test_cycle_kinds_on_a_hand_built_request():
    assert sum(c["committed"] for c in CYCLES) == len(OUTPUT) - 1
    # position 1: too few tokens before it; 3: (10, 11, 12, 13) is in the prompt but first in the output;
    # 7: (10, 11, 12, 13) ended at position 3 (a loop); 10: (13, 14, 10, 11) is new
    assert cycle_kinds(PROMPT, OUTPUT, CYCLES) == ["fresh", "fresh", "fresh", "repeated", "fresh"]
    assert repeat_split(PROMPT, OUTPUT, CYCLES) == {
        "committed_per_cycle_fresh": (2 + 1 + 3 + 1) / 4, "committed_per_cycle_repeated": 3.0,
        "cycles_fresh": 4, "cycles_repeated": 1}
    # one token of run-on: every cycle after the first 4-gram starts in a loop
    runs = [{"prefix_len": 3 + j, "committed": 1} for j in range(5)]  # P = 3, positions 1..5
    assert cycle_kinds([1, 2, 3], [5] * 6, runs) == ["fresh", "fresh", "fresh", "repeated", "repeated"]
    assert repeat_split([1, 2, 3], [5] * 6, runs)["committed_per_cycle_repeated"] == 1.0
    assert repeat_split([1, 2, 3], [5, 6], [{"prefix_len": 3, "committed": 1}]) == {
        "committed_per_cycle_fresh": 1.0, "committed_per_cycle_repeated": None, "cycles_fresh": 1,
        "cycles_repeated": 0}


def test_cycles_that_do_not_fit_the_request_are_an_error():
    with pytest.raises(ValueError, match="does not fit"):
        cycle_kinds(PROMPT, OUTPUT, [{"prefix_len": 14, "committed": 2}])  # positions 10-11 of 11 tokens
    with pytest.raises(ValueError, match="does not fit"):
        cycle_kinds(PROMPT, OUTPUT, [{"prefix_len": 3, "committed": 1}])  # before the prompt's end


def test_stream_split_and_the_decode_metrics():
    from specfit.results.metrics import stream_metrics
    from specfit.results.records import CYCLE_SCHEMA

    prompts = [{"request_id": 0, "prompt_ids": PROMPT}, {"request_id": 1, "prompt_ids": [1, 2, 3]}]
    requests = [
        {"request_id": 0, "question_id": 0, "output_ids": OUTPUT, "n_output": len(OUTPUT), "t_request_s": 1.5,
         "t_prefill_s": 0.5, "h2d_transfers": 10},
        {"request_id": 1, "question_id": 1, "output_ids": [5] * 6, "n_output": 6, "t_request_s": 2.5,
         "t_prefill_s": 0.5, "h2d_transfers": 10},
    ]
    cycles = [{"request_id": 0, **c} for c in CYCLES] + [{"request_id": 1, "prefix_len": 3 + j, "committed": 1}
                                                          for j in range(5)]
    expected = {"committed_per_cycle_fresh": (2 + 1 + 3 + 1 + 1 + 1 + 1) / 7,
                "committed_per_cycle_repeated": (3 + 1 + 1) / 3, "cycles_fresh": 7, "cycles_repeated": 3}
    assert stream_split(prompts, requests, cycles) == expected
    with pytest.raises(ValueError, match="does not hold"):
        stream_split(prompts, requests[:1], cycles)

    full = [{"cycle": i, "pool_parent": [-1], "pool_token": [0], "pool_prob": [1.0], "pool_level": [0],
             "selected": [], "drafted_levels": 0, "accepted": c["committed"] - 1, "accepted_path": [],
             "t_draft_s": 0.0, "t_select_s": 0.0, "t_verify_s": 0.1, "t_commit_s": 0.0, "h2d_transfers": 1, **c}
            for i, c in enumerate(cycles)]
    table = pa.Table.from_pylist(full, schema=CYCLE_SCHEMA)
    m = stream_metrics(requests, table, prompts, seed=0)
    assert {k: m[k] for k in expected} == expected
    assert m["tps_dec"] == pytest.approx((17 - 2) / (1.0 + 2.0))
    ci = tps_interval(requests, seed=0)
    assert (m["tps_dec_low"], m["tps_dec_high"]) == (ci["low"], ci["high"])
    assert m["tps_dec_low"] < m["tps_dec"] < m["tps_dec_high"]
    bare = stream_metrics(requests, table)
    assert bare["cycles_fresh"] is None and bare["committed_per_cycle_repeated"] is None
    # the parts of a cycle (ms, means over cycles) and the cycles that drafted nothing (every one here: root only)
    assert (m["verify_ms_per_cycle"], m["select_ms_per_cycle"], m["commit_ms_per_cycle"]) == (
        pytest.approx(100.0), 0.0, 0.0)
    assert m["cycles_without_draft"] == m["cycles"] == len(cycles)
    drafted = table.set_column(table.schema.get_field_index("pool_token"), "pool_token",
                               pa.array([[0, 7]] + [[0]] * (len(cycles) - 1), pa.list_(pa.int64())))
    assert stream_metrics(requests, drafted)["cycles_without_draft"] == len(cycles) - 1


def test_the_spread_follows_who_timed_the_runs():
    """An emulated device's run (device model in metrics.json) or a GPU's carries PROCESS_SPREAD; a run the CPU
    timed itself (a link-only emulation, or plain CPU copies) the wider CPU_SPREAD, and so does any ratio with one."""
    from specfit.results.intervals import CPU_SPREAD, cpu_timed, process_spread

    device = {"device": {"label": "emulated A100"}, "timing_label": "emulated A100 (expert execution + link)"}
    link = {"device": None, "timing_label": "emulated link (0.175 GB/s, 50 us latency, waited)"}
    gpu = {"timing_label": "cuda H2D (pinned host, copy streams)"}
    cpu = {"timing_label": "cpu memory copies (no link)"}
    assert [cpu_timed(m) for m in (device, link, gpu, cpu)] == [False, True, False, True]
    assert process_spread(device, gpu) == PROCESS_SPREAD < CPU_SPREAD == process_spread(device, link)
    assert process_spread(cpu, cpu) == CPU_SPREAD
