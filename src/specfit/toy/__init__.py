"""The embedded toy: a small Qwen3-MoE target and its EAGLE-3 drafter, trained on CPU from Spec-Bench text.

Three stages, each a workflow rule: ``tokenizer`` (byte-level BPE + chat template), ``target`` (the MoE LM),
``drafter`` (EAGLE-3 on the target's features). They train only on questions no workload evaluates
(``specfit.questions.training_questions``) and save in the formats of real checkpoints, so the rest of the
workflow loads the toy exactly as it loads Qwen3-30B-A3B and its speculators drafter.
"""
