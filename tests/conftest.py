"""Shared fixtures: the repository root, Spec-Bench's question.jsonl where the config expects it, and a tiny random
target / EAGLE-3 drafter pair (with an oracle drafter and the pair saved as a decode stage's inputs)."""

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

from specfit.models.eagle3 import Eagle3Drafter
from specfit.models.speculators import eagle3_config
from specfit.planning import paths
from specfit.results.records import PROMPTS_SCHEMA
from specfit.speculative.request import Limits

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def questions_path() -> Path:
    """The configured question.jsonl; missing, it is fetched from the pinned commit as the workflow would."""
    from specfit.errors import SpecFitError
    from specfit.planning.config import validate_config
    from specfit.stages.spec_bench import run as fetch

    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()),
                             ROOT / "workflow/schemas/config.schema.yaml", ROOT)
    source = config["spec_bench"]
    path = ROOT / source["path"]
    if not path.is_file():
        try:
            fetch({"url": source["url"], "sha256": source["sha256"]}, {}, {"questions": path})
        except SpecFitError as err:
            pytest.fail(str(err))
    return path



@pytest.fixture(scope="session")
def workflow_copy(root, questions_path):
    """Make a runnable copy of the workflow in a folder: its rules, profiles and config with tests/smoke.yaml beside
    as smoke.yaml, the shipped toy (config.yaml defines it), and the configured question.jsonl in place (a copy: a
    cluster job may not see this checkout)."""
    def copy(workdir: Path) -> Path:
        for name in ("workflow", "rules", "envs", paths.toy_dir(paths.SHIPPED_TOY)):
            shutil.copytree(root / name, workdir / name)
        shutil.copy(root / "config.yaml", workdir / "config.yaml")
        shutil.copy(root / "tests" / "smoke.yaml", workdir / "smoke.yaml")
        raw = workdir / "data/raw/spec_bench"
        raw.mkdir(parents=True)
        shutil.copy(questions_path, raw / "question.jsonl")
        return workdir

    return copy

# ------------------------------------------------------------------ a tiny random target and drafter
VOCAB = 256
B = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]  # made-up SpecFit intercepts for the stage tests


@pytest.fixture(scope="session")
def target():
    """A tiny random Qwen3-MoE target: fp32, sdpa, 2 layers of 8 experts, top-2."""
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        max_position_embeddings=512, attn_implementation="sdpa",
    )
    return Qwen3MoeForCausalLM(config).eval()


@pytest.fixture(scope="session")
def drafter(target):
    """A tiny random EAGLE-3 drafter over a scattered draft vocabulary of 128 target ids."""
    torch.manual_seed(1)
    layer = LlamaConfig(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=1, vocab_size=VOCAB,
    )
    drafter = Eagle3Drafter(eagle3_config(layer, 128, (0, 1, 1))).eval()
    with torch.no_grad():
        for p in drafter.parameters():
            p.normal_(0, 0.2)
        kept = torch.randperm(VOCAB)[:128].sort().values  # [Vd] target ids
        drafter.d2t.copy_(kept - torch.arange(128))
        drafter.t2d.zero_()[kept] = True
    return drafter


@pytest.fixture(scope="session")
def prompts():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 9, 13)]


@pytest.fixture(scope="session")
def limits():
    return Limits(limit_tokens=40, max_new_tokens=24, eos_ids=frozenset({VOCAB - 1}))


class OracleDrafter(torch.nn.Module):
    """A "cheating" drafter that knows the target's greedy continuation ``sequence`` (prompt + AR output).

    Row ``t`` predicts ``sequence[t + 2]`` first (p ~ 0.88) and a wrong token second, whatever its inputs,
    so the pool's main path is what the target will accept. Duck-types `Eagle3Drafter`; keeps no KV state.
    """

    aux_layer_ids = (0, 1, 1)
    draft_vocab_size = VOCAB

    def __init__(self):
        super().__init__()
        self.sequence: list[int] = []

    def fuse(self, aux):
        return aux[..., : aux.shape[-1] // 3]  # [B, T, H]

    def forward(self, input_ids, hidden, position_ids, past_key_values=None, attention_mask=None):
        logits = torch.zeros(*input_ids.shape, VOCAB)  # [B, T, V]
        for i, t in enumerate(position_ids[0].tolist()):
            right = self.sequence[t + 2] if t + 2 < len(self.sequence) else 0
            logits[0, i, right] = 20.0
            logits[0, i, (right + 1) % VOCAB] = 18.0
        return logits, hidden

    def to_target_ids(self, draft_ids):
        return draft_ids


@pytest.fixture
def oracle():
    return OracleDrafter()


@pytest.fixture(scope="session")
def files(target, drafter, prompts, tmp_path_factory):
    """The tiny pair saved as checkpoints, two prompts and made-up coefficients: a decode stage's inputs."""
    root = tmp_path_factory.mktemp("decode")
    target.save_pretrained(root / "target")
    vocab = {f"t{i}": i for i in range(target.config.vocab_size)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0"))).save_pretrained(
        root / "target"
    )
    drafter.save_pretrained(root / "drafter")
    pq.write_table(pa.Table.from_pylist([
        {"request_id": i, "question_id": 10 + i, "category": "test", "prompt": "", "prompt_ids": p, "n_prompt": len(p)}
        for i, p in enumerate(prompts[:2])
    ], schema=PROMPTS_SCHEMA), root / "prompts.parquet")
    (root / "coefficients.json").write_text(json.dumps({"b": B, "beta": 0.05}))
    return {
        "prompts": root / "prompts.parquet", "target": root / "target", "drafter": root / "drafter",
        "coefficients": root / "coefficients.json",
    }
