"""``python -m specfit.bench link``: the emulated links of the toy config, measured on this machine.

Times uncached AR steps of a target on the CPU with no link (compute and real memory copies only), counts
its expert transfers per step, and prints the links under which the copies take three quarters of an
uncached AR step, as on the paper's A100 (Table 2: about 400 transfers of 0.41 ms in a 214 ms step), and the
RTX 4090's link, as much slower per expert as its fitted β without the cache (0.78 vs 0.41 ms, Section 4.5).
Paste the figures into config.yaml.
"""

from __future__ import annotations

import time

import torch

from specfit import bench
from specfit.engine.link import LinkModel, link_for_copy_share
from specfit.engine.offload import make_engine
from specfit.models import load_target
from specfit.selection.coefficients import preset


def uncached_ar_step(model, engine, prompt_len: int, steps: int) -> tuple[float, float]:
    """(seconds, transfers) per AR decode step with the expert cache cleared before every forward."""
    from transformers import DynamicCache

    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len))
    with torch.inference_mode():
        cache = DynamicCache()
        token = model(input_ids=ids, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
        engine.reset_stats()
        start = time.perf_counter()
        for _ in range(steps):
            token = model(input_ids=token, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
        seconds = time.perf_counter() - start
    return seconds / steps, engine.stats()["h2d_transfers"] / steps


def main(argv: list[str] | None = None) -> None:
    parser = bench.parser(__name__, __doc__)
    parser.add_argument("--target", default="data/models/toy/target")
    parser.add_argument("--share", type=float, default=0.75, help="copy share of an uncached AR step")
    parser.add_argument("--latency-us", type=float, default=50.0)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (Snakemake's --cores 1 gives 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_target(args.target, "float32", "cpu")
    engine = make_engine(model, slots=0)
    uncached_ar_step(model, engine, args.prompt_len, 4)  # warm-up
    step_s, transfers = uncached_ar_step(model, engine, args.prompt_len, args.steps)
    a100 = link_for_copy_share(step_s, transfers, engine.expert_bytes, args.share, args.latency_us * 1e-6)
    per_copy_s = a100.copy_s(engine.expert_bytes)
    # the RTX 4090's fitted cost per expert without the cache, relative to the A100's (Appendix B)
    slower = per_copy_s * preset("paper-rtx4090", cache=False)["beta"] / preset("paper-a100", cache=False)["beta"]
    rtx = LinkModel(engine.expert_bytes / (slower - a100.latency_s), a100.latency_s)
    print(f"target {args.target}: expert {engine.expert_bytes / 1e6:.3f} MB, {transfers:.1f} transfers per uncached "
          f"AR step, {1e3 * step_s:.2f} ms per step without a link ({args.threads} thread(s), cpu memory copies)")
    print(f"A100-like link (copies {100 * args.share:.0f}% of an uncached AR step, "
          f"{1e3 * per_copy_s:.3f} ms per expert):"
          f" bandwidth_gbps: {a100.bandwidth_bytes_per_s / 1e9:.4f}, latency_us: {args.latency_us:g}")
    print(f"RTX 4090-like link ({1e3 * slower:.3f} ms per expert):"
          f" bandwidth_gbps: {rtx.bandwidth_bytes_per_s / 1e9:.4f}, latency_us: {args.latency_us:g}")
    engine.close()


if __name__ == "__main__":
    main()
