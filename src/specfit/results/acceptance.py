"""The toy's acceptance beside the paper's: how many tokens EAGLE-3 commits per cycle and how SpecFit's selection
behaves on the recorded pools (Table 5), per workload. SpecFit's case rests on acceptance (it pays where acceptance
is low or varies from cycle to cycle), so the proportions section and ``python -m specfit.bench proportions`` show
these rows beside the cost rows; `level_calibration` sets commit probabilities against acceptance level by level.
Torch-free.

Only EAGLE-3's committed tokens per cycle has a goal (within `TOLERANCE` of the paper's, and more on GSM8K than on
summarization, as the paper's); the other rows are shown with the direction of their difference from the paper's.
"""

from __future__ import annotations

import statistics

# key, label, and where the paper has it: ("counters", method) in Tables 2-4 or ("theory", field) in Table 5
ACCEPTANCE = (
    ("e3_committed", "EAGLE-3 (paper tree) committed per cycle, with the cache", ("counters", "committed")),
    ("selected_nodes", "SpecFit selected nodes per cycle (Table 5, at β)", ("theory", "mean_selected_nodes")),
    ("drafted_levels", "SpecFit drafted levels per cycle", ("theory", "mean_drafted_levels")),
    ("stopped_early_pct", "SpecFit cycles stopped before level 5 (%)", ("theory", "stopped_before_5_pct")),
    ("rho_cv", "coefficient of variation of ρ (SpecFit's pools)", ("theory", "cv_rho")),
)
# where each row's figure lies: EAGLE-3's run's metrics.json, or SpecFit's Table 5 (specfit.stages.theory)
MEASURED = {"e3_committed": ("metrics", "committed_per_cycle"), "selected_nodes": ("theory", "selected_nodes_beta"),
            "drafted_levels": ("theory", "drafted_levels_mean"), "stopped_early_pct": ("theory", "stopped_early_pct"),
            "rho_cv": ("theory", "rho_cv")}
TOLERANCE = 0.15  # EAGLE-3's committed tokens per cycle within ±15% of the paper's
ORDERED = ("summarization", "gsm8k")  # the paper's EAGLE-3 commits fewer per cycle on the first than on the second


def paper_acceptance(paper: dict, workload: str, gpu: str = "a100") -> dict:
    """The paper's figures of each row on ``workload`` (paper-results.yaml); None where it has none (Table 5 is the
    A100's only)."""
    out = {}
    for key, _, (table, field) in ACCEPTANCE:
        if table == "counters":
            row = paper["counters"].get(gpu, {}).get(workload, {}).get("eagle3", {}).get("cache")
            out[key] = None if row is None else row[field]
        else:
            value = paper["theory"].get(workload, {}).get(field) if gpu == "a100" else None
            out[key] = value["beta"] if isinstance(value, dict) else value
    return out


def run_acceptance(e3_metrics: dict | None, theory: dict | None) -> dict:
    """This run's figures of each row: from EAGLE-3's with-cache metrics.json and SpecFit's Table 5 (either None
    where it is not there)."""
    sources = {"metrics": e3_metrics, "theory": theory}
    return {key: None if sources[src] is None else sources[src].get(field) for key, (src, field) in MEASURED.items()}


def acceptance_met(key: str, toy: float | None, paper: float | None) -> bool | None:
    """Whether a row meets its goal: EAGLE-3's committed per cycle within `TOLERANCE` of the paper's; None for a
    row without a goal or a value."""
    if key != "e3_committed" or toy is None or paper is None:
        return None
    return abs(toy / paper - 1) <= TOLERANCE


def shown(key: str) -> str:
    """A row's number format: percentages to a tenth, the rest to a hundredth."""
    return ".1f" if key.endswith("_pct") else ".2f"


def direction(toy: float | None, paper: float | None) -> str | None:
    """How this run's figure differs from the paper's: "higher (+12%)", "lower (-30%)", "equal"; None without both."""
    if toy is None or paper is None:
        return None
    if paper == 0:
        return "equal" if toy == 0 else "higher"
    change = toy / paper - 1
    if abs(change) < 0.005:
        return "equal"
    return f"{'higher' if change > 0 else 'lower'} ({100 * change:+.0f}%)"


def ordered_met(committed: dict[str, float | None]) -> bool | None:
    """EAGLE-3 commits more per cycle on GSM8K than on summarization, as in the paper (``committed``: workload ->
    this run's figure); None without both."""
    low, high = (committed.get(w) for w in ORDERED)
    return None if low is None or high is None else high > low


LEVEL_COLUMNS = ("pool_prob", "pool_parent", "pool_level", "selected", "accepted_path")  # what it reads of a cycle


def level_calibration(cycles: list[dict]) -> dict[int, tuple[int, float, float]]:
    """Per level d: the verified nodes whose parent was committed (the trials: each was committed or not), their
    mean predicted commit probability (the node's path probability over its parent's, the conditional the decode
    predicted: the drafter's at T = 0, the mode's at T > 0) and the share committed. A node under a parent the decode
    gave probability 0 (committed all the same) has no conditional and is no trial."""
    trials: dict[int, list[tuple[float, bool]]] = {}
    for c in cycles:
        prob, parent, level = c["pool_prob"], c["pool_parent"], c["pool_level"]
        committed = {0, *c["accepted_path"]}
        for v in c["selected"]:
            if parent[v] in committed and prob[parent[v]] > 0:
                trials.setdefault(level[v], []).append((prob[v] / prob[parent[v]], v in committed))
    return {d: (len(t), statistics.mean(p for p, _ in t), statistics.mean(a for _, a in t))
            for d, t in sorted(trials.items())}
