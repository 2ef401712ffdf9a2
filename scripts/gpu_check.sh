#!/usr/bin/env bash
# One command for a lent GPU: every CUDA path of the real-model route, on tiny fakes, in a few minutes.
# Run from an environment with specfit installed (`pip install -e ".[test]"`), on a machine with a GPU:
#   1. the offload engine on the device: logits equality across cache states, counters, pinned copies (-m gpu);
#   2. the compatibility suite on cuda: real-layout bf16 fakes of Qwen3-30B-A3B and its speculators drafter
#      through extract, calibrate, atlas (built within its slots, slot rows checked) and decode for AR,
#      EAGLE-3 and SpecFit, lossless against AR or diverging only at a bf16 near-tie (the margin is asserted),
#      and `specfit generate` with every deployable method (tests/compat/test_compat_generate.py);
#   3. the stage tests on cuda: the warm-up leaves no trace in a measured SpecFit run, no stage allocates
#      more slots than asked, a crashed stream resumes, Table 5 on a real run; the fp32-logits option;
#   4. the learned route predictor on the device: trained, then SpecFit with learned routes lossless (tests);
#   5. the engine benchmark, and the route predictor's cost at Qwen3-30B-A3B's size, on the device.
# GPU_CHECK_DEVICE=cpu runs the same steps on the CPU (to check the script itself where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
device="${GPU_CHECK_DEVICE:-cuda}"
if [ "$device" = cuda ]; then
  python - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch.cuda.is_available() is False; nothing to check here (GPU_CHECK_DEVICE=cpu runs it on the CPU)")
print("gpu_check on", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY
  python -m pytest -m gpu tests/engine -q -rs
fi
SPECFIT_TEST_DEVICE="$device" python -m pytest -q -rs tests/compat tests/test_decode.py tests/test_theory_stage.py \
  tests/models/test_precision.py tests/test_predictor.py
python - "$device" <<'PY'
import json, pathlib, sys
# the lossless verdicts the compat suite's stages recorded, with every divergence's margin
folders = sorted(pathlib.Path("/tmp").glob("pytest-of-*/pytest-current/stages*"), key=lambda f: f.stat().st_mtime)
for path in sorted(folders[-1].glob("*.metrics.json")) if folders else []:
    m = json.loads(path.read_text())
    check = m.get("lossless") or {}
    print(f"{sys.argv[1]} {path.stem:24s} identical {check.get('n_identical')}/{check.get('n_requests')} "
          f"margins {[d['margin'] for d in check.get('divergences', [])]} slot rows {m.get('slot_rows_allocated')}")
PY
python -m specfit.bench engine --device "$device"
python -m specfit.bench predictor --device "$device" --dtype bfloat16 --repeats 50
