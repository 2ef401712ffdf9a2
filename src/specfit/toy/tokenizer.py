"""Stage: the toy's byte-level BPE tokenizer with a chat template of its own.

spec (config ``toy.tokenizer``, defaults in the schema; the rule adds seed and exclude_question_ids)::

    vocab_size: 4096            (BPE vocabulary, with the 4 special tokens)
    heldout: 12                 seed: 0     (as in the target and drafter stages: the same held-out questions)
    exclude_question_ids        (the evaluated ids, never trained on; required)

inputs: {questions: Spec-Bench question.jsonl}
outputs: {tokenizer: folder, a PreTrainedTokenizerFast saved with save_pretrained}
"""

from __future__ import annotations

import logging

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from specfit.io import atomic_path
from specfit.stage import stage_main
from specfit.toy.train import split

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


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    train, _ = split(inputs["questions"], spec)
    tokenizer = train_tokenizer([t for q in train for t in q["turns"]], spec["vocab_size"])
    log.info("BPE tokenizer: %d tokens from %d questions", len(tokenizer), len(train))
    with atomic_path(outputs["tokenizer"], directory=True) as tmp:
        tokenizer.save_pretrained(tmp)


main = stage_main(run, trains=True)

if __name__ == "__main__":
    main()
