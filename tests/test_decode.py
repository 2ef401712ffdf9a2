import json
import os

import pyarrow.parquet as pq
import pytest

from specfit.results.records import CYCLE_SCHEMA, REQUEST_SCHEMA
from specfit.stages import atlas, decode

DEVICE = os.environ.get("SPECFIT_TEST_DEVICE", "cpu")  # scripts/gpu_check.sh: cuda


def spec(name, **method):
    return {"method": {"name": name, **method}, "slots": 4, "max_inflight": 2, "link": None, "emulate": None,
            "torch_device": DEVICE, "dtype": "float32", "limit_tokens": 40, "max_new_tokens": 12, "seed": 0,
            "warmup_tokens": 3, "model": "tiny", "logits_dtype": "model", "verify": "exact"}


def outs(path, name):
    return {k: path / f"{name}.{k}.{ext}" for k, ext in
            (("requests", "parquet"), ("cycles", "parquet"), ("metrics", "json"), ("atlas", "parquet"))}


def test_methods_through_the_stage_are_lossless(files, tmp_path):
    ar = outs(tmp_path, "ar")
    decode.main(["--spec", json.dumps(spec("ar")), *sum((["--in", f"{k}={v}"] for k, v in files.items()), []),
                 *sum((["--out", f"{k}={ar[k]}"] for k in ("requests", "cycles", "metrics")), [])])
    requests = pq.read_table(ar["requests"])
    assert requests.schema.equals(REQUEST_SCHEMA) and pq.read_table(ar["cycles"]).schema.equals(CYCLE_SCHEMA)
    assert requests.column("n_output").to_pylist() == [12, 12]
    assert not list(tmp_path.glob("*.parts"))

    inputs = dict(files, reference=ar["requests"])
    build = outs(tmp_path, "build")  # the noisy variant's own atlas: its trajectory is the noisy rule's
    noisy = spec("specfit", routes="noisy", accuracy=0.6)
    atlas.run(noisy, inputs, build)
    fit = outs(tmp_path, "fit")
    decode.run(noisy, dict(inputs, atlas=build["atlas"]), fit)
    eagle = outs(tmp_path, "eagle")
    decode.run(spec("eagle3"), inputs, eagle)
    for run in (build, fit, eagle):
        metrics = json.loads(run["metrics"].read_text())
        assert metrics["lossless"] == {"reference": str(ar["requests"]), "n_requests": 2, "n_identical": 2,
                                       "missing": 0, "divergences": []}
        assert metrics["n_output_tokens"] == 24 and metrics["tps_dec"] > 0 and metrics["h2d_per_token"] > 0
        assert metrics["link_emulated"] is False and metrics["resumed"] == []
        assert metrics["prefetch"] == {"issued": 0, "used": 0, "evicted_unused": 0, "idle": 0, "hidden_ms": 0.0}
    assert pq.read_table(build["atlas"]).num_rows == json.loads(build["metrics"].read_text())["cycles"] - 2


def test_no_stage_allocates_more_slots_than_its_run_asks_for(files, tmp_path):
    """The atlas is built within the device slots its spec gives (the rule: the device's with-cache slot count),
    never with every expert resident; a decode run allocates its own slots; 0 slots share one scratch buffer."""
    layers, experts = 2, 8  # the tiny target
    build = outs(tmp_path, "build")
    atlas.run(spec("specfit"), files, build)  # 4 slots per layer
    assert json.loads(build["metrics"].read_text())["slot_rows_allocated"] == 4 * layers
    for slots, rows in ((2, 2 * layers), (0, experts)):
        run = outs(tmp_path, f"eagle{slots}")
        decode.run(dict(spec("eagle3"), slots=slots), files, run)
        assert json.loads(run["metrics"].read_text())["slot_rows_allocated"] == rows


