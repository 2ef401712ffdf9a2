"""What a config may ask of its methods, checked at load (`specfit.planning.config.load_config` calls
`check_methods`): SpecFit's K within the device's fitted intercepts, an exact search it can finish within a cycle, and
a tuned method's grid and tuning questions. Torch-free, as all of planning.
"""

from __future__ import annotations

import itertools

from specfit.errors import SpecFitError
from specfit.planning.matrix import (
    evaluated_ids,
    fold_ids,
    method_config,
    method_kind,
    tune_folds,
    tune_question_ids,
)

PAPER_TREE = {"max_depth": 5, "top_k_expand": 2}  # the paper's EAGLE-3 tree (Section 4.1), which a tune grid must span
# The most legal subtrees SpecFit's exact search may have to visit in one selection: about 10 ms at the ~10 ns a
# subtree the compiled search takes on a CPU core (a depth 5, width 3 pool at K 16, 12.5 million, took 120 ms a
# cycle). The paper's pool at K 7 holds 316, specfit-online's at K 16 3,269.
MAX_LEGAL_SUBTREES = 10**6


def legal_subtrees(max_depth: int, top_k_expand: int, k_max: int) -> int:
    """|A_K| of Eq. 2 for a full pool of that shape, the count the exact search visits (Algorithm 1). The pool:
    ``top_k_expand`` children of the root, all expanded; then at each further level the first ``top_k_expand`` nodes
    expanded, the children of the level's first expanded node (the frontier when one branch dominates), each with
    ``top_k_expand`` children; subtrees of at most ``k_max`` nodes.

    By sizes: a node's ancestor-closed subtrees that hold it are x·Π over its children (1 + theirs), truncated at
    degree K; A_K is Π over the root's children (1 + theirs), the root-only choice included."""
    w, k = top_k_expand, k_max

    def times(a: list[int], b: list[int]) -> list[int]:
        return [sum(a[i] * b[n - i] for i in range(n + 1)) for n in range(k + 1)]

    def holding(level: int, expanded: bool, leads: bool) -> list[int]:  # [size] subtrees that hold this node
        poly = [1] + [0] * k
        if expanded and level < max_depth:
            for child in range(w):  # a leading node's children are expanded, the first of them leads
                t = holding(level + 1, leads, leads and child == 0)
                poly = times(poly, [t[0] + 1, *t[1:]])
        return [0, *poly[:k]]

    family = [1] + [0] * k
    for child in range(w):
        t = holding(1, True, child == 0)
        family = times(family, [t[0] + 1, *t[1:]])
    return sum(family)


def check_methods(config: dict) -> list[str]:
    """The problems of the config's method entries, each naming its key."""
    problems = []
    for block in config["runs"]:
        for method, device in itertools.product(block["methods"], block["devices"]):
            if method not in config["methods"] or device not in config["devices"] or not _kind(config, method):
                continue
            fit = config["devices"][device]["coefficients"] == "fit"
            if _kind(config, method).dense_cost and not fit:
                problems.append(
                    f"config key 'methods.{method}': kind {_kind(config, method).name!r} refits b_k on the "
                    f"calibration's probe points, but device {device!r} has no probes (devices.{device}.coefficients: "
                    f"{config['devices'][device]['coefficients']}); set it to fit, or run the method elsewhere")
            if _kind(config, method).calibrated:
                k_max = method_config(config, method).k_max
                sizes = config["calibration"]["sizes"] if fit else 8  # the paper's presets: b_0..b_7
                if k_max + 1 > sizes:
                    problems.append(
                        f"config key 'methods.{method}.k_max' is {k_max}, but device {device!r} has intercepts "
                        f"b_0..b_{sizes - 1} only ({'calibration.sizes' if fit else 'the paper preset'}): "
                        f"{'set calibration.sizes to at least k_max + 1' if fit else 'use k_max <= 7'}"
                    )
    for name in config["methods"]:
        if (kind := _kind(config, name)) and kind.searches:
            m = method_config(config, name)
            if (n := legal_subtrees(m.max_depth, m.top_k_expand, m.k_max)) > MAX_LEGAL_SUBTREES:
                problems.append(
                    f"config key 'methods.{name}': max_depth {m.max_depth}, top_k_expand {m.top_k_expand} and k_max "
                    f"{m.k_max} give a full pool {n:,} legal subtrees, which the exact search visits in every "
                    f"selection (over {MAX_LEGAL_SUBTREES:,}: ~10 ns each on a CPU core); lower k_max or "
                    f"top_k_expand (depth 5, width 2 and K 16 give {legal_subtrees(5, 2, 16):,})")
    return problems + _check_tuned(config)


