"""``python -m specfit.bench predictor``: the learned route predictor's cost at a model's size, printed.

Builds `specfit.speculative.learned.RoutePredictor` at the given size (default: Qwen3-30B-A3B, hidden 2048, 48 MoE
layers, 128 experts, top-8; random weights: the cost does not depend on them) and times the prediction of one
full pool (the root and 18 draft nodes) on the device, as `LearnedRoutes` runs it inside SpecFit's selection
(`FoldedHead`).
"""

import numpy as np
import torch

from specfit import bench
from specfit.speculative.learned import POOL_NODES, RoutePredictor, pool_times
from specfit.speculative.routes import predictor_cost


def main(argv=None) -> None:
    parser = bench.parser(__name__, __doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    predictor = RoutePredictor(args.hidden, args.layers, args.experts, args.top_k).to(args.device, dtype).eval()
    cost = predictor_cost(args.hidden, args.layers, args.experts)
    with torch.inference_mode():
        times = np.array(pool_times(predictor, args.device, dtype, args.repeats)) * 1e6
    print(f"route predictor: hidden {args.hidden}, {args.layers} MoE layers x {args.experts} experts, top-{args.top_k}")
    print(f"  parameters:            {cost['params']:,} ({cost['params'] / 1e6:.1f}M)")
    print(f"  FLOP per node:         {cost['flop_per_node'] / 1e6:.1f} MFLOP; per pool of {POOL_NODES} nodes: "
          f"{POOL_NODES * cost['flop_per_node'] / 1e6:.0f} MFLOP")
    print(f"  one pool on {args.device} ({args.dtype}): median {np.median(times):.1f} us, "
          f"p10 {np.percentile(times, 10):.1f} us, p90 {np.percentile(times, 90):.1f} us ({args.repeats} calls)")


if __name__ == "__main__":
    main()
