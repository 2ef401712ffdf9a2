"""A fake workflow folder for the report: a tiny config and the files its stages would write. The files the report
rule declares come from `specfit.planning.matrix.report_inputs`, which the tests call as the rule does."""

import json
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from specfit.planning import paths
from specfit.planning.matrix import DecodeRun, decode_runs, method_kind, theory_cost, theory_file, theory_runs

DEVICE = "cpu-a100link"
N_REQUESTS = 6  # per fake run; the same request ids and output lengths in every run (lossless methods)


def tiny_spec(methods=("ar", "eagle3", "specfit"), slots=(0, 4), devices=(DEVICE,), workload="gsm8k",
              paper=None) -> dict:
    """One workload (``workload``, GSM8K questions 401-402; ``paper``: its config key of that name)."""
    all_methods = {
        "ar": {"kind": "ar"},
        "eagle3": {"kind": "eagle3", "k_max": 7, "max_depth": 5, "top_k_expand": 2},
        "specfit": {"kind": "specfit", "k_max": 7, "max_depth": 5, "top_k_expand": 2, "routes": "atlas"},
        "specfit-noisy": {"kind": "specfit", "k_max": 7, "max_depth": 5, "top_k_expand": 2, "routes": "noisy",
                          "accuracy": 0.6},
        "specfit-ca": {"kind": "specfit-ca", "k_max": 7, "max_depth": 5, "top_k_expand": 2, "routes": "atlas"},
        "specfit-learned": {"kind": "specfit", "k_max": 7, "max_depth": 5, "top_k_expand": 2, "routes": "learned"},
        "specfit-ca-learned": {"kind": "specfit-ca", "k_max": 7, "max_depth": 5, "top_k_expand": 2,
                               "routes": "learned"},
        "specfit-prefetch": {"kind": "specfit-prefetch", "k_max": 7, "max_depth": 5, "top_k_expand": 2,
                             "routes": "learned"},
        "specfit-prefetch-atlas": {"kind": "specfit-prefetch", "k_max": 7, "max_depth": 5, "top_k_expand": 2,
                                   "routes": "atlas"},
        "eagle3-prefetch": {"kind": "eagle3-prefetch", "k_max": 7, "max_depth": 5, "top_k_expand": 2,
                            "routes": "learned"},
    }
    return {
        "workloads": {workload: {"question_ids": {"start": 401, "stop": 402, "step": 1}, "limit_tokens": 512,
                                 "max_new_tokens": 16, "max_requests": 2,
                                 "subset_label": "toy subset: first 2 GSM8K questions",
                                 **({} if paper is None else {"paper": paper})}},
        "models": {"toy": {"target": "data/models/toy/target", "drafter": "data/models/toy/drafter",
                           "dtype": "float32", "toy": True, "main_slots": {d: 4 for d in devices}}},
        "devices": {d: {"torch_device": "cpu", "max_inflight": 2, "link": {"bandwidth_gbps": 1.5, "latency_us": 50},
                        "label": f"CPU, link emulated ({d})", "coefficients": "fit", "gpu": ""} for d in devices},
        "methods": {m: all_methods[m] for m in methods},
        "runs": [{"models": ["toy"], "devices": list(devices), "workloads": [workload], "methods": list(methods),
                  "slots": list(slots)}],
        "calibration": {"question_ids": [401, 402, 403], "cycle_boundaries": [0, 4, 8], "sizes": 8, "repeats": 2},
        "theory": {"beta_multiplier": 2.0},
        "seed": 0,
    }


def fake_requests(rng, lengths, speed: float) -> list[dict]:
    """Rows of requests.parquet: ``speed`` decode tokens per second, ±25% per request."""
    rows = []
    for rid, n_output in enumerate(lengths):
        prefill = float(rng.uniform(0.05, 0.2))
        decode = (n_output - 1) / speed * float(rng.uniform(0.8, 1.25))
        rows.append({"request_id": rid, "question_id": 401 + rid, "output_ids": list(range(n_output)),
                     "n_output": n_output, "t_request_s": prefill + decode, "t_prefill_s": prefill,
                     "h2d_transfers": int(rng.integers(10, 100))})
    return rows