def _kind(config: dict, method: str):
    try:
        return method_kind(config, method)
    except SpecFitError:  # named among the problems already
        return None


def _check_tuned(config: dict) -> list[str]:
    """A tuned method (`specfit.speculative.kinds.Kind.tuned`) sets no tree of its own, its grid reaches the paper's
    tree (a tuned tree is the best of trees that include the one published), and each workload it runs on has tuning
    questions that it does not evaluate."""
    from specfit.speculative.tuning import TREE_KEYS  # torch-free

    problems, tuned = [], set()
    for name, entry in config["methods"].items():
        try:
            if not method_kind(config, name).tuned:
                continue
        except SpecFitError:  # named among the problems already
            continue
        tuned.add(name)
        for key in TREE_KEYS:
            if key in entry:
                problems.append(f"config key 'methods.{name}.{key}': the tune rule chooses a method of kind "
                                f"{entry['kind']!r}'s tree (the grid under 'tune'); drop it")
    used = {m for b in config["runs"] for m in b["methods"]}
    for key, least in PAPER_TREE.items():
        if tuned & used and max(config["tune"][key]) < least:
            problems.append(f"config key 'tune.{key}' reaches {max(config['tune'][key])}, short of the paper's tree "
                            f"({key} {least}): a tuned tree is the best of a grid that holds the published one; "
                            f"add {least}")
    for workload in sorted({w for b in config["runs"] if tuned & set(b["methods"]) for w in b["workloads"]}):
        if workload in config["workloads"]:
            problems += _check_tuning_questions(config, workload)
    return problems


def _check_tuning_questions(config: dict, workload: str) -> list[str]:
    """The questions each tree of a tuned run on ``workload`` is chosen on: some, and none it decodes (under
    cross-fitting, every fold holds questions to decode and the folds' tuning questions are the other folds')."""
    wl, key = config["workloads"][workload], f"workloads.{workload}"
    evaluated, folds = evaluated_ids(config, workload), tune_folds(config, workload)
    if folds:
        if wl.get("tune_question_ids") is not None:
            return [f"config key '{key}.tune_folds': cross-fitting tunes on the workload's own evaluated questions; "
                    f"drop it or '{key}.tune_question_ids', not both"]
        if folds > len(evaluated):
            return [f"config key '{key}.tune_folds' is {folds}, but the workload evaluates {len(evaluated)} "
                    f"questions: a fold would be empty; use at most {len(evaluated)} folds"]
        parts = [(f, fold_ids(config, workload, f)) for f in range(folds)]
    else:
        parts = [(None, evaluated)]
    problems = []
    for fold, decodes in parts:
        ids = tune_question_ids(config, workload, fold)
        if not ids:
            problems.append(f"config key '{key}.tune_question_ids': a tuned method runs on workload {workload!r}, "
                            "which has no questions it does not evaluate to tune on; give tune_question_ids, "
                            "tune_folds (cross-fitting), or a max_requests below its ids")
        elif overlap := sorted(set(decodes) & set(ids)):
            problems.append(f"config key '{key}.tune_question_ids' holds questions the workload evaluates "
                            f"({', '.join(map(str, overlap[:8]))}): tune on others")
    return problems
