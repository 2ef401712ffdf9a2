"""The quantities the report's inputs hold, by key, and how a table prints them: metrics.json
(`specfit.results.metrics`), the theory's Table 5 rows (`specfit.stages.theory`)."""

from dataclasses import dataclass

from specfit.report.page import MISSING, as_pct, fmt, show, tagged
from specfit.results.metrics import SPLIT_KEYS


@dataclass(frozen=True)
class Quantity:
    label: str
    fmt: str  # format spec of the printed value
    timing: bool = False  # measured on the clock: labelled "emulated link" when the link is emulated


# metrics.json key (`specfit.results.metrics.KEYS`) -> how the report prints it
METRICS = {
    "tps_dec": Quantity("Decode TPS", ".2f", timing=True),
    "tps_req": Quantity("Request TPS", ".2f", timing=True),
    "draft_nodes_per_cycle": Quantity("Draft nodes", ".2f"),
    "committed_per_cycle": Quantity("Committed", ".2f"),
    "committed_per_cycle_fresh": Quantity("Committed, fresh cycles", ".2f"),
    "committed_per_cycle_repeated": Quantity("Committed, repeated cycles", ".2f"),
    "cycles_fresh": Quantity("Fresh cycles", "d"),
    "cycles_repeated": Quantity("Repeated cycles", "d"),
    "cycles": Quantity("Cycles", "d"),
    "ms_per_cycle": Quantity("ms/cycle", ".1f", timing=True),
    "h2d_per_token": Quantity("H2D/token", ".1f"),
    "draft_ms_per_cycle": Quantity("Draft ms/cycle", ".1f", timing=True),
    "verify_ms_per_cycle": Quantity("Verify ms/cycle", ".1f", timing=True),
    "select_ms_per_cycle": Quantity("Host ms/cycle (mean)", ".2f", timing=True),
    "commit_ms_per_cycle": Quantity("Commit ms/cycle", ".2f", timing=True),
    "select_ms_median": Quantity("Host ms/cycle (median)", ".2f", timing=True),
    "select_share_pct": Quantity("Host share of decode time (%)", ".2f", timing=True),
    "n_requests": Quantity("Requests", "d"),
    "n_output_tokens": Quantity("Output tokens", "d"),
}
DRAFT_KEYS = ("draft_nodes_per_cycle", "draft_ms_per_cycle", *SPLIT_KEYS)  # AR: a dash, as in the paper
# the cycle's host and commit times and its undrafted cycles: a dash in metrics.json written before them
LATER_KEYS = ("select_ms_per_cycle", "commit_ms_per_cycle", "cycles_without_draft")
# the keys specfit.speculative.stream adds to those of stream_metrics
LINK_EMULATED, TIMING_LABEL, LOSSLESS, RESUMED = "link_emulated", "timing_label", "lossless", "resumed"
DTYPE, VERIFY = "dtype", "verify"  # the target's dtype and how its tree forwards computed their rows
ROUTE_PREDICTOR = "route_predictor"  # a learned-route run's: the predictor's time in its cycles

TOKENS_PER_TRANSFER = "Tokens/transfer"  # output tokens per H2D expert transfer, prefill included: 1 / H2D/token


def tokens_per_transfer(m: dict | None) -> float | None:
    """Output tokens per H2D expert transfer over whole requests, prefill included (the paper's "token-per-transfer",
    Section 4.4): 1 / h2d_per_token; None without transfers."""
    h2d = None if m is None else m.get("h2d_per_token")
    return None if not h2d else 1.0 / h2d


# paths.theory (specfit.stages.theory.selection_theory, cache_aware_theory) -> Table 5 rows: the key (a pair of keys for
# the rows at β / 2β), the label, the key in paper_results.yaml ``theory`` (None: not in the paper).
@dataclass(frozen=True)
class TheoryRow:
    keys: tuple[str, ...]
    label: str
    paper: str | None
    fmt: str


