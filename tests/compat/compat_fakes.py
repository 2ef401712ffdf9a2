"""Tiny fakes of the real checkpoints, laid out as the real users have them (no hub, nothing downloaded).

- ``target``: a Qwen3-30B-A3B look-alike. Its ``config.json`` has the real checkpoint's keys (``model_type``
  qwen3_moe, ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``,
  ``decoder_sparse_step``, ``mlp_only_layers``, ``rope_theta``, ``rope_scaling``, ``torch_dtype``, ...) with
  tiny sizes; its weights are bf16 in the hub checkpoint's per-expert layout
  (``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight``, which transformers 5 fuses on load), written
  by hand in 3 shards with a ``model.safetensors.index.json``; a byte-level BPE tokenizer with Qwen's special
  tokens and a ChatML template; a vocabulary (320) larger than the tokenizer's (259), as Qwen pads it.
- ``drafter``: a speculators EAGLE-3 drafter as RedHatAI publishes them: ``speculators_model_type`` eagle3, a
  Llama layer config, ``norm_before_residual: true``, a 64-token draft vocabulary with ``d2t``/``t2d``,
  explicit tapped layers, bf16 weights with its own ``embed_tokens``. ``drafter_dir`` is taught the target's
  AR outputs (the decode stage's ``ar_run``) at its first draft step for 40 Adam steps, so that drafts are
  accepted and the stages commit tree nodes; the refusal tests use random drafters (``build_drafter``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, LlamaConfig, PreTrainedTokenizerFast, Qwen3MoeForCausalLM

from specfit.models.eagle3 import Eagle3Drafter
from specfit.models.speculators import eagle3_config
from specfit.planning import specs
from specfit.planning.config import SCHEMA, load_config

DEVICE = os.environ.get("SPECFIT_TEST_DEVICE", "cpu")  # scripts/gpu_check.sh runs the suite on cuda
ROOT = Path(__file__).resolve().parents[2]  # the workflow checkout: its config.yaml and config.qwen3-30b-a3b.yaml
MODEL = "qwen3-30b-a3b"  # the model's name in config.qwen3-30b-a3b.yaml: errors name models.qwen3-30b-a3b.*
# a calibration's coefficients as the calibrate stage writes them (the paper model's and specfit-ca's fits), in ms
COEFFICIENTS = {
    "b": [20.0, 20.4, 20.8, 21.2, 21.6, 22.0, 22.4, 22.8], "beta": 0.6,
    "drafting": {"start_ms": 1.0, "level_ms": 0.8, "select_ms": 0.1},
    "cache_aware": {"b": [20.0] * 8, "beta_miss": 0.6, "beta_hit": 0.02,
                    "without_drafting": {"b": [19.0, 19.3, 19.6, 19.9, 20.2, 20.5, 20.8, 21.1], "beta_miss": 0.6,
                                         "beta_hit": 0.02}},
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 256, 257, 258 after the 256 byte tokens
BOS, EOS = 256, 258
VOCAB = 320
DRAFT_VOCAB = 64
AUX = [1, 2, 3]
LIMIT, NEW = 96, 10  # the stages' limit_tokens and max_new_tokens
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen/Qwen3-30B-A3B-Instruct-2507 config.json, every key kept, sizes shrunk (2048 hidden, 48 layers, 128 experts
# of which 8 routed, 768 per expert, 151936 tokens in the original)
TARGET_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": BOS,
    "decoder_sparse_step": 1,
    "eos_token_id": EOS,
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "max_position_embeddings": 512,
    "max_window_layers": 4,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 16,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB,
}
GENERATION_CONFIG = {"bos_token_id": BOS, "do_sample": True, "eos_token_id": [EOS, BOS], "pad_token_id": BOS,
                     "temperature": 0.7, "top_k": 20, "top_p": 0.8, "transformers_version": "4.51.0"}

# Spec-Bench-like questions (question.jsonl lines): short, so that byte-level prompts stay small
QUESTIONS = [
    {"question_id": 1, "category": "qa", "turns": ["Why is the sky blue?"]},
    {"question_id": 2, "category": "summarization", "turns": ["Summarize: the cat sat on the mat all day."]},
    {"question_id": 3, "category": "math_reasoning", "turns": ["Tom has 3 apples and eats 1. How many left?"]},
]


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def save_tokenizer(path: Path) -> None:
    """A byte-level BPE without merges (every byte a token) plus Qwen's special tokens and a ChatML template."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    assert fast.convert_tokens_to_ids(SPECIALS) == [256, 257, 258]


