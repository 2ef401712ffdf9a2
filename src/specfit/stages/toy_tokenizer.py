"""Stage toy_tokenizer: the toy's byte-level BPE tokenizer with a chat template of its own.

spec (config ``toy.tokenizer``, defaults in the schema; the rule adds seed and exclude_question_ids)::

    vocab_size: 4096            (BPE vocabulary, with the 4 special tokens)
    heldout: 12                 seed: 0     (as in the target and drafter stages: the same held-out questions)
    exclude_question_ids        (the evaluated ids, never trained on; required)

inputs: {questions: Spec-Bench question.jsonl}
outputs: {tokenizer: folder, a PreTrainedTokenizerFast saved with save_pretrained}
"""

from __future__ import annotations

import logging

from specfit.io import atomic_path
from specfit.planning.stage import stage_main
from specfit.toy.tokenizer import train_tokenizer
from specfit.toy.train import split

log = logging.getLogger("specfit.stages.toy_tokenizer")


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    train, _ = split(inputs["questions"], spec)
    tokenizer = train_tokenizer([t for q in train for t in q["turns"]], spec["vocab_size"])
    log.info("BPE tokenizer: %d tokens from %d questions", len(tokenizer), len(train))
    with atomic_path(outputs["tokenizer"], directory=True) as tmp:
        tokenizer.save_pretrained(tmp)


main = stage_main(run, trains=True)

if __name__ == "__main__":
    main()