def decode_tps(rows) -> float:
    """As specfit.results.metrics.stream_metrics computes it."""
    return (sum(r["n_output"] for r in rows) - len(rows)) / sum(r["t_request_s"] - r["t_prefill_s"] for r in rows)


def request_tps(rows) -> float:
    """Eq. 10's TPS_req as `specfit.results.metrics.stream_metrics` computes it: all output over whole requests."""
    return sum(r["n_output"] for r in rows) / sum(r["t_request_s"] for r in rows)


def write_requests(root: Path, run, rows) -> None:
    pq.write_table(pa.Table.from_pylist(rows), root / run.file("requests.parquet"))


def fake_metrics(rng, run, spec, rows) -> dict:
    rule = method_kind(spec, run.method).name
    lossless = None
    if rule != "ar":
        divergences = [{"request_id": 1, "position": 7, "margin": 0.0123}] if rule == "specfit" and run.slots else []
        lossless = {"reference": f"data/decode/toy/{run.device}/{run.workload}/ar/slots0/requests.parquet",
                    "n_requests": 2, "n_identical": 2 - len(divergences), "missing": 0, "divergences": divergences}
    fresh = int(rng.integers(5, 100))
    return {
        "tps_dec": decode_tps(rows), "tps_req": request_tps(rows),
        "draft_nodes_per_cycle": 0.0 if rule == "ar" else float(rng.uniform(1, 7)),
        "committed_per_cycle": 1.0 if rule == "ar" else float(rng.uniform(1, 5)),
        "committed_per_cycle_fresh": 1.0 if rule == "ar" else float(rng.uniform(1, 4)),
        "committed_per_cycle_repeated": 1.0 if rule == "ar" else float(rng.uniform(2, 6)),
        "cycles_fresh": fresh, "cycles_repeated": int(rng.integers(0, fresh)),
        "cycles": int(rng.integers(10, 200)), "ms_per_cycle": float(rng.uniform(5, 500)),
        "h2d_per_token": float(rng.uniform(1, 400)), "draft_ms_per_cycle": float(rng.uniform(0, 50)),
        "verify_ms_per_cycle": float(rng.uniform(2, 400)),
        "select_ms_median": float(rng.uniform(0, 3)) if rule == "specfit" else None,
        "select_share_pct": float(rng.uniform(0, 2)) if rule == "specfit" else None,
        "lossless": lossless, "dtype": "float32",
        "verify": "batched" if lossless and lossless["divergences"] else "exact", "link_emulated": True,
        "timing_label": "emulated link (1.5 GB/s, 50 us)",
        "resumed": False, "n_requests": len(rows), "n_output_tokens": sum(r["n_output"] for r in rows),
    }