THEORY = (
    TheoryRow(("cycles",), "Cycles", "cycles", "d"),
    TheoryRow(("lambda_star",), "λ* (largest predicted throughput, tokens/ms)", None, ".5g"),
    TheoryRow(("theta",), "Θ of the ratio rule (tokens/ms)", None, ".5g"),
    TheoryRow(("gap_pct",), "λ* − Θ (% of λ*)", "gap_pct_of_lambda", ".2f"),
    TheoryRow(("bound_pct",), "Bound of Equation 7 (% of λ*)", "bound_pct_of_lambda", ".2f"),
    TheoryRow(("s_star_differs_pct",), "Cycles with S* ≠ Ŝ (%)", "differ_pct", ".1f"),
    TheoryRow(("rho_cv",), "Coefficient of variation of ρ", "cv_rho", ".2f"),
    TheoryRow(("s_star_gain_pct",), "Gain of S* with recorded acceptances (%)", "gain_recorded_pct", ".2f"),
    TheoryRow(("union_per_reward_beta", "union_per_reward_2beta"), "Mean F(Ŝ)/R̂(Ŝ) at β / 2β", "mean_F_over_R",
              ".1f"),
    TheoryRow(("selected_nodes_beta", "selected_nodes_2beta"), "Mean selected nodes at β / 2β", "mean_selected_nodes",
              ".2f"),
    TheoryRow(("drafted_levels_mean",), "Mean drafted levels", "mean_drafted_levels", ".2f"),
    TheoryRow(("stopped_early_pct",), "Cycles stopped before the deepest level they could draft (%)",
              "stopped_before_5_pct", ".1f"),
    TheoryRow(("length_limited_cycles",), "Cycles whose depth the length limit capped", None, "d"),
    TheoryRow(("empty_pool_cycles",), "Cycles that drafted nothing (root only)", None, "d"),
    TheoryRow(("recorded_selection_differs_pct",), "Cycles where reselection differs from the recorded Ŝ (%)", None,
              ".1f"),
    TheoryRow(("dinkelbach_iterations",), "Dinkelbach iterations", None, "d"),
)
# beyond the paper: the rows Table 5 under specfit-ca's cache-aware cost adds (specfit.stages.theory.cache_aware_theory)
THEORY_CACHE_AWARE = (
    TheoryRow(("misses_per_reward_beta", "misses_per_reward_2beta"), "Mean M(Ŝ)/R̂(Ŝ) at β / 2β (experts copied)",
              None, ".1f"),
    TheoryRow(("cycles_without_residency",), "Cycles priced with nothing resident (no residency recorded)",
              None, "d"),
)
PAPER_PAIR = ("beta", "two_beta")  # paper_results.yaml keys of a β / 2β pair
# the keys without which a metrics.json or a theory file is an error (older files lack LATER_KEYS and SPLIT_KEYS)
METRICS_REQUIRED = (*(k for k in METRICS if k not in (*SPLIT_KEYS, *LATER_KEYS)), LINK_EMULATED, TIMING_LABEL, LOSSLESS)
THEORY_REQUIRED = tuple(k for row in THEORY for k in row.keys)
THEORY_CACHE_AWARE_REQUIRED = (*THEORY_REQUIRED, *(k for row in THEORY_CACHE_AWARE for k in row.keys))


def column(key: str, emulated: bool) -> str:
    """The header of a metrics.json column; timings over an emulated link say so."""
    q = METRICS[key]
    return tagged(q.label, emulated and q.timing)


def metric(metrics: dict, key: str, emulated: bool, run=lambda x: x, ar=lambda x: False, spec: str = "") -> tuple:
    """A table column of one metrics.json key, as `METRICS` prints it (or as ``spec``): header, and the cell of a row,
    whose run ``run(row)`` gives; AR drafts nothing, so a row where ``ar(row)`` has a dash for `DRAFT_KEYS`."""
    return column(key, emulated), lambda x: (MISSING if key in DRAFT_KEYS and ar(x)
                                             else fmt(metrics[run(x)].get(key), spec or METRICS[key].fmt))


def tps_cell(e) -> str:
    return show(e, METRICS["tps_dec"].fmt)


def gain_cell(e) -> str:
    """A ratio of two runs as a percent gain with its interval and verdict: "3.1 [-2.0, 8.4] tie"."""
    return show(as_pct(e), ".1f")


def x_cell(e) -> str:
    """A ratio, the paper's (a number) or a run's (an estimate), as "1.03×" or "1.03× [0.97, 1.09] tie"."""
    return show(e, ".2f", "×")
