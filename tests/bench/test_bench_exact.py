"""`python -m specfit.bench exact`: it times an AR step and both verifies, and prints one row per target."""

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from specfit.bench import exact as bench


def tiny(layers: int) -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
                            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            num_experts=4, num_experts_per_tok=2, attn_implementation="sdpa")
    return Qwen3MoeForCausalLM._from_config(config).eval()


def test_times_are_measured_for_each_forward():
    times = bench.time_verifies(tiny(2), prefix=6, repeats=2)
    assert set(times) == {"ar_step", "exact", "modules", "batched"} and all(t > 0 for t in times.values())


def test_benchmark_prints_a_row_per_target(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "TOY", tmp_path / "no-toy")
    monkeypatch.setattr(bench, "qwen3_shaped", tiny)
    bench.main(["--repeats", "1", "--prefix", "4", "--layers", "1"])
    out = capsys.readouterr().out
    assert "no shipped toy" in out and "CPU wall time" in out
    row = next(line for line in out.splitlines() if line.startswith("Qwen3-30B-A3B shapes"))
    assert row.rstrip().endswith("x") and len(row.split()) == 13  # the name (7 words), four times, two ratios
