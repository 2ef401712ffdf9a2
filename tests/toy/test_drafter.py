import torch
from transformers import DynamicCache, LlamaConfig

from specfit.models.eagle3 import Eagle3Drafter
from specfit.models.speculators import eagle3_config
from specfit.toy.drafter import Drafted, calibrate_confidence, chat_questions, draft_vocabulary, ttt_forward
from specfit.toy.train import span_conversations


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


def test_calibrate_confidence_recovers_the_temperature_of_acceptance():
    """Tokens drawn from softmax(z / 0.4) where the drafter says softmax(z): the fitted temperature is ~0.4, folded
    into lm_head (logits divided by it exactly: a positive scale, so no token's rank moves)."""
    torch.manual_seed(0)
    layer = LlamaConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, num_hidden_layers=1, vocab_size=64)
    drafter = Eagle3Drafter(eagle3_config(layer, 64, (0, 1, 2))).eval()  # draft ids = target ids (d2t = 0)
    logits = 2.0 * torch.randn(4000, 64)  # [N, Vd]
    tokens = torch.multinomial(torch.softmax(logits / 0.4, dim=-1), 1)[:, 0]  # [N] what "greedy" accepts
    drafted = [Drafted(row, int(tok)) for row, tok in zip(logits, tokens)]
    weight = drafter.lm_head.weight.detach().clone()  # [Vd, H]
    stats = calibrate_confidence(drafter, drafted)
    assert abs(stats["temperature"] - 0.4) < 0.04
    assert torch.allclose(drafter.lm_head.weight, weight / stats["temperature"])
    assert abs(stats["top1_prob_after"] - stats["top1_hit_rate"]) < 0.03  # calibrated where it was not
    assert stats["top1_prob_before"] < stats["top1_hit_rate"] - 0.1


def test_the_draft_vocabulary_is_what_the_target_generates_most():
    """Counted on the target's continuations; ties and unseen ids by the training text's counts, then by id."""
    replies = [torch.tensor([5, 5, 5, 7, 7, 9]), torch.tensor([9, 2])]  # 5: 3, 7: 2, 9: 2, 2: 1
    text = torch.tensor([9, 9, 9, 1, 1, 3, 3, 0])  # 9 before 7 at their tie; 1 and 3 before the unseen rest
    assert draft_vocabulary(replies, text, vocab_size=12, size=4).tolist() == [2, 5, 7, 9]
    assert draft_vocabulary(replies, text, vocab_size=12, size=3).tolist() == [5, 7, 9]
    assert draft_vocabulary(replies, text, vocab_size=12, size=6).tolist() == [1, 2, 3, 5, 7, 9]
    assert draft_vocabulary(replies, text, vocab_size=12, size=8).tolist() == [0, 1, 2, 3, 4, 5, 7, 9]


def test_the_drafters_data_is_chat():
    """Only the categories it names, and spans over their text without the summarization prompt's prefix."""
    questions = [{"question_id": 1, "category": "qa", "turns": ["Who wrote it? A man did. He wrote it well."]},
                 {"question_id": 2, "category": "summarization", "turns": ["Summarize: An article. It says things."]},
                 {"question_id": 3, "category": "rag", "turns": ["Passages. More passages. A question?"]}]
    chat = chat_questions(questions, ["qa", "rag"])
    assert [q["question_id"] for q in chat] == [1, 3]
    prompts = [c[0]["content"] for c in span_conversations(chat, 50, 0, 20, summarize_share=0.0)]
    assert not any(p.startswith("Summarize: ") for p in prompts) and not any("article" in p for p in prompts)
    assert any(c[0]["content"].startswith("Summarize: ") for c in span_conversations(chat, 50, 0, 20))  # the target's
