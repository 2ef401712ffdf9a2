"""One CPU arithmetic for training on every x86-64 CPU with AVX2, Intel or AMD: the kernel paths are pinned before
torch computes, so that with the thread count fixed as well (the training stages' ``train_threads``) the toy trains
the same weights on a laptop, a CI runner or a cluster node.

Left alone, torch picks its vectorized kernels by the CPU's widest instructions (AVX-512 or AVX2) and MKL picks its
GEMM by the CPU and splits it by thread count, and each choice rounds differently: the same seed and config trained
toy targets with other sha256 on one machine (AVX-512 or AVX2, 1 or 2 threads; docs/toy.md). Pinned:

- ``ATEN_CPU_CAPABILITY=avx2``: torch's AVX2 kernels, the same instructions on any CPU that has AVX2 and FMA;
- ``MKL_CBWR=COMPATIBLE,STRICT``: MKL's conditional numerical reproducibility in its one branch that runs the same
  code on Intel and AMD CPUs (its SSE2 code without the instructions the two vendors round differently), results
  independent of the thread count. Its AVX2 branch is reproducible across Intel CPUs only: on AMD CPUs MKL runs
  its own ``AUTO,STRICT`` code whichever branch is asked (``MKL_VERBOSE=1`` says so), and trains other weights.
  The compatible branch is slower, so the toy trains longer (docs/toy.md);
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's kernels capped likewise.

A stage that times forwards rather than trains (`for_timing`, which `specfit.planning.stage.stage_main` calls for every
stage but the toy's and the route predictor's training) then switches MKL to its ``AUTO`` branch: still the same results
run to run on one CPU with one thread, at the speed of MKL's own kernels for it (the strict AVX2 branch makes the
drafter's head several times slower on some CPUs, and host work on the virtual clock is timed in these stages).

A value already in the environment wins (``ATEN_CPU_CAPABILITY=avx512`` runs torch's AVX-512 kernels where the
CPU has them: faster, and other weights; a ``MKL_CBWR`` set by the user stays in every stage). A CPU without AVX2
and FMA (or not x86-64, where MKL is absent) is left as it is. `described` says what a process runs with; the
toy's training.json records it.
"""

import os
import platform

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}
REQUIRED_FLAGS = {"avx2", "fma"}  # /proc/cpuinfo flags the pinned kernels execute
TIMING_MKL_CBWR = "AUTO"  # MKL's branch for stages that time forwards (`for_timing`)
_set_here: set[str] = set()  # the PINNED keys `pin` set in this process (not the user's)


def cpuinfo(field: str) -> str | None:
    """The first CPU's ``field`` in Linux's /proc/cpuinfo ("flags", "model name"), None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.split(":", 1)[0].strip() == field),
                        None)
    except OSError:
        return None


def cpu_name() -> str:
    """This machine's CPU as /proc/cpuinfo names it (elsewhere `platform.processor`), "unknown" when neither says."""
    return cpuinfo("model name") or platform.processor() or "unknown"


def pinnable() -> bool:
    return (platform.machine().lower() in ("x86_64", "amd64")
            and REQUIRED_FLAGS <= set((cpuinfo("flags") or "").split()))


def pin() -> None:
    """Set `PINNED` in this process's environment where it is not set already; before torch loads (specfit's
    ``__init__`` calls it), so that its dispatch and MKL read it."""
    if pinnable():
        for key, value in PINNED.items():
            if key not in os.environ:
                os.environ[key] = value
                _set_here.add(key)


def for_timing() -> None:
    """Before a timing stage's first GEMM (MKL reads ``MKL_CBWR`` at its first call): MKL's ``AUTO`` branch in place
    of the training pin, unless the user set ``MKL_CBWR``. Training stages do not call it."""
    if "MKL_CBWR" in _set_here:
        os.environ["MKL_CBWR"] = TIMING_MKL_CBWR


def described() -> dict:
    """What this process computes with: the CPU, torch's kernel capability, the pinning variables as set."""
    import torch  # here, not at the top: `pin` runs from specfit's __init__, which stays free of torch

    return {"cpu": cpu_name(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), **{k: os.environ.get(k) for k in PINNED}}
