"""`python -m specfit.bench tuned`: each method of a cell against the tuned tree, the best baseline and EAGLE-3 at
the paper's tree, read from finished decode outputs."""

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from specfit.bench import tuned
from specfit.planning.config import SCHEMA, load_config

TOKENS = 65  # per request: 64 decode tokens


@dataclass
class Run:
    method: str
    folder: Path

    def file(self, name: str) -> str:
        return str(self.folder / name)


def finished_run(tmp_path: Path, method: str, seconds: list[float]) -> Run:
    """A run whose request i decodes 64 tokens in ``seconds[i]``, and its metrics."""
    folder = tmp_path / method
    folder.mkdir()
    rows = [{"request_id": i, "n_output": TOKENS, "t_request_s": s + 0.5, "t_prefill_s": 0.5}
            for i, s in enumerate(seconds)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "requests.parquet")
    tps = (TOKENS - 1) * len(seconds) / sum(seconds)
    metrics = {"tps_dec": tps, "tps_dec_low": tps, "tps_dec_high": tps, "committed_per_cycle": 2.0,
               "draft_nodes_per_cycle": 3.0, "drafted_levels_per_cycle": 2.0, "select_ms_per_cycle": 0.1,
               "device": {"name": "A100"}}  # a virtual clock: 0.02% spread between processes
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return Run(method, folder)


def test_cell_rows_ratio_to_eagle3_at_the_papers_tree(tmp_path):
    config = load_config("config.yaml", SCHEMA)
    base = [1.0, 1.1, 0.9, 1.2, 1.0, 0.8]
    runs = [finished_run(tmp_path, "eagle3", base),
            finished_run(tmp_path, "eagle3-tuned", [s * 0.9 for s in base]),
            finished_run(tmp_path, "specfit-online", [s * 0.8 for s in base])]
    lines = tuned.cell_rows(config, runs)
    assert "/ eagle3 (paper tree)" in lines[0]
    online = next(line for line in lines if line.startswith("specfit-online"))
    # every request 0.8x EAGLE-3's time: 1.25x its throughput, 1.125x the tuned tree's, on every resample
    assert "1.125× [1.125, 1.125] faster" in online
    assert "1.250× [1.250, 1.250] faster" in online
    eagle3 = next(line for line in lines if line.startswith("eagle3 "))
    assert "0.900× [0.900, 0.900] slower" in eagle3  # against the tuned tree; against itself a dash
