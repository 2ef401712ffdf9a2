"""The records the stages write and read: Parquet schemas, the row builders they share, and their readers.

Torch-free (numpy and pyarrow only), so that a stage that only reads records (theory, report) does not depend on
the drafting or verification code, and reruns only when a record's shape changes.

- prompts: one row per request of a workload (extract)
- requests, cycles: one row per request / verification cycle of a decode run (decode, atlas)
- atlas: one row per cycle of an atlas build: its prefix, full pool and the target's routes (atlas)
- points: one row per calibration probe tree (calibrate)

A pool is written with the same four columns wherever it appears (`POOL_FIELDS`, `pool_columns`): node 0 is the
root, parents come before their children.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from specfit.errors import SpecFitError

PROMPTS_SCHEMA = pa.schema([
    ("request_id", pa.int64()),
    ("question_id", pa.int64()),
    ("category", pa.string()),
    ("prompt", pa.string()),
    ("prompt_ids", pa.list_(pa.int64())),
    ("n_prompt", pa.int64()),
])

REQUEST_SCHEMA = pa.schema([
    ("request_id", pa.int64()),
    ("question_id", pa.int64()),
    ("output_ids", pa.list_(pa.int64())),  # generated tokens, EOS included
    ("n_output", pa.int64()),
    ("t_request_s", pa.float64()),
    ("t_prefill_s", pa.float64()),  # target and drafter prefill
    ("h2d_transfers", pa.int64()),  # prefill included
])

POOL_FIELDS = [
    ("pool_parent", pa.list_(pa.int64())),  # index 0 is the root, parent -1
    ("pool_token", pa.list_(pa.int64())),
    ("pool_prob", pa.list_(pa.float64())),  # path probabilities p_v (the root's is 1)
    ("pool_level", pa.list_(pa.int64())),
]

CYCLE_SCHEMA = pa.schema([
    ("request_id", pa.int64()),
    ("cycle", pa.int64()),
    ("prefix_len", pa.int64()),
    *POOL_FIELDS,
    ("selected", pa.list_(pa.int64())),
    ("drafted_levels", pa.int64()),
    ("accepted", pa.int64()),  # draft nodes accepted
    ("accepted_path", pa.list_(pa.int64())),
    ("committed", pa.int64()),  # tokens added to the output, after EOS / limit truncation
    ("t_draft_s", pa.float64()),
    ("t_select_s", pa.float64()),
    ("t_verify_s", pa.float64()),
    ("t_commit_s", pa.float64()),
    ("h2d_transfers", pa.int64()),
    # the experts each layer's cache held when the cycle selected, as the method read them (`resident_ids`): per layer
    # the resident expert ids; null where the method read no cache (every method but specfit-ca, and specfit-ca's
    # cycles that evaluated no pool: root only)
    ("resident", pa.list_(pa.list_(pa.int16()))),
    # of those, the fraction of each one's copy still to come when the cycle selected (a prefetch in flight,
    # `specfit.selection.pool.Pool.in_flight`), per layer in the order of ``resident``; null where nothing was in
    # flight or the method reads no in-flight copies (every method but specfit-prefetch)
    ("in_flight", pa.list_(pa.list_(pa.float64()))),
])

ATLAS_SCHEMA = pa.schema([
    ("request_id", pa.int64()),
    ("cycle", pa.int64()),
    ("prefix_len", pa.int64()),
    *POOL_FIELDS,
    ("routes", pa.list_(pa.int64())),  # flattened [n+1, n_layers, top_k]
    ("n_layers", pa.int64()),
    ("top_k", pa.int64()),
])

POINTS_SCHEMA = pa.schema([
    ("question_id", pa.int64()),
    ("state", pa.int64()),  # index of the (question, cycle boundary) state
    ("cycle", pa.int64()),  # cycles of EAGLE-3's trajectory before the state
    ("k", pa.int64()),
    ("tree", pa.string()),  # "prob" (probability prefix) or "union" (minimum expert union)
    ("nodes", pa.list_(pa.int64())),
    ("levels", pa.int64()),  # pool levels the probe drafted
    ("F", pa.int64()),
    ("y_ms", pa.float64()),  # mean of the repeats
    ("y_repeats_ms", pa.list_(pa.float64())),
    ("pred_ms", pa.float64()),  # T̂ = b_k + β·F of the paper model, fitted on y_ms (the means)
    # specfit-ca's cache-aware model, from the offload engine's counters of the verify forward, summed over layers:
    ("misses", pa.int64()),  # experts of the union copied in the first repeat (M); misses + hits == F
    ("hits", pa.int64()),  # experts of the union resident in the first repeat (H)
    ("misses_repeats", pa.list_(pa.int64())),  # M of every repeat, in the order of y_repeats_ms
    ("hits_repeats", pa.list_(pa.int64())),  # H of every repeat
    ("draft_ms", pa.float64()),  # the cycle's "draft" section (drafter catch-up + levels), mean of the repeats
    ("draft_repeats_ms", pa.list_(pa.float64())),
    ("caught_up", pa.int64()),  # committed tokens the drafter caught up on before drafting (0 right after prefill)
    ("select_ms", pa.float64()),  # specfit-ca's selections after the levels (timed apart from y), mean of the repeats
    ("pred_ca_ms", pa.float64()),  # mean over the repeats of b_k + β_miss·M + β_hit·H (fitted on the repeats)
])


def pool_columns(pool) -> dict:
    """The `POOL_FIELDS` of a row, from a `specfit.selection.CandidatePool`."""
    return {"pool_parent": list(pool.parent), "pool_token": list(pool.token), "pool_prob": list(pool.path_prob),
            "pool_level": list(pool.level)}


def resident_ids(resident: np.ndarray | None) -> list[list[int]] | None:
    """The ``resident`` column of a cycle row from a residency [L, N] bool: per layer, its resident expert ids."""
    return None if resident is None else [np.flatnonzero(layer).tolist() for layer in resident]


def in_flight_fractions(resident: np.ndarray | None, in_flight: np.ndarray | None) -> list[list[float]] | None:
    """The ``in_flight`` column of a cycle row from a residency [L, N] bool and the copy left of each resident expert
    [L, N] float: per layer, the fractions of the experts ``resident_ids`` lists (None when nothing is in flight)."""
    if resident is None or in_flight is None or not np.any(in_flight > 0):
        return None
    return [in_flight[layer, np.flatnonzero(held)].tolist() for layer, held in enumerate(resident)]


def in_flight_matrix(ids: list[list[int]] | None, fractions: list[list[float]] | None,
                     num_experts: int) -> np.ndarray | None:
    """A cycle row's ``in_flight`` column (with its ``resident`` ids) as the copy left [L, N] float64 (None stays
    None)."""
    if ids is None or fractions is None:
        return None
    left = np.zeros((len(ids), num_experts), dtype=np.float64)  # [L, N]
    for layer, (experts, f) in enumerate(zip(ids, fractions, strict=True)):
        left[layer, experts] = f
    return left


def resident_mask(ids: list[list[int]] | None, num_experts: int) -> np.ndarray | None:
    """A cycle row's ``resident`` column as a residency [L, N] bool (None stays None)."""
    if ids is None:
        return None
    mask = np.zeros((len(ids), num_experts), dtype=np.bool_)  # [L, N]
    for layer, experts in enumerate(ids):
        mask[layer, experts] = True
    return mask


