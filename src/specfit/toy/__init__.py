"""The embedded toy: a small Qwen3-MoE target and its EAGLE-3 drafter, trained on CPU from Spec-Bench text by
three rules (`specfit.stages.toy_tokenizer`, `toy_target`, `toy_drafter`) from this package's byte-level BPE and chat
template (`tokenizer`), MoE LM (`target`), drafter on the target's features (`drafter`) and step-budgeted training
loop (`train`). They train only on questions no workload evaluates (the spec's ``exclude_question_ids``,
`specfit.questions.training_questions`) and save in the formats of real checkpoints, so the workflow loads the toy as
it loads Qwen3-30B-A3B and its speculators drafter. A stage's spec is the config's ``toy.<part>`` with the schema's
defaults, ``seed`` and ``exclude_question_ids``; `specfit.toy.spec.toy_spec` builds the same outside the workflow, and
`specfit.toy.ship` ships a trained toy. This package imports nothing: the stages' code hash
(`specfit.planning.code.code_hash`) covers it, and an import here would retrain the toy whenever that module changed."""
