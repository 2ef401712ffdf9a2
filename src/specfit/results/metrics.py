"""What a decode run's metrics.json holds: Eq. 10 throughputs with their interval, and per-cycle means.

Torch-free: computed from the run's records (requests and cycles) alone.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from specfit.results.intervals import tps_interval
from specfit.results.ngrams import stream_split

# fresh vs repeated-4-gram cycles (specfit.results.ngrams): None without prompts
SPLIT_KEYS = ("committed_per_cycle_fresh", "committed_per_cycle_repeated", "cycles_fresh", "cycles_repeated")
# the keys `stream_metrics` returns, in order: the report reads metrics.json by these names
KEYS = ("n_requests", "n_output_tokens", "cycles", "tps_dec", "tps_dec_low", "tps_dec_high", "tps_req",
        "draft_nodes_per_cycle", "pool_nodes_per_cycle", "cycles_without_draft", "drafted_levels_per_cycle",
        "accepted_per_cycle", "committed_per_cycle", *SPLIT_KEYS, "ms_per_cycle", "draft_ms_per_cycle",
        "verify_ms_per_cycle", "select_ms_per_cycle", "commit_ms_per_cycle", "select_ms_median", "select_share_pct",
        "h2d_per_token", "h2d_per_cycle", "verify_widths")


def stream_metrics(requests: list[dict], cycles: pa.Table, prompts: list[dict] | None = None, seed: int = 0) -> dict:
    """Eq. 10 throughputs and per-cycle means; times in seconds unless the key says ms.

    ``tps_dec_low`` / ``tps_dec_high``: the 95% percentile-bootstrap interval of ``tps_dec`` over requests
    (`specfit.results.intervals.tps_interval`, seeded by ``seed``). With ``prompts`` (rows with ``request_id`` and
    ``prompt_ids``), cycles are split into fresh ones and ones that start inside a repeated output 4-gram
    (`specfit.results.ngrams`): ``committed_per_cycle_fresh`` / ``_repeated`` and ``cycles_fresh`` / ``_repeated``
    (None without prompts). ``cycles_without_draft``: cycles whose pool holds the root alone (AR's every cycle; a
    drafting method's at the length limit or where it chose not to draft). ``verify_widths``: cycles per verify width
    (the root and the nodes selected with it: 1 verifies the root alone), keys in increasing width.
    """
    n = sum(r["n_output"] for r in requests)
    t_req = sum(r["t_request_s"] for r in requests)
    t_dec = t_req - sum(r["t_prefill_s"] for r in requests)
    c = {name: np.asarray(cycles.column(name).to_pylist()) for name in (
        "committed", "accepted", "drafted_levels", "t_draft_s", "t_select_s", "t_verify_s", "t_commit_s",
        "h2d_transfers",
    )}
    selected = np.asarray([len(s) for s in cycles.column("selected").to_pylist()])
    pool = np.asarray([len(p) - 1 for p in cycles.column("pool_token").to_pylist()])
    n_cycles = len(selected)

    def mean(x):
        return float(np.mean(x)) if len(x) else None

    interval = tps_interval(requests, seed=seed) if requests and t_dec > 0 else None
    split = dict.fromkeys(SPLIT_KEYS)
    if prompts is not None:
        columns = ("request_id", "prefix_len", "committed")
        split = stream_split(prompts, requests, cycles.select(list(columns)).to_pylist())

    return {
        "n_requests": len(requests),
        "n_output_tokens": n,
        "cycles": n_cycles,
        "tps_dec": (n - len(requests)) / t_dec if t_dec > 0 else None,
        "tps_dec_low": None if interval is None else interval["low"],
        "tps_dec_high": None if interval is None else interval["high"],
        "tps_req": n / t_req if t_req > 0 else None,
        "draft_nodes_per_cycle": mean(selected),
        "pool_nodes_per_cycle": mean(pool),
        "cycles_without_draft": int((pool == 0).sum()),
        "drafted_levels_per_cycle": mean(c["drafted_levels"]),
        "accepted_per_cycle": mean(c["accepted"]),
        "committed_per_cycle": mean(c["committed"]),
        **split,
        "ms_per_cycle": 1e3 * t_dec / n_cycles if n_cycles else None,
        "draft_ms_per_cycle": 1e3 * mean(c["t_draft_s"]) if n_cycles else None,
        "verify_ms_per_cycle": 1e3 * mean(c["t_verify_s"]) if n_cycles else None,
        "select_ms_per_cycle": 1e3 * mean(c["t_select_s"]) if n_cycles else None,
        "commit_ms_per_cycle": 1e3 * mean(c["t_commit_s"]) if n_cycles else None,
        "select_ms_median": 1e3 * float(np.median(c["t_select_s"])) if n_cycles else None,
        "select_share_pct": 100.0 * float(c["t_select_s"].sum()) / t_dec if t_dec > 0 else None,
        "h2d_per_token": sum(r["h2d_transfers"] for r in requests) / n if n else None,
        "h2d_per_cycle": mean(c["h2d_transfers"]),  # the decode cycles' copies, prefill excluded
        "verify_widths": {str(w): int(k) for w, k in zip(*np.unique(selected + 1, return_counts=True))},
    }
