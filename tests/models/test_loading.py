import json

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specfit.errors import SpecFitError
from specfit.models import Eagle3Drafter, load_drafter, load_target


def _save_tokenizer(path, vocab_size):
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    tok.save_pretrained(path)


@pytest.fixture(scope="module")
def target_dir(moe_target, tmp_path_factory):
    path = tmp_path_factory.mktemp("moe")
    moe_target.save_pretrained(path)
    _save_tokenizer(path, moe_target.config.vocab_size)
    return path


def test_load_target_and_drafter(moe_target, target_dir, tmp_path, make_drafter):
    target, tokenizer = load_target(target_dir, dtype="float32")
    assert tokenizer.vocab_size == target.config.vocab_size
    ids = torch.arange(12)[None]
    with torch.no_grad():
        assert torch.equal(target(ids).logits, moe_target(ids).logits)
    make_drafter(target).save_pretrained(tmp_path)
    drafter = load_drafter(tmp_path, target)
    assert isinstance(drafter, Eagle3Drafter) and drafter.fc.weight.dtype == torch.float32


def test_missing_paths_name_the_config_key(tmp_path, moe_target):
    with pytest.raises(SpecFitError, match=r"models\.<model>\.target"):
        load_target(tmp_path / "nowhere")
    with pytest.raises(SpecFitError, match=r"models\.<model>\.drafter"):
        load_drafter(tmp_path / "nowhere", moe_target)


def test_dense_target_is_refused(tmp_path):
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(SpecFitError, match="not a mixture-of-experts"):
        load_target(tmp_path)


def test_bad_dtype_is_refused(target_dir):
    with pytest.raises(SpecFitError, match="dtype"):
        load_target(target_dir, dtype="fp8")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(hidden_size=24), "hidden size 24.*hidden size is 32"),
        (dict(vocab_size=100), "vocabulary of 100 tokens.*has 96"),
    ],
)
def test_drafter_that_does_not_fit_is_refused(moe_target, tmp_path, make_drafter, change, message):
    drafter = make_drafter(moe_target, hidden_size=change.get("hidden_size"))
    drafter.save_pretrained(tmp_path)
    if "vocab_size" in change:
        config = json.loads((tmp_path / "config.json").read_text())
        config["transformer_layer_config"]["vocab_size"] = change["vocab_size"]
        (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecFitError, match=message):
        load_drafter(tmp_path, moe_target)
