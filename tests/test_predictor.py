"""The learned route predictor: its shapes, its reproducible training, and SpecFit decoding with it,
lossless, without an atlas and without querying the target."""

import json
import os

import numpy as np
import pytest
import torch

from specfit.errors import SpecFitError
from specfit.planning import specs
from specfit.selection.pool import CandidatePool
from specfit.speculative import routes as routes_module
from specfit.speculative.cycle import Cycle
from specfit.speculative.draft import draft_level, new_draft_state, sync
from specfit.speculative.learned import LearnedRoutes, RoutePredictor, node_inputs
from specfit.speculative.routes import predictor_cost
from specfit.speculative.verify import Target
from specfit.stages import decode, predictor

DEVICE = os.environ.get("SPECFIT_TEST_DEVICE", "cpu")  # scripts/gpu_check.sh: cuda


def spec(**over):
    return {"model": "tiny", "dtype": "float32", "logits_dtype": "model", "verify": "exact", "torch_device": DEVICE,
            "limit_tokens": 40, "max_new_tokens": 10, "k_max": 7, "max_depth": 5, "top_k_expand": 2,
            "validation_requests": 1, "steps": 30, "batch_size": 64, "lr": 0.003, "seed": 0, "threads": 1, **over}


def stream_spec(name, **method):
    """The decode stage's spec as the workflow builds it (`specfit.planning.specs.decode`) for the tiny pair: a config
    of one model, device and workload, ``method`` as its method entry; and a 3-token warm-up (a test's knob: the rule
    leaves the stage's default)."""
    config = {"seed": 0, "models": {"tiny": {"dtype": "float32", "logits_dtype": "model", "verify": "exact"}},
              "devices": {"test": {"torch_device": DEVICE, "max_inflight": 2, "link": None, "emulate": None}},
              "workloads": {"test": {"limit_tokens": 40, "max_new_tokens": 12}},
              "methods": {"test": {"kind": name, **method}}}
    return {**specs.decode(config, "tiny", "test", "test", "test", 4), "warmup_tokens": 3}


@pytest.fixture(scope="module")
def trained(files, tmp_path_factory):
    """The predictor stage on the tiny pair's two prompts (one trains, one is held out), run twice."""
    folders = []
    for i in range(2):
        folder = tmp_path_factory.mktemp("predictor") / f"run{i}"
        predictor.run(spec(), {k: files[k] for k in ("prompts", "target", "drafter")}, {"predictor": folder})
        folders.append(folder)
    return folders


def test_shapes_and_cost():
    model = RoutePredictor(hidden_size=16, num_layers=3, num_experts=8, top_k=2)
    x = torch.randn(5, 32)  # [N, 2H]
    assert model(x).shape == (5, 3, 8)
    routes = model.routes(x)
    assert routes.shape == (5, 3, 2) and routes.dtype == torch.int64
    assert torch.equal(routes, model(x).topk(2, dim=-1).indices)
    assert sum(p.numel() for p in model.parameters()) == predictor_cost(16, 3, 8)["params"] == 33 * 24
    # Qwen3-30B-A3B: a [4096 -> 48 x 128] head, twice the paper's 12.6M (its head reads one hidden state)
    assert predictor_cost(2048, 48, 128) == {"params": 25_171_968, "flop_per_node": 50_331_648}


def test_loss_and_recall_on_a_constructed_case():
    model = RoutePredictor(hidden_size=1, num_layers=2, num_experts=4, top_k=2)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([4.0, 3.0, 0.0, 0.0, 0.0, 0.0, 2.0, 1.0]))  # layer 0: {0, 1}, 1: {2, 3}
    x = torch.zeros(1, 2)
    truth = torch.tensor([[[0, 1], [3, 0]]])  # [1, L=2, k=2]: layer 0 right, layer 1 half right
    assert predictor.recall(model, x, truth).tolist() == [1.0, 0.5]
    logits = model(x)  # [1, 2, 4]
    log_probs = torch.log_softmax(logits, -1)
    expected = -(log_probs[0, 0, [0, 1]].sum() + log_probs[0, 1, [3, 0]].sum()) / 4
    assert predictor.route_loss(logits, truth).item() == pytest.approx(expected.item())


