"""Checkpoints the real users may hold, accepted or refused by name before any weight is read.

The drafter is checked against the target from both config.json files and the safetensors
headers before the target loads, and errors name the real config key (models.qwen3-30b-a3b.*). Item 6: the
speculators options norm_output, norm_before_fc, fc_norm and several decoder layers run; what SpecFit does not
implement (or a checkpoint in another format) is refused with the option's / format's name.
"""

from __future__ import annotations

import json

import pytest
import torch
from compat_fakes import MODEL, TARGET_CONFIG, build_drafter, run_files, stream_spec
from safetensors.torch import load_file, save_file

from specfit.errors import SpecFitError
from specfit.models import check_checkpoints, load_drafter, load_target
from specfit.stages import calibrate, decode

DRAFTER_KEY = rf"models\.{MODEL}\.drafter"
TARGET_KEY = rf"models\.{MODEL}\.target"


@pytest.fixture
def no_weights(monkeypatch):
    """Any attempt of a stage to load the target fails the test: its checks must come first."""
    def load_target_(*args, **kwargs):
        raise AssertionError("the target's weights were read before the checkpoints were checked")

    from specfit.speculative import loading

    monkeypatch.setattr(loading, "load_target", load_target_)
    monkeypatch.setattr(calibrate, "load_target", load_target_)


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def decode_eagle3(target, drafter, prompt_files, tmp_path):
    inputs = {"prompts": prompt_files["prompts"], "target": target, "drafter": drafter}
    decode.run(stream_spec("eagle3"), inputs, run_files(tmp_path, "eagle3"))


# ------------------------------------------------------------------ item 5: checked first, named by key
def _hidden(path):
    build_drafter(path, dict(TARGET_CONFIG, hidden_size=48))


def _vocab(path):
    build_drafter(path, dict(TARGET_CONFIG, vocab_size=300))


def _taps(path):
    build_drafter(path)
    edit_config(path, eagle_aux_hidden_state_layer_ids=[1, 2, 4])


def _algorithm(path):
    build_drafter(path)
    edit_config(path, speculators_model_type="eagle")


def _no_weights(path):
    build_drafter(path)
    (path / "model.safetensors").unlink()


def _missing_tensor(path):
    build_drafter(path)
    state = load_file(path / "model.safetensors")
    del state["fc.weight"]
    save_file(state, path / "model.safetensors")


@pytest.mark.parametrize(("make", "message"), [
    (_hidden, "reads target features of hidden size 48, but the target's hidden size is 32"),
    (_vocab, "has a target vocabulary of 300 tokens, but the target's vocabulary has 320"),
    (_taps, r"taps target layers \[1, 2, 4\], but the target has 4"),
    (_algorithm, "is a speculators 'eagle' checkpoint; SpecFit drafts with EAGLE-3 only"),
    (_no_weights, r"no \*\.safetensors weights in the EAGLE-3 drafter folder"),
    (_missing_tensor, r"missing \['fc\.weight'\]"),
])
def test_a_drafter_that_does_not_fit_stops_the_decode_before_the_target_loads(
        make, message, target_dir, prompt_files, tmp_path, no_weights):
    make(tmp_path / "drafter")
    with pytest.raises(SpecFitError, match=message) as err:
        decode_eagle3(target_dir, tmp_path / "drafter", prompt_files, tmp_path)
    assert f"models.{MODEL}.drafter" in str(err.value)


def test_calibration_checks_the_drafter_before_the_target_loads(target_dir, prompt_files, tmp_path, no_weights):
    _hidden(tmp_path / "drafter")
    spec = {"model": MODEL, "logits_dtype": "model", "verify": "exact",
    "dtype": "bfloat16", "torch_device": "cpu", "max_inflight": 2,
            "link": None, "emulate": None, "slots": 4, "coefficients": "fit", "seed": 0,
            "protocol": {"cycle_boundaries": [0], "sizes": 3, "repeats": 1, "limit_tokens": 96}}
    inputs = {"prompts": prompt_files["calibration"], "target": target_dir, "drafter": tmp_path / "drafter"}
    with pytest.raises(SpecFitError, match=f"{DRAFTER_KEY}.*hidden size 48"):
        calibrate.run(spec, inputs, {"coefficients": tmp_path / "c.json", "points": tmp_path / "p.parquet"})


