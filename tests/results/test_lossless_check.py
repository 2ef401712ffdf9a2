"""`lossless_check`: divergences found against the AR reference; without margins (rejection sampling, whose tokens
are not AR's to begin with) the target is never run for them."""

import pyarrow as pa
import pyarrow.parquet as pq

from specfit.results.summary import lossless_check


def test_divergences_without_margins_never_run_the_target(tmp_path):
    reference = tmp_path / "requests.parquet"
    pq.write_table(pa.Table.from_pylist([{"request_id": 0, "output_ids": [5, 6, 7]},
                                         {"request_id": 1, "output_ids": [8, 9]}]), reference)
    prompts = [{"request_id": 0, "prompt_ids": [1, 2]}, {"request_id": 1, "prompt_ids": [3]}]
    ours = [{"request_id": 0, "output_ids": [5, 6, 7]}, {"request_id": 1, "output_ids": [8, 4]}]
    check = lossless_check(None, prompts, ours, reference, margins=False)  # a model of None: any forward would fail
    assert (check["n_requests"], check["n_identical"], check["missing"]) == (2, 1, 0)
    assert check["divergences"] == [{"request_id": 1, "position": 1, "ours": 4, "reference": 9, "margin": None}]
