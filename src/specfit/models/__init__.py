"""The models SpecFit runs: a Hugging Face MoE target and its EAGLE-3 drafter in the speculators format
(`eagle3`), loaded from local folders and checked before a weight is read (`loading`, `checkpoint`; the shipped toy
against its manifest, `shipped`), with a bf16 target's logits in float32 (`precision`)."""

from specfit.models.eagle3 import Eagle3Drafter, aux_hidden_states
from specfit.models.loading import check_checkpoints, eos_ids, load_drafter, load_target

__all__ = ["Eagle3Drafter", "aux_hidden_states", "check_checkpoints", "eos_ids", "load_drafter", "load_target"]