def per_expert_state(model: Qwen3MoeForCausalLM) -> dict[str, torch.Tensor]:
    """The model's tensors under the hub checkpoint's names: fused experts split into one Linear per expert."""
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
            prefix = name[: -len("gate_up_proj")]
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                state[f"{prefix}{e}.gate_proj.weight"] = gate[e].clone()
                state[f"{prefix}{e}.up_proj.weight"] = up[e].clone()
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, I]
            prefix = name[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                state[f"{prefix}{e}.down_proj.weight"] = tensor[e].clone()
        else:
            state[name] = tensor.clone()
    return state


def save_sharded(state: dict[str, torch.Tensor], path: Path, shards: int = 3) -> None:
    """``model-0000i-of-0000n.safetensors`` and ``model.safetensors.index.json``, as the hub checkpoint."""
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n].contiguous() for n in names[i::shards]}
        save_file(part, path / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    write_json(path / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


def build_target(path: Path, seed: int = 0) -> Qwen3MoeForCausalLM:
    """The fake Qwen3-30B-A3B at ``path``; returns the model (bf16) whose weights were written."""
    path.mkdir(parents=True, exist_ok=True)
    write_json(path / "config.json", TARGET_CONFIG)
    write_json(path / "generation_config.json", GENERATION_CONFIG)
    save_tokenizer(path)
    config = AutoConfig.from_pretrained(path)  # the real keys, read as transformers reads the real checkpoint
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, 0.2)  # far from uniform logits and routes: few near-ties in bf16
    model = model.to(torch.bfloat16).eval()
    save_sharded(per_expert_state(model), path)
    return model


def new_drafter(target_config: dict = TARGET_CONFIG, seed: int = 1, layers: int = 1, model_type: str = "llama",
                keep: list[int] | None = None, **options) -> Eagle3Drafter:
    """A random fp32 speculators EAGLE-3 drafter for the fake target; ``keep``: target ids the draft vocabulary
    must hold (the rest is drawn at random); ``options``: speculators flags (norm_before_residual is on)."""
    torch.manual_seed(seed)
    layer_config = LlamaConfig(
        hidden_size=target_config["hidden_size"], intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, num_hidden_layers=layers, vocab_size=target_config["vocab_size"], rms_norm_eps=1e-6,
        max_position_embeddings=target_config["max_position_embeddings"], rope_theta=1e6,
    )
    if model_type != "llama":
        layer_config = AutoConfig.for_model(model_type, **{k: v for k, v in layer_config.to_dict().items()
                                                           if k not in ("model_type", "architectures")})
    options = {"norm_before_residual": True, **options}
    config = eagle3_config(layer_config, DRAFT_VOCAB, AUX, target_config["hidden_size"],
                           verifier="Qwen/Qwen3-30B-A3B-Instruct-2507", **options)
    config.update(speculators_version="0.3.0", torch_dtype="bfloat16")
    drafter = Eagle3Drafter(config).eval()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if not name.endswith("norm.weight") and not name.startswith("fc_norm"):
                p.normal_(0, 0.2)
        V = target_config["vocab_size"]
        keep = sorted(set(keep or []))[:DRAFT_VOCAB]
        rest = [i for i in torch.randperm(V).tolist() if i not in keep]
        kept = torch.tensor(sorted(keep + rest[: DRAFT_VOCAB - len(keep)]))  # [Vd] target ids
        drafter.d2t.copy_(kept - torch.arange(DRAFT_VOCAB))
        drafter.t2d.zero_()[kept] = True
    return drafter


def build_drafter(path: Path, target_config: dict = TARGET_CONFIG, **kw) -> Eagle3Drafter:
    """`new_drafter` saved at ``path`` in bf16, as the published drafters are."""
    drafter = new_drafter(target_config, **kw).to(torch.bfloat16)
    drafter.save_pretrained(path)
    return drafter


def fit_drafter(drafter: Eagle3Drafter, target, sequences: list[list[int]], steps: int = 40) -> float:
    """Teach ``drafter`` (fp32) the target's next token on ``sequences`` at its first draft step, so that
    drafts get accepted and the stages' commit path runs; returns the share of rows it then predicts."""
    rows = []
    with torch.no_grad():
        for seq in sequences:
            hs = target(torch.tensor([seq]), output_hidden_states=True).hidden_states
            aux = torch.cat([hs[i] for i in drafter.aux_layer_ids], dim=-1).float()  # [1, T, 3H]
            labels = torch.tensor(seq[2:])  # row t reads (x_{t+1}, h_t) and predicts x_{t+2}
            draft = torch.full_like(labels, -100)
            in_vocab = drafter.t2d[labels]
            draft[in_vocab] = torch.cumsum(drafter.t2d.long(), 0)[labels[in_vocab]] - 1  # target id -> draft id
            rows.append((torch.tensor([seq[1:-1]]), aux[:, :-2], draft))
    opt = torch.optim.Adam(drafter.parameters(), lr=3e-2)
    for _ in range(steps):
        loss = 0.0
        for ids, aux, draft in rows:
            logits, _ = drafter(ids, drafter.fuse(aux), torch.arange(ids.shape[1])[None])
            loss = loss + torch.nn.functional.cross_entropy(logits[0], draft, ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        hits = [(drafter(ids, drafter.fuse(aux), torch.arange(ids.shape[1])[None])[0][0].argmax(-1) == draft)[
            draft >= 0] for ids, aux, draft in rows]
    return float(torch.cat(hits).float().mean())


@pytest.fixture(scope="session")
def compat_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compat")
    (root / "question.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return root


@pytest.fixture(scope="session")
def target_dir(compat_root) -> Path:
    build_target(compat_root / "Qwen3-30B-A3B-Instruct-2507")
    return compat_root / "Qwen3-30B-A3B-Instruct-2507"


@pytest.fixture(scope="session")
def prompt_files(target_dir, compat_root) -> dict[str, Path]:
    """The extract stage on the fake's tokenizer: the workload's prompts and the calibration prompt."""
    from specfit.stages import extract

    files = {"prompts": compat_root / "prompts.parquet", "calibration": compat_root / "calibration.parquet"}
    for name, ids in (("prompts", [1, 2]), ("calibration", [3])):
        extract.run({"model": MODEL, "question_ids": ids, "limit_tokens": LIMIT, "max_requests": None},
                    {"questions": compat_root / "question.jsonl", "tokenizer": target_dir}, {"prompts": files[name]})
    return files


def stream_spec(name: str, **method) -> dict:
    """A decode stage's spec as the workflow builds it (`specfit.planning.specs.decode`) for models.qwen3-30b-a3b on the
    A100 of config.qwen3-30b-a3b.yaml, with the test device, the fakes' limits, 4 slots and ``method`` as the method's
    entry; and a 3-token warm-up (a test's knob: the rule leaves the stage's default)."""
    config = load_config(ROOT / "config.yaml", ROOT / SCHEMA, ROOT / "config.qwen3-30b-a3b.yaml")
    config["devices"]["a100"]["torch_device"] = DEVICE
    config["workloads"]["gsm8k"].update(limit_tokens=LIMIT, max_new_tokens=NEW)
    config["methods"]["under-test"] = {"kind": name, **method}
    return {**specs.decode(config, MODEL, "a100", "gsm8k", "under-test", 4), "warmup_tokens": 3}


def run_files(path: Path, name: str, atlas: bool = False) -> dict[str, Path]:
    """A decode (or atlas) stage's outputs."""
    files = {"requests": path / f"{name}.requests.parquet", "cycles": path / f"{name}.cycles.parquet",
             "metrics": path / f"{name}.metrics.json"}
    if atlas:
        files["atlas"] = path / f"{name}.atlas.parquet"
    return files


@pytest.fixture(scope="session")
def ar_run(target_dir, prompt_files, compat_root) -> dict[str, Path]:
    """The decode stage's AR run on the fake target: the reference of every lossless check."""
    from specfit.stages import decode

    files = run_files(compat_root, "ar")
    decode.run(stream_spec("ar"), {"prompts": prompt_files["prompts"], "target": target_dir}, files)
    return files


@pytest.fixture(scope="session")
def drafter_dir(target_dir, prompt_files, ar_run, compat_root) -> Path:
    """The fake RedHatAI drafter, taught the fake target's AR outputs at its first draft step, so that drafts
    are accepted and the stages commit tree nodes (a random drafter's never are)."""
    import pyarrow.parquet as pq

    from specfit.models import load_target
    from specfit.results.records import read_prompts

    target, _ = load_target(target_dir, "bfloat16")  # the target exactly as the stages load it
    outputs = {r["request_id"]: r["output_ids"] for r in pq.read_table(ar_run["requests"]).to_pylist()}
    sequences = [p["prompt_ids"] + outputs[p["request_id"]] for p in read_prompts(prompt_files["prompts"])]
    drafter = new_drafter(keep=[t for o in outputs.values() for t in o])
    assert fit_drafter(drafter, target, sequences) > 0.8
    path = compat_root / "Qwen3-30B-A3B-Instruct-2507-speculator.eagle3"
    drafter.to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.fixture
def copy_of(tmp_path):
    """A writable copy of a checkpoint folder, to break one thing in it."""
    import shutil

    def copy(path: Path, name: str | None = None) -> Path:
        out = tmp_path / (name or path.name)
        shutil.copytree(path, out)
        return out

    return copy