def test_save_load_round_trip_and_missing_folder(tmp_path):
    torch.manual_seed(0)
    model = RoutePredictor(hidden_size=8, num_layers=2, num_experts=6, top_k=2)
    model.std.fill_(2.0)
    model.save(tmp_path)
    loaded = RoutePredictor.load(tmp_path)
    x = torch.randn(4, 16)
    assert torch.equal(loaded(x), model(x))
    with pytest.raises(SpecFitError, match="holds no route predictor.*predictor rule"):
        RoutePredictor.load(tmp_path / "nowhere")


def test_training_is_reproducible_and_measured(trained, target):
    first, second = (json.loads((f / predictor.METRICS).read_text()) for f in trained)
    assert first["sha256"] == second["sha256"]  # same seed and steps: the same weights
    layers, experts, k = target.config.num_hidden_layers, target.config.num_experts, target.config.num_experts_per_tok
    assert (first["num_layers"], first["num_experts"], first["top_k"]) == (layers, experts, k)
    assert len(first["recall_per_layer"]) == layers
    assert first["route_accuracy"] == pytest.approx(np.mean(first["recall_per_layer"]), abs=1e-4)
    assert 0.0 <= first["route_accuracy"] <= 1.0 and first["chance_accuracy"] == k / experts
    assert first["train_requests"] == 1 and first["validation_requests"] == 1
    assert first["train_nodes"] > 0 and first["validation_nodes"] > 0
    assert first["params"] == (2 * target.config.hidden_size + 1) * layers * experts
    assert first["training"]["steps"] == 30 and first["us_per_pool"] > 0


def test_too_few_prompts_is_named_before_training(files, tmp_path):
    with pytest.raises(SpecFitError, match=r"2 prompts, but `predictor.validation_requests` = 2"):
        predictor.run(spec(validation_requests=2), files, {"predictor": tmp_path / "p"})


def test_learned_routes_read_only_the_drafter_state(trained, target, drafter, prompts):
    """Routes for a pool from the cycle's drafter state alone: no target (None here), predicted once per node."""
    source = LearnedRoutes(trained[0])
    with torch.inference_mode():
        state = new_draft_state()
        tgt = Target(target, None, drafter.aux_layer_ids)
        logits, aux = tgt.forward(prompts[0])  # as Session.prefill runs the prompt
        root = int(logits[-1].argmax())
        state.pending = (prompts[0][1:] + [root], [aux])
        sync(drafter, state)
        pool = CandidatePool.root_only(root)
        cycle = Cycle(0, 0, len(prompts[0]), [root], target=None, drafter=drafter, draft=state)
        draft_level(drafter, state, pool)
        level1 = source.routes(cycle, pool)
        draft_level(drafter, state, pool)
        both = source.routes(cycle, pool)
        expected = source.predictor.routes(node_inputs(drafter, state, pool, range(pool.n + 1))).numpy()
    assert both.shape == (pool.n + 1, target.config.num_hidden_layers, target.config.num_experts_per_tok)
    assert np.array_equal(both[: len(level1)], level1)
    assert np.array_equal(np.sort(both, -1), np.sort(expected, -1))  # the folded head: the same experts per layer
    assert source.stats()["nodes"] == pool.n + 1 and source.stats()["cycles"] == 1 and source.seconds > 0


def test_learned_specfit_is_lossless_without_atlas_or_target_query(trained, files, tmp_path, monkeypatch):
    ar = {k: tmp_path / f"ar.{k}" for k in ("requests", "cycles", "metrics")}
    decode.run(stream_spec("ar"), files, ar)

    def forbidden(*args, **kwargs):
        raise AssertionError("a learned route source read the atlas or queried the target's routes")

    monkeypatch.setattr(Target, "routes", forbidden)
    monkeypatch.setattr(routes_module.AtlasRoutes, "__init__", forbidden)
    run = {k: tmp_path / f"learned.{k}" for k in ("requests", "cycles", "metrics")}
    inputs = {**files, "predictor": trained[0], "reference": ar["requests"]}
    decode.run(stream_spec("specfit", routes="learned"), inputs, run)
    metrics = json.loads(run["metrics"].read_text())
    assert metrics["lossless"]["n_identical"] == metrics["lossless"]["n_requests"] == 2
    used = metrics["route_predictor"]
    assert used["nodes"] > 0 and used["cycles"] > 0 and used["seconds"] > 0
    assert 0 < used["share_of_cycle_time_pct"] < 100
    with pytest.raises(SpecFitError, match="needs the `predictor` input"):
        decode.run(stream_spec("specfit", routes="learned"), files, {k: tmp_path / f"x.{k}" for k in ar})