def cycle_parts(run, spec, m: dict) -> dict:
    """The later metrics.json keys (select and commit ms per cycle, cycles that drafted nothing), from an rng
    of the run's own so that the other fake numbers stay as they were."""
    rng = np.random.default_rng(zlib.crc32(run.path.encode()))
    ar = method_kind(spec, run.method).name == "ar"
    return {"select_ms_per_cycle": float(rng.uniform(0, 3)), "commit_ms_per_cycle": float(rng.uniform(0, 2)),
            "cycles_without_draft": m["cycles"] if ar else int(rng.integers(0, m["cycles"] // 2)),
            "pool_nodes_per_cycle": 0.0 if ar else float(rng.uniform(1, 14))}


def cache_aware_fit(device: str, mode: str) -> dict:
    """The calibration JSON's cache-aware keys (specfit-ca's cost), from an rng of their own so that the other fake
    numbers stay as they were; the with-cache fit meets the R² goal on the first device only."""
    rng = np.random.default_rng(zlib.crc32(f"cache-aware {device} {mode}".encode()))
    cache = mode == "cache"
    r2 = (0.95 if device == DEVICE else 0.75) if cache else 0.9
    return {"cache_aware": {"b": rng.uniform(1, 20, 8).tolist(), "beta_miss": float(rng.uniform(0.1, 1)),
                            "beta_hit": float(rng.uniform(0, 0.1)) if cache else 0.0, "r2": r2 - 0.05,
                            "rmse_ms": 1.25, "max_abs_residual_ms": 4.0, "n_points": 288, "n_probes": 144,
                            "beta_miss_identified": True, "beta_hit_identified": cache, "fit_on": "repeats",
                            "r2_means": r2, "rmse_means_ms": 0.75, "union_mismatches": 0},
            "drafting": {"start_ms": 0.6, "level_ms": 0.45, "select_ms": 0.09, "r2": 0.8, "n_points": 64}}


def fake_root(root: Path, spec: dict, seed: int = 0, speeds: dict | None = None) -> dict:
    """Writes metrics (with requests.parquet beside), calibration and theory files under ``root``; returns what it
    wrote, by path (a run's requests under ("requests", run)). ``speeds``: (method, slots) -> the decode tokens per
    second of that run on every device (others random)."""
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(8, 40, N_REQUESTS)]
    written = {}
    for run in decode_runs(spec):
        speed = float(rng.uniform(2, 12))
        rows = fake_requests(rng, lengths, speed=(speeds or {}).get((run.method, run.slots), speed))
        written[run] = fake_metrics(rng, run, spec, rows)
        written[run].update(cycle_parts(run, spec, written[run]))
        written["requests", run] = rows
        path = root / run.file("metrics.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(written[run]))
        write_requests(root, run, rows)
    for device in spec["devices"]:
        (root / paths.calibration("toy", device, "cache")).parent.mkdir(parents=True, exist_ok=True)
        for mode, slots in (("cache", 4), ("nocache", 0)):
            fit = {"b": rng.uniform(1, 20, 8).tolist(), "beta": float(rng.uniform(0.01, 1)), "source": "fit",
                   "r2": 0.97, "rmse_ms": 1.5, "n_points": 144, "slots": slots, "link_emulated": True,
                   "residuals": {"max_abs_ms": 3.0}}
            fit.update(cache_aware_fit(device, mode))
            (root / paths.calibration("toy", device, mode)).write_text(json.dumps(fit))
            written[device, mode] = fit
            y = rng.uniform(10, 100, 16)
            pq.write_table(pa.table({"state": np.arange(16) % 9, "k": np.arange(16) % 8,
                                     "tree": ["prob", "union"] * 8, "F": rng.integers(10, 100, 16),
                                     "y_ms": y, "pred_ms": y + rng.normal(0, 1, 16)}),
                           root / paths.calibration_points("toy", device, mode))
        theory = {"cycles": 123, "lambda_star": 0.0456789, "theta": 0.0451234, "gap_pct": 0.81, "bound_pct": 1.52,
                  "s_star_differs_pct": 22.2, "rho_cv": 0.33, "s_star_gain_pct": 0.42, "union_per_reward_beta": 35.5,
                  "union_per_reward_2beta": 31.25, "selected_nodes_beta": 2.5, "selected_nodes_2beta": 2.0,
                  "drafted_levels_mean": 3.1, "stopped_early_pct": 55.5, "length_limited_cycles": 7,
                  "empty_pool_cycles": 2, "dinkelbach_iterations": 3, "recorded_selection_differs_pct": 0.0}
        # specfit-ca's, under its cache-aware cost (beyond the paper): other numbers and the keys it adds
        theory_ca = {**theory, "cycles": 98, "lambda_star": 0.0512345, "theta": 0.05, "gap_pct": 2.41,
                     "bound_pct": 3.75, "misses_per_reward_beta": 4.25, "misses_per_reward_2beta": 3.5,
                     "cycles_without_residency": 11}
        for run in theory_runs(spec):
            if run.device == device:
                path = root / theory_file(spec, run)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(theory if theory_cost(spec, run) == "paper" else theory_ca))
        written[device, "theory"] = theory
        written[device, "theory_ca"] = theory_ca
    for part, record in paths.TOY_RECORDS.items():  # the toy's training records
        folder = root / paths.toy_model("toy", part)
        folder.mkdir(parents=True, exist_ok=True)
        numerics = {"cpu": "a test CPU", "torch_cpu_capability": "AVX2", "MKL_CBWR": "COMPATIBLE,STRICT"}
        written[part] = {"sha256": f"{part}-{seed}-" + "0" * 52, "steps": 3, "numerics": numerics}
        (folder / record).write_text(json.dumps(written[part]))
    return written


def runs_by(written) -> dict:
    """(method, slots) -> DecodeRun, on the one device of the fixture."""
    return {(r.method, r.slots): r for r in written if isinstance(r, DecodeRun) and r.device == DEVICE}
