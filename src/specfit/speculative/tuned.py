"""EAGLE-3 at the tree a user tunes by hand (kind eagle3-tuned): the tune rule's choice, one tree, or one per
cross-fitted fold (`specfit.speculative.tuning`)."""

from __future__ import annotations

import dataclasses

from specfit.errors import SpecFitError
from specfit.speculative.config import MethodConfig
from specfit.speculative.methods import Eagle3
from specfit.speculative.tuning import trees_by_question


class Eagle3Tuned(Eagle3):
    """EAGLE-3 at the fixed tree the tune rule found best on the workload's tuning questions (its ``tune`` input,
    `specfit.speculative.tuning`): what a user tunes by hand today. Cross-fitted, its ``tune`` inputs are one per
    fold, and each question is decoded with the tree of its fold, tuned on the other folds' questions."""

    def __init__(self, config: MethodConfig, trees: dict[int | None, dict]):
        self.trees = trees  # question id -> tree (`trees_by_question`)
        super().__init__(dataclasses.replace(config, **trees.get(None) or next(iter(trees.values()))))

    @classmethod
    def from_inputs(cls, config, inputs, seed, num_experts):
        if "tune" not in inputs:
            raise SpecFitError(f"method kind {config.name} decodes with a tuned tree: give the `tune` input (the tune "
                               "rule's choice)")
        tune = inputs["tune"]  # one path, or one per fold (a list input)
        return cls(config, trees_by_question(list(tune) if isinstance(tune, list | tuple) else [tune]))

    def begin(self, question_id):
        tree = self.trees.get(question_id, self.trees.get(None))
        if tree is None:
            raise SpecFitError(f"question {question_id}: no fold's tuned tree decodes it; rerun its tune jobs")
        self.config = dataclasses.replace(self.config, **tree)
