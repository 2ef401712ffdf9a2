"""Stage predictor: a learned route predictor, so that SpecFit needs no oracle (beyond the paper).

The paper reads every draft node's routes from the target (an oracle) and only estimates a predictor: a linear
head from a hidden state to every MoE layer's router, 12.6M parameters at Qwen3-30B-A3B's size (Section 4.6).
`RoutePredictor` is that head, fed with what the drafter holds for a node before verification: the two inputs of
the node's own EAGLE-3 drafter row, the hidden state it reads (the fused target feature for the root, the
drafter's output at the parent for a draft node) and its token's embedding.

    x_v = [feature_v ; embed(token_v)]              [2H]
    logits_v = W · (x_v - mean) / std + bias        [L, E] one router per MoE layer
    Ê_{l,v} = top-k of logits_v[l]

Training data are the target's own routes of drafted pools: EAGLE-3's decode of non-evaluated prompts, each cycle
drafting the full pool and querying the target's routes of root + pool once (as the atlas build does). The
requests are split in order: the last ``validation_requests`` are held out for the metrics, whose route accuracy
is over draft nodes (the root's routes, known to every subtree alike, are stated apart). Training is a step
budget with a fixed seed (the same weights on a busy machine), loss the cross-entropy of each layer's router
against its true top-k set, averaged over layers.

At decode time `LearnedRoutes` predicts routes inside the request timer (its time is selection time) from the
cycle's drafter state alone: it never reads the atlas or runs the target.

spec: {model, dtype, logits_dtype, torch_device, limit_tokens, max_new_tokens, k_max, max_depth, top_k_expand,
       validation_requests, steps, batch_size, lr, seed}
inputs: prompts (Parquet), target, drafter (checkpoint folders)
outputs: predictor (folder: config.json, model.safetensors, metrics.json)
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from specfit.engine.offload import make_engine
from specfit.errors import SpecFitError
from specfit.io import atomic_path, write_json
from specfit.models import check_checkpoints, eos_ids, load_drafter, load_target
from specfit.planning.stage import stage_main
from specfit.results.records import read_prompts
from specfit.speculative.config import MethodConfig
from specfit.speculative.kinds import EAGLE3
from specfit.speculative.learned import POOL_NODES, RoutePredictor, node_inputs, pool_times
from specfit.speculative.methods import Eagle3
from specfit.speculative.request import Limits, decode_request
from specfit.speculative.routes import predictor_cost
from specfit.toy.train import cosine_lr, seed_everything, state_digest, train_loop

log = logging.getLogger(__name__)

METRICS = "metrics.json"


class _Recorder(Eagle3):
    """EAGLE-3's decode, recording every full pool's predictor inputs and the target's routes of root + pool."""

    def __init__(self, config: MethodConfig):
        super().__init__(config)
        self.inputs: list[torch.Tensor] = []  # [n+1, 2H] per cycle
        self.routes: list[torch.Tensor] = []  # [n+1, L, k] per cycle

    def select(self, cycle, pool, final):
        if final and pool.n > 0:
            with cycle.clock.excluded():
                self.inputs.append(node_inputs(cycle.drafter, cycle.draft, pool, range(pool.n + 1)).cpu())
                self.routes.append(cycle.target.routes(pool))
        return super().select(cycle, pool, final)


def collect(model, drafter, engine, prompts: list[dict], limits: Limits, method: MethodConfig):
    """(inputs [N, 2H], routes [N, L, k], is_root [N] bool) per request, from EAGLE-3 decodes of ``prompts``."""
    data = []
    for prompt in prompts:
        recorder = _Recorder(method)
        decode_request(model, drafter, recorder, prompt["prompt_ids"], request_id=prompt["request_id"],
                       question_id=prompt["question_id"], limits=limits, engine=engine)
        if recorder.inputs:
            is_root = torch.cat([torch.arange(len(r)) == 0 for r in recorder.routes])  # [N]
            data.append((torch.cat(recorder.inputs).float(), torch.cat(recorder.routes), is_root))
    return data


