"""The toy's byte-level BPE tokenizer with a chat template of its own (trained by the toy_tokenizer stage)."""

from __future__ import annotations

import logging

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)
USER, ASSISTANT, END, PAD = "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}" + USER + "{{ m['content'] }}" + END
    + "{% elif m['role'] == 'assistant' %}" + ASSISTANT + "{{ m['content'] }}" + END
    + "{% else %}{{ raise_exception('the toy chat template has no ' + m['role'] + ' role') }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, USER, ASSISTANT, END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=END, pad_token=PAD, chat_template=CHAT_TEMPLATE, padding_side="left"
    )
