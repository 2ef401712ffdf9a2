"""``python -m specfit.bench decode``: a decode job's wall time per request through the exact verify's paths, the
earlier ones beside what decoding runs now, on this machine in one run.

The toy (config.yaml's ``toy`` on ``cpu-a100`` at its with-cache slots) decodes the first ``--requests``
questions of a Spec-Bench category (``math_reasoning``: the GSM8K questions of the gsm8k workload) with plain EAGLE-3
through the decode stage's code path (`specfit.api.Decoder`: `specfit.speculative.loading`, the stage's warm-up, the
engine's cache shared by the requests), once per path from an empty cache:

- "modules": the verify through the decoder layers' modules (`specfit.speculative.exact.module_tree_forward`);
- "rows": the row pass the verify "exact" runs (`exact_tree_forward`), every expert call through the target's
  grouped_mm over all the layer's slot rows, a forward with misses in groups as its copies land;
- "rows, one-token experts": the same, with a call whose experts hold one entry each computing only those
  (`specfit.engine.one_token`; AR's steps too);
- "rows, one-token, host rows": and every forward computing its union from the host rows in one call, its copies
  counted and modelled but not made (`OffloadConfig.host_compute`): what decoding runs now on a CPU.

It prints each path's mean wall seconds per request, its ratio to the first, and whether every path produced the
same output tokens (they must: each is AR's arithmetic row by row).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from unittest import mock

from specfit import bench
from specfit.api import Decoder
from specfit.speculative import verify
from specfit.speculative.exact import exact_tree_forward, module_tree_forward

PATHS = {  # name: (the verify's tree forward, one-token experts, host compute)
    "modules": (module_tree_forward, False, False),
    "rows": (exact_tree_forward, False, False),
    "rows, one-token experts": (exact_tree_forward, True, False),
    "rows, one-token, host rows": (exact_tree_forward, True, True),
}


def questions(path: Path, category: str, count: int) -> list[str]:
    """The first turns of the first ``count`` questions of ``category`` in Spec-Bench's question.jsonl."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows if r["category"] == category][:count]


def decode_paths(decoder: Decoder, prompts: list[str], new: int) -> dict[str, tuple[list[float], list[list[int]]]]:
    """Per path: each request's wall seconds and output ids, from an empty cache."""
    decoder.generate(prompts[0], 1)  # the decode stage's warm-up (compiles, allocates), off both paths' clocks
    runs = {}
    engine = decoder.loaded.engine
    applies = [layer.one_token for layer in engine.layers]  # where the implementation allows it (`one_token.applies`)
    host_compute = engine.host_compute
    for name, (forward, one_token, host) in PATHS.items():
        decoder.reset()
        engine.host_compute = host and host_compute
        for layer, allowed in zip(engine.layers, applies):
            layer.one_token = one_token and allowed
        seconds, outputs = [], []
        with mock.patch.object(verify, "exact_tree_forward", forward):  # what Target.run calls for "exact"
            for prompt in prompts:
                started = time.perf_counter()
                outputs.append(decoder.generate(prompt, new).output_ids)
                seconds.append(time.perf_counter() - started)
        runs[name] = (seconds, outputs)
    engine.host_compute = host_compute
    for layer, allowed in zip(engine.layers, applies):
        layer.one_token = allowed
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = bench.parser(__name__, __doc__.split("\n\n")[0])
    parser.add_argument("--configfile", default="config.yaml")
    parser.add_argument("--method", default="eagle3")
    parser.add_argument("--category", default="math_reasoning", help="Spec-Bench category (GSM8K's)")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--new", type=int, default=128, help="output tokens per request (the gsm8k workload's)")
    args = parser.parse_args(argv)
    decoder = Decoder.from_config("toy", "cpu-a100", args.method, configfile=args.configfile)
    root = Path(args.configfile).parent
    prompts = questions(root / "data/raw/spec_bench/question.jsonl", args.category, args.requests)
    runs = decode_paths(decoder, prompts, args.new)
    print(f"toy, {args.method}, {len(prompts)} {args.category} requests of {args.new} new tokens, verify exact; "
          "CPU wall seconds per request (mean)")
    first = None
    for name, (seconds, _) in runs.items():
        mean = sum(seconds) / len(seconds)
        first = first or mean
        print(f"{name:<28} {mean:>8.3f} s  {first / mean:>5.2f}x   ({', '.join(f'{s:.3f}' for s in seconds)})")
    outputs = [out for _, out in runs.values()]
    print(f"outputs identical on every path: {'yes' if all(o == outputs[0] for o in outputs) else 'NO'}")


if __name__ == "__main__":
    main()
