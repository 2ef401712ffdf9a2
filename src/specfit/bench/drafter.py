"""``python -m specfit.bench drafter``: one drafter step's CPU time after a pause, beside the device's model.

Inside a decode run on an emulated device each drafter forward follows a target forward that waited for its modelled
end (`specfit.device`), and on some CPUs that step costs more than the same step run back to back: the drafter's
overruns (docs/device.md). This times the drafter alone, a step of ``--positions`` new positions over a cache of
``--past`` (cropped back after every step, so each step sees the same length), after a pause of each
``--pause-ms``, slept (as `specfit.device` waits) or spun in Python, and prints the median, 90th and 99th percentile
and the share of steps above the device's modelled drafted level (``emulate.draft_ms`` of ``--device``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specfit.device import wait_until
from specfit.models import load_drafter, load_target
from specfit.workflow import load_config


def spin(deadline: float) -> None:
    while time.perf_counter() < deadline:
        pass


def step_times(drafter, past: int, positions: int, pause_s: float, wait, steps: int) -> list[float]:
    """Seconds of each of ``steps`` drafter steps, each after ``wait`` to a deadline ``pause_s`` ahead."""
    from transformers import DynamicCache

    H = drafter.fc.out_features
    vocab = drafter.embed_tokens.num_embeddings
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        cache = DynamicCache()
        ids = torch.randint(0, vocab, (1, past), generator=g)
        drafter(ids, torch.randn(1, past, H, generator=g), torch.arange(past)[None], past_key_values=cache)
        new_ids = torch.randint(0, vocab, (1, positions), generator=g)
        hidden = torch.randn(1, positions, H, generator=g)  # [1, T, H]
        position_ids = torch.arange(past, past + positions)[None]
        out = []
        for _ in range(steps):
            wait(time.perf_counter() + pause_s)
            start = time.perf_counter()
            drafter(new_ids, hidden, position_ids, past_key_values=cache)
            out.append(time.perf_counter() - start)
            cache.crop(-positions)  # back to ``past``
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specfit.bench drafter", description=__doc__)
    parser.add_argument("--target", default="data/models/toy/target")
    parser.add_argument("--drafter", default="data/models/toy/drafter")
    parser.add_argument("--config", default="config.yaml", help="for the device's modelled drafted level")
    parser.add_argument("--device", default="cpu-a100")
    parser.add_argument("--past", type=int, default=600, help="cached positions before each step")
    parser.add_argument("--positions", type=int, default=2, help="new positions per step (a drafted level's width)")
    parser.add_argument("--pause-ms", type=float, nargs="+", default=[0.0, 1.0, 3.0, 10.0, 30.0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per pause and way of waiting")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (Snakemake's --cores 1 gives 1)")
    args = parser.parse_args(argv)
    emulate = load_config(args.config)["devices"][args.device].get("emulate")
    if emulate is None:
        parser.error(f"device {args.device} in {args.config} has no emulate entry: name an emulated device")
    model_ms = emulate["draft_ms"]
    torch.set_num_threads(args.threads)
    target, _ = load_target(args.target, "float32", "cpu")
    drafter = load_drafter(args.drafter, target, "float32", "cpu")
    step_times(drafter, args.past, args.positions, 0.0, spin, 20)  # warm-up
    print(f"drafter {args.drafter}: steps of {args.positions} positions past {args.past}, {args.threads} thread(s), "
          f"{args.steps} steps each; modelled drafted level on {args.device}: {model_ms:.3f} ms (CPU timing)")
    print(f"{'pause ms':>9} {'wait':>6} {'median ms':>10} {'p90 ms':>8} {'p99 ms':>8} {'over model':>11}")
    for pause in args.pause_ms:
        for name, wait in (("sleep", wait_until), ("spin", spin)):
            ms = sorted(1e3 * t for t in step_times(drafter, args.past, args.positions, pause / 1e3, wait, args.steps))
            q = statistics.quantiles(ms, n=100)
            over = sum(t > model_ms for t in ms) / len(ms)
            print(f"{pause:9.1f} {name:>6} {statistics.median(ms):10.3f} {q[89]:8.3f} {q[98]:8.3f} {100 * over:10.1f}%")


if __name__ == "__main__":
    main()
