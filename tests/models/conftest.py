import pytest
import torch
from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig, Qwen3MoeForCausalLM

from specfit.models.eagle3 import Eagle3Drafter
from specfit.models.speculators import eagle3_config


def tiny_moe_config(**overrides) -> Qwen3MoeConfig:
    kw = dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
        max_position_embeddings=256,
    )
    return Qwen3MoeConfig(**(kw | overrides))


@pytest.fixture(scope="session")
def moe_target():
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(tiny_moe_config()).eval()


@pytest.fixture(scope="session")
def moe_target_dir(moe_target, tmp_path_factory):
    path = tmp_path_factory.mktemp("target")
    moe_target.save_pretrained(path)
    return path


@pytest.fixture
def make_drafter():
    return random_drafter


def random_drafter(target, draft_vocab_size=48, hidden_size=None, model_type="llama", seed=1, layers=1,
                   **options) -> Eagle3Drafter:
    """A drafter with random weights (std 0.2, so logits are far from uniform; norm gains around 1) and a
    scattered draft vocab; ``options``: speculators flags (`specfit.models.speculators.OPTIONS`)."""
    torch.manual_seed(seed)
    tc = target.config
    layer = dict(
        hidden_size=hidden_size or tc.hidden_size, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_hidden_layers=layers, vocab_size=tc.vocab_size,
    )
    layer_config = {"llama": LlamaConfig, "qwen3": Qwen3Config}[model_type](**layer)
    drafter = Eagle3Drafter(eagle3_config(layer_config, draft_vocab_size, (2, 3, 3), **options)).eval()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight") or name.startswith("fc_norm."):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.2)
        kept = torch.randperm(tc.vocab_size)[:draft_vocab_size].sort().values  # [Vd] target ids
        drafter.d2t.copy_(kept - torch.arange(draft_vocab_size))
        drafter.t2d.zero_()[kept] = True
    return drafter