def test_a_missing_target_names_its_key(drafter_dir, prompt_files, tmp_path, no_weights):
    with pytest.raises(SpecFitError, match=f"no target model at .*{TARGET_KEY}"):
        decode_eagle3(tmp_path / "nowhere", drafter_dir, prompt_files, tmp_path)


def test_a_missing_shard_names_the_file(target_dir, drafter_dir, copy_of, prompt_files, tmp_path, no_weights):
    target = copy_of(target_dir)
    (target / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(SpecFitError, match=f"1 are missing \\(model-00002-of-00003.safetensors\\).*{TARGET_KEY}"):
        decode_eagle3(target, drafter_dir, prompt_files, tmp_path)


def test_a_target_without_tokenizer_files_is_refused(target_dir, drafter_dir, copy_of, prompt_files, tmp_path,
                                                      no_weights):
    target = copy_of(target_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (target / name).unlink()
    with pytest.raises(SpecFitError, match=f"no tokenizer files in .*tokenizer.json.*{TARGET_KEY}"):
        decode_eagle3(target, drafter_dir, prompt_files, tmp_path)


def test_a_target_whose_weights_miss_tensors_is_refused(target_dir, copy_of):
    """transformers would initialize a missing tensor at random and only warn."""
    target = copy_of(target_dir)
    index = json.loads((target / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.layers.1.mlp.gate.weight"]
    state = load_file(target / shard)
    del state["model.layers.1.mlp.gate.weight"]
    save_file(state, target / shard, metadata={"format": "pt"})
    del index["weight_map"]["model.layers.1.mlp.gate.weight"]
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SpecFitError, match=rf"{TARGET_KEY}.*missing \['model\.layers\.1\.mlp\.gate\.weight'\]"):
        load_target(target, "bfloat16", key=f"models.{MODEL}.target")


def test_a_target_whose_config_leaves_tensors_unused_is_refused_naming_them(target_dir, copy_of):
    """A config of 2 layers over the checkpoint's 4 would load a truncated model, with a warning only."""
    target = copy_of(target_dir)
    edit_config(target, num_hidden_layers=2)
    with pytest.raises(SpecFitError, match=rf"{TARGET_KEY}.* tensors its config.json does not use "
                                           r"\(model\.layers\.2\..*truncated"):
        load_target(target, "bfloat16", key=f"models.{MODEL}.target")


# ------------------------------------------------------------------ item 6: speculators options
@pytest.mark.parametrize("variant", [
    dict(norm_output=True, norm_before_fc=True, layers=2),
    dict(fc_norm=True, model_type="qwen3"),
])
def test_speculators_options_run_through_the_decode_stage(variant, target_dir, prompt_files, ar_run, tmp_path):
    build_drafter(tmp_path / "drafter", **variant)
    eagle = run_files(tmp_path, "eagle3")
    inputs = {"prompts": prompt_files["prompts"], "target": target_dir, "drafter": tmp_path / "drafter",
              "reference": ar_run["requests"]}
    decode.run(stream_spec("eagle3"), inputs, eagle)
    lossless = json.loads(eagle["metrics"].read_text())["lossless"]
    assert lossless["n_identical"] == 2 and lossless["divergences"] == []  # bf16, exact verify: AR's bits


def test_the_options_change_what_the_drafter_computes(target_dir, tmp_path):
    """norm_output, norm_before_fc, fc_norm and the second layer are read, not ignored: each changes the drafts."""
    target, _ = load_target(target_dir, "bfloat16")
    ids = torch.tensor([[5, 9, 11, 40, 2]])
    with torch.no_grad():
        aux = torch.cat([target(ids, output_hidden_states=True).hidden_states[i] for i in (1, 2, 3)], -1)
    outputs = {}
    for name, options in {"plain": {}, "norm_output": {"norm_output": True}, "norm_before_fc": {"norm_before_fc": True},
                          "fc_norm": {"fc_norm": True}, "layers": {"layers": 2}}.items():
        build_drafter(tmp_path / name, **options)  # the same seed: the same weights where both have them
        drafter = load_drafter(tmp_path / name, target)
        if name in ("norm_before_fc", "fc_norm"):  # non-trivial norm gains, so that the norm is not a no-op scale
            with torch.no_grad():
                for p in (drafter.input_norm or drafter.fc_norm).parameters():
                    p.uniform_(0.5, 1.5)
        with torch.no_grad():
            outputs[name] = drafter(ids[:, 1:], drafter.fuse(aux[:, :-1]), torch.arange(4)[None])
    plain_logits, plain_hidden = outputs["plain"]
    logits, hidden = outputs["norm_output"]
    assert torch.equal(logits, plain_logits) and not torch.equal(hidden, plain_hidden)  # only the fed-back state
    for name in ("norm_before_fc", "fc_norm", "layers"):
        assert not torch.equal(outputs[name][0], plain_logits), name


@pytest.mark.parametrize(("change", "message"), [
    (dict(norm_before_fc=True, fc_norm=True), "sets both norm_before_fc and fc_norm"),
    (dict(norm_before_lm_head=True), "sets norm_before_lm_head: true, an option SpecFit's EAGLE-3 drafter does not"),
    (dict(speculators_model_type="dflash"), "is a speculators 'dflash' checkpoint"),
    # booleans only: "false" would read as true, 1 would go unnoticed as an unknown option
    (dict(norm_output="false"), 'sets norm_output: "false"; a drafter option is a JSON boolean'),
    (dict(norm_before_lm_head=1), "sets norm_before_lm_head: 1; a drafter option is a JSON boolean"),
])
def test_options_specfit_does_not_implement_are_refused_by_name(change, message, target_dir, drafter_dir, copy_of):
    drafter = copy_of(drafter_dir)
    edit_config(drafter, **change)
    with pytest.raises(SpecFitError, match=message) as err:
        check_checkpoints(target_dir, drafter, MODEL)
    assert f"models.{MODEL}.drafter" in str(err.value)


def test_a_sliding_window_drafter_layer_is_refused(target_dir, drafter_dir, copy_of):
    drafter = copy_of(drafter_dir)
    config = json.loads((drafter / "config.json").read_text())
    config["transformer_layer_config"]["layer_types"] = ["sliding_attention"]
    (drafter / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecFitError, match=f"{DRAFTER_KEY}.*sliding-window attention"):
        check_checkpoints(target_dir, drafter, MODEL)


def test_tensors_of_an_option_the_config_does_not_set_are_named(target_dir, tmp_path):
    build_drafter(tmp_path / "drafter", norm_before_fc=True)
    edit_config(tmp_path / "drafter", norm_before_fc=False)
    with pytest.raises(SpecFitError, match=r"unexpected \['input_norm.weight'\].*norm_before_fc: true"):
        check_checkpoints(target_dir, tmp_path / "drafter", MODEL)


def test_extra_decoder_layers_the_config_does_not_declare_are_named(target_dir, tmp_path):
    build_drafter(tmp_path / "drafter", layers=2)
    config = json.loads((tmp_path / "drafter" / "config.json").read_text())
    config["transformer_layer_config"]["num_hidden_layers"] = 1
    (tmp_path / "drafter" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecFitError, match="more decoder layers than transformer_layer_config.num_hidden_layers = 1"):
        check_checkpoints(target_dir, tmp_path / "drafter", MODEL)


def test_a_specforge_checkpoint_is_told_to_convert(target_dir, tmp_path, prompt_files, no_weights):
    """SpecForge / EAGLE save a plain LlamaForCausalLMEagle3 config.json with midlayer.* weights."""
    path = tmp_path / "specforge"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 32,
        "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "vocab_size": 320, "draft_vocab_size": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "max_position_embeddings": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }))
    save_file({"midlayer.hidden_norm.weight": torch.ones(32), "fc.weight": torch.zeros(32, 96),
               "d2t": torch.zeros(64, dtype=torch.long), "t2d": torch.zeros(320, dtype=torch.bool)},
              path / "model.safetensors")
    with pytest.raises(SpecFitError) as err:
        decode_eagle3(target_dir, path, prompt_files, tmp_path)
    text = str(err.value)
    assert "SpecForge / EAGLE training format" in text and "LlamaForCausalLMEagle3" in text
    assert "speculators convert" in text and f"models.{MODEL}.drafter" in text
    assert "hidden size None" not in text