def route_loss(logits: torch.Tensor, routes: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each layer's router against its true top-k set. logits [N, L, E], routes [N, L, k]."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # [N, L, E]
    return -log_probs.gather(-1, routes).mean()


@torch.no_grad()
def recall(predictor: RoutePredictor, x: torch.Tensor, routes: torch.Tensor) -> torch.Tensor:
    """[L] fraction of the true top-k experts the predicted top-k holds, per layer (the paper's route accuracy)."""
    predicted = predictor.routes(x)  # [N, L, k]
    hits = (predicted[..., :, None] == routes[..., None, :]).any(-1)  # [N, L, k]
    return hits.float().mean(dim=(0, 2))


def train(x: torch.Tensor, routes: torch.Tensor, predictor: RoutePredictor, spec: dict) -> dict:
    """Fit ``predictor`` on x [N, 2H], routes [N, L, k] for ``spec['steps']`` steps of ``batch_size`` nodes."""
    predictor.mean.copy_(x.mean(0))
    predictor.std.copy_(x.std(0).clamp_min(1e-6))
    optimizer = torch.optim.AdamW(predictor.parameters(), lr=spec["lr"], weight_decay=0.0)
    generator = torch.Generator().manual_seed(spec["seed"])
    batch = min(spec["batch_size"], len(x))

    def step(i: int, progress: float) -> dict:
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(spec["lr"], progress)
        rows = torch.randint(len(x), (batch,), generator=generator)
        loss = route_loss(predictor(x[rows]), routes[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"loss": loss.item()}

    return train_loop(step, spec["steps"], "route predictor", key="predictor")


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    seed_everything(spec["seed"], spec["threads"])
    check_checkpoints(inputs["target"], inputs["drafter"], spec["model"])
    keys = {name: f"models.{spec['model']}.{name}" for name in ("target", "drafter")}
    prompts = read_prompts(inputs["prompts"], None)
    held_out = spec["validation_requests"]
    if len(prompts) <= held_out:
        raise SpecFitError(f"predictor: {len(prompts)} prompts, but `predictor.validation_requests` = {held_out} "
                           "are held out: add question ids to `predictor.question_ids`")
    model, _ = load_target(inputs["target"], spec["dtype"], "cpu", key=keys["target"],
                           logits_dtype=spec["logits_dtype"], verify=spec["verify"])
    # slots 0 (no expert cache: each forward copies what it routes to) and no link: the routes do not depend on the
    # cache, and nothing here is timed as a decode
    engine = make_engine(model, 0, 2, None, spec["torch_device"])
    drafter = load_drafter(inputs["drafter"], model, device=spec["torch_device"], key=keys["drafter"])
    limits = Limits(spec["limit_tokens"], spec["max_new_tokens"], eos_ids(model))
    method = MethodConfig(EAGLE3.name, k_max=spec["k_max"], max_depth=spec["max_depth"],
                          top_k_expand=spec["top_k_expand"])
    with torch.inference_mode():
        data = collect(model, drafter, engine, prompts, limits, method)
    split = len(data) - held_out
    train_x, train_routes, _ = (torch.cat(t).to(spec["torch_device"]) for t in zip(*data[:split]))
    val_x, val_routes, val_root = (torch.cat(t).to(spec["torch_device"]) for t in zip(*data[split:]))

    hidden = drafter.embed_tokens.embedding_dim
    predictor = RoutePredictor(hidden, engine.num_layers, engine.num_experts, engine.top_k).to(spec["torch_device"])
    stats = train(train_x, train_routes, predictor, spec)
    predictor.eval()
    nodes = ~val_root  # the draft nodes: what SpecFit's union grows by
    per_layer = recall(predictor, val_x[nodes], val_routes[nodes])  # [L]
    metrics = {
        "route_accuracy": float(per_layer.mean()),
        "recall_per_layer": [round(float(r), 4) for r in per_layer],
        "root_accuracy": float(recall(predictor, val_x[val_root], val_routes[val_root]).mean()),
        "train_accuracy": float(recall(predictor, train_x, train_routes).mean()),
        "chance_accuracy": engine.top_k / engine.num_experts,
        "train_requests": split, "validation_requests": held_out,
        "train_nodes": len(train_x), "validation_nodes": len(val_x),
        **predictor.config, **predictor_cost(hidden, engine.num_layers, engine.num_experts),
        "us_per_pool": 1e6 * float(np.median(pool_times(predictor, spec["torch_device"]))),
        "pool_nodes_timed": POOL_NODES, "torch_device": spec["torch_device"],
        "training": stats, "sha256": state_digest(predictor),
    }
    log.info("route accuracy %.3f (per layer %s), %d parameters, %.1f us per pool", metrics["route_accuracy"],
             metrics["recall_per_layer"], metrics["params"], metrics["us_per_pool"])
    with atomic_path(outputs["predictor"], directory=True) as tmp:
        predictor.cpu().save(tmp)
        write_json(metrics, tmp / METRICS)


main = stage_main(run, trains=True)

if __name__ == "__main__":
    main()