def test_a_crashed_stream_resumes(files, tmp_path, monkeypatch):
    from specfit.speculative import loading

    run = outs(tmp_path, "ar")
    real = loading.decode_request
    calls = []

    def crash_on_second_request(*args, request_id, **kwargs):
        calls.append(request_id)
        if len(calls) == 3:  # warm-up, request 0, then request 1 crashes
            raise RuntimeError("crash")
        return real(*args, request_id=request_id, **kwargs)

    monkeypatch.setattr(loading, "decode_request", crash_on_second_request)
    with pytest.raises(RuntimeError):
        decode.run(spec("ar"), files, run)
    assert not run["requests"].exists()
    monkeypatch.setattr(loading, "decode_request", real)
    decode.run(spec("ar"), files, run)
    metrics = json.loads(run["metrics"].read_text())
    assert metrics["resumed"] == [{"request_id": 1, "requests_done": 1}]
    assert pq.read_table(run["requests"]).column("request_id").to_pylist() == [0, 1]


def test_a_crashed_stream_is_not_resumed_by_another(files, tmp_path, monkeypatch, caplog):
    """After a crash, a rerun with another spec (the config changed) or a remade input starts over: the crashed
    stream's finished requests are moved aside, not mixed into the new stream's."""
    from specfit.speculative import loading

    run = outs(tmp_path, "eagle3")
    real = loading.decode_request

    def crash_on_second_request(*args, request_id, **kwargs):
        if request_id == 1:
            raise RuntimeError("crash")
        return real(*args, request_id=request_id, **kwargs)

    monkeypatch.setattr(loading, "decode_request", crash_on_second_request)
    with pytest.raises(RuntimeError):
        decode.run(spec("eagle3"), files, run)
    parts = tmp_path / "eagle3.requests.parquet.parts"
    assert len(list(parts.glob("*.requests.parquet"))) == 1  # request 0 finished
    monkeypatch.setattr(loading, "decode_request", real)
    decode.run(spec("eagle3", max_depth=2), files, run)  # the config changed: another stream
    metrics = json.loads(run["metrics"].read_text())
    assert metrics["resumed"] == [] and metrics["n_requests"] == 2
    assert "holds requests of another stream" in caplog.text
    assert len(list((tmp_path / "eagle3.requests.parquet.parts.replaced").glob("*.requests.parquet"))) == 1
    assert {c["drafted_levels"] for c in pq.read_table(run["cycles"]).to_pylist()} <= {0, 1, 2}


@pytest.mark.parametrize("method", [{"name": "specfit", "routes": "noisy"}, {"name": "specfit-ca"}])
def test_the_warm_up_leaves_no_trace_in_a_measured_specfit_run(files, tmp_path, method):
    """The warm-up decodes the first request under a shorter limit, so its last cycles draft fewer levels than the
    atlas holds and may select differently; the measured stream must be the same as after a full-length warm-up,
    with the same atlas counters (reset after the warm-up) and no error."""
    build = outs(tmp_path, "build")
    atlas.run(spec(**method), files, build)
    runs = {}
    for warmup in (3, 12):
        run = outs(tmp_path, f"warm{warmup}")
        decode.run(dict(spec(**method), warmup_tokens=warmup), dict(files, atlas=build["atlas"]), run)
        cycles = pq.read_table(run["cycles"]).drop_columns([c for c in CYCLE_SCHEMA.names if c.startswith("t_")])
        metrics = json.loads(run["metrics"].read_text())
        runs[warmup] = (cycles.to_pylist(), {k: v for k, v in metrics.items() if k.startswith("atlas_")})
    assert runs[3] == runs[12]
    assert runs[3][1]["atlas_nodes"] > 0


def test_fp32_logits_option_reaches_the_target(files, tmp_path, monkeypatch):
    """`logits_dtype: float32` is applied to the loaded target (on this fp32 target it changes no token)."""
    from specfit.models import loading

    applied = []
    real = loading.apply_logits_dtype
    monkeypatch.setattr(loading, "apply_logits_dtype", lambda model, dtype: applied.append(dtype) or real(model, dtype))
    runs = {}
    for dtype in ("model", "float32"):
        run = outs(tmp_path, f"ar-{dtype}")
        decode.run(dict(spec("ar"), logits_dtype=dtype), files, run)
        runs[dtype] = pq.read_table(run["requests"]).column("output_ids").to_pylist()
    assert applied == ["model", "float32"] and runs["model"] == runs["float32"]
