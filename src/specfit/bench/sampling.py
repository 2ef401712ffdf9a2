"""``python -m specfit.bench sampling``: the host work sampling adds per cycle against greedy decoding, at the real
target's vocabulary (151,936 tokens) and its drafter's (32,000).

The toy (config.yaml's ``toy`` on ``cpu-a100``) first decodes the first ``--requests`` GSM8K questions with each
``--methods`` entry at ``--temperature`` under coupled sampling and under rejection sampling (`specfit.api.Decoder`),
which gives each cycle's shape: its drafted levels, the parents expanded at each, the verified rows, the tokens
committed, and the emulated A100's cycle time. Those cycles are then replayed, shape for shape, through the
operations that differ between the modes, on rows of the real vocabularies, timed on the wall clock:

- greedy: the drafter's softmax and top-k per level, the target's argmax over the verified rows;
- coupled: the position's Gumbel noise where a cycle reaches a position first (drawn on the CPU, as decoding draws
  it), the drafter's tempered, warped, noised top-k per level (`Noise.draft`), the target's Gumbel-max token per
  verified row (`Noise.sample`);
- rejection: the drafter's top-k with its warped probabilities (`Noise.proposals`), the target's warped distribution
  per row and EAGLE's tree verification over the cycle's verified tree (`rejection_path`), noise only where every
  child is rejected.

It then prints, per method and mode, each level's commit probabilities as the decode predicted them (the mode's
derivation, `Noise.draft` and `Noise.proposals`) against the share of those nodes committed.

The rows are the toy's own logits (recorded as it decoded), padded to the real vocabulary with a tail below their
least value: the nucleus and the shape of the distribution are the toy's. The figures are CPU wall time (one thread
as a decode job): on a GPU host the warp and the argmax run on the device, the noise is drawn on the host and moved.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from unittest import mock

import torch

from specfit import bench
from specfit.api import Decoder
from specfit.bench.decode import questions
from specfit.results.acceptance import level_calibration
from specfit.speculative.sampler import Noise, next_positions, rejection_path, warp
from specfit.speculative.sampling import Sampling

VOCAB, DRAFT_VOCAB = 151_936, 32_000  # Qwen3-30B-A3B's vocabulary, its EAGLE-3 drafter's
RESIDENT_CYCLE_MS = 20.0  # a cycle with every expert resident (config.resident.yaml's M5 Max, the paper's tree)


def cycle_shapes(cycles: list[dict], top_k: int) -> list[dict]:
    """Per recorded cycle: the parents expanded at each drafted level, the verified rows' tree (parent of each row,
    root first), their levels and the tokens committed."""
    shapes = []
    for c in cycles:
        level, parent = c["pool_level"], c["pool_parent"]
        parents = [1] + [min(top_k, sum(1 for v in range(1, len(level)) if level[v] == d))
                         for d in range(1, c["drafted_levels"])]
        rows = [0, *c["selected"]]
        shapes.append({"parents": parents[: c["drafted_levels"]], "rows": rows, "row_parent": [parent[v] for v in rows],
                       "row_level": [level[v] for v in rows], "token": c["pool_token"], "committed": c["committed"]})
    return shapes


def padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """[n, width] the toy's logits rows, cut or padded with a tail below each row's least value."""
    out = []
    for r in rows:
        r = r.float()[:width]
        tail = r.min() - 10 - torch.rand(width - r.numel(), generator=torch.Generator().manual_seed(0))
        out.append(torch.cat([r, tail]))
    return torch.stack(out)


def replay(shapes: list[dict], bank: torch.Tensor, draft_bank: torch.Tensor, s: Sampling, mode: str, k: int,
           repeats: int, ahead: tuple[int, float] | None = None) -> dict[str, float]:
    """Mean µs per cycle of each part of ``mode`` over ``shapes`` (best of ``repeats``), on rows of ``bank`` [n, V]
    (the target's) and ``draft_bank`` [n, Vd] (the drafter's). ``ahead`` (depth, window s): as a decode does, the
    next cycle's positions (`next_positions`) go to the noise worker (`Noise.ahead`) before each verify, which
    the device runs for ``window`` seconds (a sleep, off every part); "noise" is then what the host still waits."""
    V, Vd = bank.shape[-1], draft_bank.shape[-1]
    target_ids = torch.arange(Vd) * (V // Vd)  # [Vd] a draft vocabulary's spread of target ids
    best: dict[str, float] = {}
    for _ in range(repeats):
        parts = dict.fromkeys(("noise", "drafter", "target"), 0.0)
        noise = Noise(s, 0, V)
        drawn = noise.gumbel

        def timed_gumbel(position, _drawn=drawn):
            started = time.perf_counter()
            try:
                return _drawn(position)
            finally:
                parts["noise"] += time.perf_counter() - started

        noise.gumbel = timed_gumbel
        n, i = 0, 0
        for shape in shapes:
            for depth, P in enumerate(shape["parents"]):
                logits = draft_bank[[(i + j) % len(draft_bank) for j in range(P)]]  # [P, Vd]
                i += 1
                started, before = time.perf_counter(), parts["noise"]
                if mode == "coupled":
                    noise.draft(logits, n + depth + 1, target_ids, k)
                elif mode == "rejection":
                    noise.proposals(logits, k)
                else:
                    torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)
                parts["drafter"] += time.perf_counter() - started - (parts["noise"] - before)
            if ahead is not None and mode != "greedy":
                started = time.perf_counter()
                noise.ahead(next_positions(n, ahead[0]))
                parts["noise"] += time.perf_counter() - started
                time.sleep(ahead[1])  # the device verifies
            q = len(shape["rows"])
            logits = bank[[(i + j) % len(bank) for j in range(q)]]  # [q, V]
            started, before = time.perf_counter(), parts["noise"]
            if mode == "greedy":
                logits.argmax(-1).tolist()
            elif mode == "coupled":
                noise.sample(logits, [n + lv for lv in shape["row_level"]])
            else:
                probs = warp(logits, s).softmax(-1)  # [q, V]
                children: dict[int, list[int]] = {}
                for v, p in zip(shape["rows"][1:], shape["row_parent"][1:]):
                    children.setdefault(p, []).append(v)
                rejection_path(children, shape["token"], {v: probs[j] for j, v in enumerate(shape["rows"])},
                               noise, n, dict(zip(shape["rows"], shape["row_level"])))
            parts["target"] += time.perf_counter() - started - (parts["noise"] - before)
            n += shape["committed"]
        for name, seconds in parts.items():
            us = 1e6 * seconds / len(shapes)
            best[name] = min(best.get(name, us), us)
    return best


def record(decoder: Decoder, prompts: list[str], new: int) -> tuple[list[dict], list[torch.Tensor], float]:
    """The decode's cycles, the target logits rows it sampled from, and the emulated cycle's mean ms."""
    rows: list[torch.Tensor] = []
    sample = Noise.sample

    def keep(self, logits, positions):
        rows.extend(logits[:2].detach().cpu())
        return sample(self, logits, positions)

    cycles: list[dict] = []
    with mock.patch.object(Noise, "sample", keep):
        for prompt in prompts:
            cycles += decoder.generate(prompt, new).cycles
    ms = statistics.mean(1e3 * sum(c[f"t_{p}_s"] for p in ("draft", "select", "verify", "commit")) for c in cycles)
    return cycles, rows, ms


def main(argv: list[str] | None = None) -> None:
    parser = bench.parser(__name__, __doc__.split("\n\n")[0])
    parser.add_argument("--configfile", default="config.yaml")
    parser.add_argument("--methods", default="eagle3", help="comma-separated methods (a SpecFit kind needs the "
                        "workflow's calibration of the toy on cpu-a100)")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--new", type=int, default=128, help="output tokens per request (the gsm8k workload's)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--verify-ms", type=float, default=10.0, help="the device's verify per cycle while the "
                        "noise worker draws ahead (half a resident device's 20 ms cycle)")
    args = parser.parse_args(argv)
    keys = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    Sampling(**keys)  # refused by name before anything loads
    root = Path(args.configfile).parent
    prompts = questions(root / "data/raw/spec_bench/question.jsonl", "math_reasoning", args.requests)
    print("A100 ms: the emulated A100's mean cycle (virtual clock); greedy: greedy's own drafter and target work; "
          "added: the mode's noise, drafter and target work less greedy's; % of the A100's cycle and of a resident "
          "device's 20 ms")
    print(f"host work of sampling per cycle (T {args.temperature}, top-p {args.top_p}, top-k {args.top_k}), "
          f"at a {VOCAB:,}-token target and a {DRAFT_VOCAB:,}-token drafter; CPU wall µs per cycle, one thread; "
          f"cycle shapes from the toy decoding {len(prompts)} GSM8K questions on the emulated A100 (virtual clock)")
    print(f"noise ahead: the noise the host still waits for when each cycle's next positions are drawn by a worker "
          f"thread while the device verifies for {args.verify_ms:g} ms (Noise.ahead, as decoding does); % of 20 ms")
    print(f"{'method':<16}{'mode':<11}{'cycles':>7}{'A100 ms':>9}{'greedy':>9}{'noise':>8}{'drafter':>9}"
          f"{'target':>9}{'added':>9}{'% A100':>8}{'% 20 ms':>9}{'noise % 20 ms':>15}{'noise ahead':>13}"
          f"{'%':>6}")
    calibrations: dict[tuple[str, str], dict] = {}
    for method in args.methods.split(","):
        for mode in ("coupled", "rejection"):
            s = Sampling(**keys, sampling=mode)
            decoder = Decoder.from_config("toy", "cpu-a100", method, configfile=args.configfile,
                                          sampling=s.record())
            cycles, rows, cycle_ms = record(decoder, prompts, args.new)
            calibrations[method, mode] = level_calibration(cycles)
            shapes = cycle_shapes(cycles, decoder.loaded.method.config.top_k_expand)
            bank, draft_bank = padded(rows[:64], VOCAB), padded(rows[:64], DRAFT_VOCAB)
            k = decoder.loaded.method.config.top_k_expand
            greedy = sum(replay(shapes, bank, draft_bank, s, "greedy", k, args.repeats).values())
            parts = replay(shapes, bank, draft_bank, s, mode, k, args.repeats)
            depth = decoder.loaded.method.max_depth
            waited = replay(shapes, bank, draft_bank, s, mode, k, 1, (depth, args.verify_ms / 1e3))["noise"]
            added = sum(parts.values()) - greedy
            print(f"{method:<16}{mode:<11}{len(cycles):>7}{cycle_ms:>9.0f}{greedy:>9.0f}{parts['noise']:>8.0f}"
                  f"{parts['drafter']:>9.0f}{parts['target']:>9.0f}{added:>9.0f}{100 * added / 1e3 / cycle_ms:>7.2f}%"
                  f"{100 * added / 1e3 / RESIDENT_CYCLE_MS:>8.1f}%"
                  f"{100 * parts['noise'] / 1e3 / RESIDENT_CYCLE_MS:>14.1f}%{waited:>13.0f}"
                  f"{100 * waited / 1e3 / RESIDENT_CYCLE_MS:>5.1f}%")
    print("On a GPU host the drafter's and target's parts run on the device beside their forwards; the noise is the "
          "host's (drawn on the CPU, then moved).")
    print("\ncommit probabilities against acceptance, per level: verified nodes whose parent was committed, their mean "
          "predicted conditional probability (the drafter's, as the mode derives it) and the share committed")
    for (method, mode), levels in calibrations.items():
        cells = "  ".join(f"L{d} {p:.2f}/{a:.2f} (n {n})" for d, (n, p, a) in levels.items())
        print(f"{method:<16}{mode:<11}{cells}")

if __name__ == "__main__":
    main()
