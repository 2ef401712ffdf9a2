import torch
from transformers import DynamicCache, LlamaConfig

from specfit.models.eagle3 import Eagle3Drafter, eagle3_config
from specfit.toy.drafter import ttt_forward


def test_ttt_forward_equals_chain_drafting():
    """Every chain of the batched training-time test equals drafting that chain step by step with a cache."""
    torch.manual_seed(0)
    layer = LlamaConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, num_hidden_layers=1, vocab_size=64)
    drafter = Eagle3Drafter(eagle3_config(layer, 64, (0, 1, 2))).eval()
    with torch.no_grad():
        for p in drafter.parameters():
            p.normal_(0, 0.3)
    T, steps = 8, 3
    ids = torch.randint(0, 64, (1, T))  # [1, T]
    fused = torch.randn(1, T, 32)  # [1, T, H]
    with torch.no_grad():
        batched = [logits.argmax(-1)[0] for logits in ttt_forward(drafter, ids, fused, steps)]
        for t in range(T - 1):
            cache = DynamicCache()
            pos = torch.arange(t + 1)[None]
            logits, h = drafter(ids[:, 1 : t + 2], fused[:, : t + 1], pos, cache)
            x, h, p = logits[:, -1:].argmax(-1), h[:, -1:], pos[:, -1:]
            for k in range(steps):
                assert x.item() == batched[k][t]
                p = p + 1
                logits, h = drafter(drafter.to_target_ids(x), h, p, cache)
                x = logits.argmax(-1)
