"""``python -m specfit.bench exact``: what an exact verify costs on this CPU, against a batched one.

A verify of root + 7 nodes (a depth-4 chain with three siblings, as SpecFit's selections at K = 7 look) over a
committed prefix, timed on the target as the decode stages run it (on the offload engine, every expert resident,
so the copies, which both verifies share, are left out): ``exact`` computes each row as AR's one-row step
(`specfit.speculative.exact`, its fast path), ``modules`` the same through the decoder layers' modules
(`module_tree_forward`, the reference it equals bit for bit), ``batched`` runs one tree-masked forward over the 8
rows. The median of ``--repeats`` verifies each (the cache cropped back after each), and one AR step for scale. Two
targets: the shipped toy (float32, as the default DAG runs it) and a Qwen3-30B-A3B-shaped model with random weights
(its layer shapes, bfloat16, ``--layers`` of its 48 layers, its 151,936-token LM head). CPU wall time: on a GPU the
proportions differ (docs/gpu.md).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from specfit import bench
from specfit.engine.offload import make_engine
from specfit.models.loading import load_target
from specfit.models.verify_mode import set_verify
from specfit.speculative.exact import module_tree_forward
from specfit.speculative.tree import crop
from specfit.speculative.verify import Target

PARENT = [-1, 0, 1, 2, 3, 0, 1, 2]  # root, a depth-4 chain, a sibling at each of the first three levels
DEPTH = [0, 1, 2, 3, 4, 1, 2, 3]
TOY = Path("data/models/toy/target")


def qwen3_shaped(layers: int) -> torch.nn.Module:
    """Qwen3-30B-A3B's shapes (hidden 2048, 128 experts of 768, top-8, 32/4 heads of 128) at ``layers`` layers."""
    config = Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM._from_config(config, dtype=torch.bfloat16).eval()


def time_verifies(model: torch.nn.Module, prefix: int, repeats: int) -> dict[str, float]:
    """Median ms of one AR step and of an exact (fast path and module path) and a batched 8-row verify over
    ``prefix`` committed tokens."""
    engine = make_engine(model, model.config.num_experts, 1, None, "cpu", None)  # every expert resident
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (prefix,), generator=gen).tolist()
    tokens = torch.randint(0, vocab, (len(PARENT),), generator=gen).tolist()
    target = Target(model, engine)
    times = {}
    with torch.no_grad():
        target.forward(prompt)
        for name, mode, rows in (("ar_step", "exact", 1), ("exact", "exact", 8), ("modules", "exact", 8),
                                 ("batched", "batched", 8)):
            set_verify(model, mode)
            samples = []
            for _ in range(repeats + 1):  # the first is a warm-up
                started = time.perf_counter()
                if rows == 1:
                    target.forward(tokens[:1])
                elif name == "modules":
                    module_tree_forward(model, target.cache, tokens, PARENT, DEPTH, engine)
                else:
                    target.forward(tokens, PARENT, DEPTH)
                samples.append(time.perf_counter() - started)
                crop(target.cache, prefix)
            times[name] = statistics.median(samples[1:]) * 1e3
    engine.close()
    return times


def main(argv: list[str] | None = None) -> None:
    parser = bench.parser(__name__, __doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--prefix", type=int, default=256, help="committed tokens before the verify")
    parser.add_argument("--layers", type=int, default=2, help="layers of the Qwen3-30B-A3B-shaped model")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the decode stages run 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    targets = []
    if TOY.exists():
        targets.append(("toy (float32, 4 layers)", load_target(TOY, "float32", "cpu")[0]))
    else:
        print(f"(no shipped toy at {TOY}: run from the workflow's root; timing the Qwen3-shaped model only)")
    targets.append((f"Qwen3-30B-A3B shapes (bfloat16, {args.layers} of 48 layers)", qwen3_shaped(args.layers)))
    print(f"CPU wall time, {args.threads} thread(s), median of {args.repeats}; verify of root + 7 nodes over "
          f"{args.prefix} committed tokens, every expert resident")
    print(f"{'target':<44} {'AR step ms':>11} {'batched ms':>11} {'exact ms':>10} {'modules ms':>11} "
          f"{'exact/batched':>14} {'modules/exact':>14}")
    for name, model in targets:
        t = time_verifies(model, args.prefix, args.repeats)
        print(f"{name:<44} {t['ar_step']:>11.2f} {t['batched']:>11.2f} {t['exact']:>10.2f} {t['modules']:>11.2f} "
              f"{t['exact'] / t['batched']:>13.2f}x {t['modules'] / t['exact']:>13.2f}x")


if __name__ == "__main__":
    main()