def atlas_row(request_id: int, cycle: int, prefix_len: int, pool, routes: np.ndarray) -> dict:
    """One atlas row: the cycle's prefix, its full pool and the target's routes [n+1, L, k] for it."""
    return {"request_id": request_id, "cycle": cycle, "prefix_len": prefix_len, **pool_columns(pool),
            "routes": routes.reshape(-1).tolist(), "n_layers": routes.shape[1], "top_k": routes.shape[2]}


def read_table(path: str | os.PathLike, schema: pa.Schema, what: str, columns=None) -> pa.Table:
    """The table at ``path`` (only ``columns`` when given), checked for the columns ``schema`` names."""
    if not os.path.exists(path):
        raise SpecFitError(f"no {what} at {path}: run the rule that writes it")
    names = pq.read_schema(path).names
    missing = [c for c in (columns or schema.names) if c not in names]
    if missing:
        raise SpecFitError(f"{what} {path} lacks columns {missing}: it was written by another version; rerun "
                           "the rule that writes it")
    return pq.read_table(path, columns=columns)


def read_prompts(path: str | os.PathLike, max_requests: int | None = None) -> list[dict]:
    """A workload's prompts in request order, the first ``max_requests`` of them when given."""
    rows = sorted(read_table(path, PROMPTS_SCHEMA, "prompts").to_pylist(), key=lambda r: r["request_id"])
    return rows[:max_requests] if max_requests is not None else rows


def read_atlas(path: str | os.PathLike) -> list[dict]:
    """Atlas rows, each with ``routes`` as an int16 array [n+1, n_layers, top_k] (a full atlas holds ~10^8
    expert ids: they stay numpy)."""
    table = read_table(path, ATLAS_SCHEMA, "atlas")
    flat = table.column("routes").combine_chunks()
    values, offsets = flat.values.to_numpy().astype(np.int16), flat.offsets.to_numpy()
    rows = table.drop_columns(["routes"]).to_pylist()
    shapes = set()
    for i, row in enumerate(rows):
        shape = (-1, row["n_layers"], row["top_k"])
        row["routes"] = values[offsets[i] : offsets[i + 1]].reshape(shape)
        if row["routes"].shape[0] != len(row["pool_token"]):
            raise SpecFitError(f"atlas {path}, request {row['request_id']}, prefix_len {row['prefix_len']}: "
                               f"{row['routes'].shape[0]} routes for {len(row['pool_token'])} nodes")
        shapes.add(shape)
    if len(shapes) > 1:
        raise SpecFitError(f"atlas {path}: rows of different route shapes {sorted(shapes)}")
    return rows
