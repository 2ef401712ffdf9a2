"""The embedded toy: a small Qwen3-MoE target and its EAGLE-3 drafter, trained on CPU from Spec-Bench text.

Three stages, each a workflow rule: ``tokenizer`` (byte-level BPE + chat template), ``target`` (the MoE LM),
``drafter`` (EAGLE-3 on the target's features). They train only on questions no workload evaluates (the spec's
``exclude_question_ids``, see ``specfit.questions.training_questions``) and save in the formats of real
checkpoints, so the rest of the workflow loads the toy exactly as it loads Qwen3-30B-A3B and its speculators
drafter.

A stage's spec is the config's ``toy.<part>`` as validated against workflow/schemas/config.schema.yaml (which holds
every default, and nothing else does), with ``seed`` and ``exclude_question_ids``. Outside the workflow (tests,
benchmarks) ``specfit.toy.spec.toy_spec`` builds the same spec.

This package imports nothing: the stages' code hash (``specfit.planning.code.code_hash``) covers it, and an import here
would retrain the toy whenever that module changed.
"""
