"""The fixed EAGLE-3 tree a user tunes by hand, found by a sweep (the tune rule, `specfit.stages.tune`): every tree of
the grid decodes a workload's tuning questions (those it does not evaluate) and the one with the highest decode TPS
is chosen; a method of a tuned kind (`specfit.speculative.kinds.Kind.tuned`) then decodes with that tree.

A tree is (max_depth, top_k_expand, k_max): drafted levels, children per expanded node, verified nodes; the grid's
k_max is max_depth x top_k_expand (a chain for width 1). Torch-free: planning reads the grid.
"""

from __future__ import annotations

from pathlib import Path

from specfit.errors import SpecFitError
from specfit.io import read_json

TREE_KEYS = ("max_depth", "top_k_expand", "k_max")


def grid(tune: dict) -> list[dict]:
    """The trees of the config's ``tune`` entry: each max_depth with each top_k_expand."""
    return [{"max_depth": d, "top_k_expand": w, "k_max": d * w}
            for d in tune["max_depth"] for w in tune["top_k_expand"]]


def best(trees: list[dict]) -> dict:
    """The tree of highest decode TPS (the first of equals, in grid order): its `TREE_KEYS`."""
    top = max(trees, key=lambda t: t["tps_dec"])
    return {k: top[k] for k in TREE_KEYS}


def choice(grid: dict, slots: int) -> dict:
    """Rule tune_choice: one slot count's part of a tune job's grid (`specfit.stages.tune`), as a tuned method's decode
    and the report read it: the chosen tree, every tree's row, how they were clocked, the questions, the clock."""
    part = grid["slots"].get(str(slots))
    if part is None:
        raise SpecFitError(f"the tune grid has no slot count {slots} (it has {', '.join(grid['slots'])}); rerun "
                           "its tune job")
    return {"chosen": part["chosen"], "trees": part["trees"], "clocked": part["clocked"],
            "question_ids": grid["question_ids"], "decodes": grid["decodes"], "timing_label": grid["timing_label"],
            "slots": slots}


def chosen_tree(path: str | Path) -> dict:
    """The tree a tune job chose (its JSON's ``chosen``), checked: every `TREE_KEYS` a positive integer."""
    return _checked(read_json(path), path)


def _checked(data: dict, path) -> dict:
    tree = data.get("chosen") or {}
    if sorted(tree) != sorted(TREE_KEYS) or not all(isinstance(v, int) and v > 0 for v in tree.values()):
        raise SpecFitError(f"{path}: no tuned tree (chosen: {tree}); rerun its tune job")
    return tree


def trees_by_question(paths: list[str | Path]) -> dict[int | None, dict]:
    """Question id -> the tree that decodes it, from a tuned run's tune jobs (one per cross-fitted fold, each naming
    the questions it ``decodes``); key None: the tree of a question no fold names (a single tune job's, for any
    question). Two folds that claim one question are refused."""
    if len(paths) == 1:
        return {None: chosen_tree(paths[0])}
    trees: dict[int | None, dict] = {}
    for path in paths:
        data = read_json(path)
        tree = _checked(data, path)
        for q in data.get("decodes") or []:
            if q in trees:
                raise SpecFitError(f"{path}: question {q} is decoded by two folds' trees; rerun the tune jobs")
            trees[q] = tree
    return trees


def tree_label(tree: dict) -> str:
    """How the report names a tree: depth, width and verified nodes."""
    return f"depth {tree['max_depth']}, width {tree['top_k_expand']}, k {tree['k_max']}"
