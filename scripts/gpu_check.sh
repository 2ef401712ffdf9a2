#!/usr/bin/env bash
# CUDA check of the offload engine (run from an environment with specfit installed, on a machine with a GPU):
# the logits-equality and counter tests on the device, then the engine benchmark on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch.cuda.is_available() is False; nothing to check here")
print("gpu_check on", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY
python -m pytest -m gpu tests/engine -q -rs
python -m specfit.bench engine --device cuda
