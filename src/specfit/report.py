"""Stage 7, the report: one HTML page (Jinja2 + matplotlib) and a Markdown twin with the same tables.

Per model and device: decode throughput with and without the expert cache (Figures 2-3), the counters
(Tables 2-3), the cache-size sweep (Figure 4), the theory on recorded pools (Table 5), the calibration fit
(Appendix B), the selection cost and route-noise sensitivity (section 4.6) and the lossless check; per model,
the devices side by side (Table 4) and the paper's headline figures beside this run's. Every timing taken
over an emulated link says so. A missing input empties its section with a note; a malformed one is an error.

Every decode TPS carries its 95% percentile-bootstrap interval over the run's requests (requests.parquet beside
metrics.json), and every ratio of two runs' TPS a paired bootstrap interval over request ids
(`specfit.intervals`); a ratio whose interval holds 1 reads "tie", never a win.

spec: the config slice it shows (workloads, models, devices, methods, runs, seed)
inputs: root (the workflow folder that holds data/)        outputs: report (a folder)
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import logging
import math
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from specfit import intervals  # noqa: E402
from specfit.coefficients import paper_results  # noqa: E402
from specfit.io import atomic_path  # noqa: E402
from specfit.stage import SpecFitError, stage_main  # noqa: E402
from specfit.workflow import DecodeRun, decode_runs, method_rule, spec_json, theory_runs  # noqa: E402

log = logging.getLogger("specfit.report")

EMULATED = "emulated link"
MISSING = "–"


# ------------------------------------------------------------------------------------ what the inputs hold
@dataclass(frozen=True)
class Quantity:
    label: str
    fmt: str  # format spec of the printed value
    timing: bool = False  # measured on the clock: labelled "emulated link" when the link is emulated


# metrics.json (specfit.decode) key -> how the report prints it. A renamed key is one edit here.
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
    "select_ms_median": Quantity("Selection ms/cycle (median)", ".2f", timing=True),
    "select_share_pct": Quantity("Selection share of decode time (%)", ".2f", timing=True),
    "n_requests": Quantity("Requests", "d"),
    "n_output_tokens": Quantity("Output tokens", "d"),
}
# fresh vs repeated-4-gram cycles (specfit.ngrams): shown for drafting methods; absent from older metrics.json
SPLIT_KEYS = ("committed_per_cycle_fresh", "committed_per_cycle_repeated", "cycles_fresh", "cycles_repeated")
DRAFT_KEYS = ("draft_nodes_per_cycle", "draft_ms_per_cycle", *SPLIT_KEYS)  # AR: a dash, as in the paper
LINK_EMULATED, TIMING_LABEL, LOSSLESS, RESUMED = "link_emulated", "timing_label", "lossless", "resumed"
METRICS_REQUIRED = (*(k for k in METRICS if k not in SPLIT_KEYS), LINK_EMULATED, TIMING_LABEL, LOSSLESS)

# requests.parquet beside each metrics.json (REQUEST_SCHEMA of specfit.spec.request): the columns the intervals read
REQUEST_COLUMNS = ("request_id", "n_output", "t_request_s", "t_prefill_s")
TPS_MATCH_RTOL = 1e-6  # metrics.json's tps_dec and the one its requests.parquet gives must agree

# data/calibration/{model}/{device}/{cache}.json (specfit.calibrate)
CALIBRATION_REQUIRED = ("b", "beta", "source", "r2", "rmse_ms", "n_points", "slots", "link_emulated")
POINTS_COLUMNS = ("k", "tree", "y_ms", "pred_ms")

# data/theory/{model}/{device}/{workload}.json (specfit.theory.selection_theory) -> Table 5 rows: the key (a pair
# of keys for the rows at β / 2β), the label, the key in paper_results.yaml ``theory`` (None: not in the paper).
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
    TheoryRow(("stopped_early_pct",), "Cycles stopped before the deepest level (%)", "stopped_before_5_pct", ".1f"),
    TheoryRow(("recorded_selection_differs_pct",), "Cycles where reselection differs from the recorded Ŝ (%)", None,
              ".1f"),
    TheoryRow(("dinkelbach_iterations",), "Dinkelbach iterations", None, "d"),
)
THEORY_REQUIRED = tuple(k for row in THEORY for k in row.keys)
PAPER_PAIR = ("beta", "two_beta")  # paper_results.yaml keys of a β / 2β pair

# paper_results.yaml counters -> metrics.json keys, so that paper and run go through the same code
PAPER_COUNTERS = {"draft_nodes": "draft_nodes_per_cycle", "committed": "committed_per_cycle", "cycles": "cycles",
                  "ms_per_cycle": "ms_per_cycle", "h2d_per_token": "h2d_per_token"}
PAPER_CACHE = {"cache": "cache", "nocache": "no_cache"}
PAPER_DEVICES = ("a100", "rtx4090")
VERSIONS = ("specfit", "torch", "transformers", "snakemake", "numpy")


# ------------------------------------------------------------------------------------ the page's building blocks
@dataclass
class Table:
    caption: str
    header: list[str]
    rows: list[list[str]]


@dataclass
class Figure:
    path: str  # relative to the report folder
    caption: str


@dataclass
class Section:
    title: str
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


@dataclass
class Part:
    title: str
    notes: list[str]
    sections: list[Section]


def fmt(value, spec: str) -> str:
    """One number as the tables print it; None is a dash."""
    if value is None:
        return MISSING
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if spec == "d":
        return str(int(value))
    if isinstance(value, str):
        return value
    return format(value, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def pct_less(a, b):
    """How many percent ``a`` lies below ``b``."""
    r = ratio(a, b)
    return None if r is None else 100.0 * (1.0 - r)


def x_fmt(value) -> str:
    return MISSING if value is None else f"{value:.2f}×"


# ------------------------------------------------------------------------------------ intervals
NO_INTERVAL = "[no interval]"


def interval_note(seed: int) -> str:
    return (f"Decode TPS in brackets: 95% interval, a percentile bootstrap over the run's requests "
            f"({intervals.N_BOOT} resamples, seed {seed}). Ratios between runs (speedups, gains): the same bootstrap "
            f"paired over request ids (both runs resampled with the same prompts); a ratio whose interval "
            f"includes 1 is a tie, “faster” / “slower” only when the whole interval lies above / below 1.")


def est(value, ci: dict | None = None) -> dict | None:
    """A run's estimate: value, with its interval (and verdict, for a ratio) where the requests give one."""
    if value is None:
        return None
    out = {"value": value, "low": None, "high": None}
    if ci is not None:
        out.update(low=ci["low"], high=ci["high"])
        if "verdict" in ci:
            out["verdict"] = ci["verdict"]
    return out


def as_pct(e: dict | None) -> dict | None:
    """A ratio estimate as a percent change, 100 (r − 1), verdict kept."""
    if e is None:
        return None
    return {**e, **{k: None if e[k] is None else 100.0 * (e[k] - 1.0) for k in ("value", "low", "high")}}


def show(value, spec: str, unit: str = "") -> str:
    """A paper number (float) or a run's estimate (dict): "1.03× [0.97, 1.09] tie", "5.21 [4.80, 5.66]"."""
    if not isinstance(value, dict):
        return MISSING if value is None else fmt(value, spec) + unit
    text = fmt(value["value"], spec) + unit
    if value["low"] is None:
        return f"{text} {NO_INTERVAL}"
    text += f" [{fmt(value['low'], spec)}, {fmt(value['high'], spec)}]"
    return f"{text} {value['verdict']}" if "verdict" in value else text


def tps_cell(e) -> str:
    return show(e, METRICS["tps_dec"].fmt)


def x_cell(e) -> str:
    return show(e, ".2f", "×")


def error_bar(e: dict | None):
    """Matplotlib yerr of an estimate ([[below], [above]]), None without an interval."""
    if e is None or e["low"] is None:
        return None
    return [[max(0.0, e["value"] - e["low"])], [max(0.0, e["high"] - e["value"])]]


def slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


def tagged(text: str, emulated: bool) -> str:
    return f"{text} [{EMULATED}]" if emulated else text


def column(key: str, emulated: bool) -> str:
    """The header of a metrics.json column; timings over an emulated link say so."""
    q = METRICS[key]
    return tagged(q.label, emulated and q.timing)


# ------------------------------------------------------------------------------------ loading
def _load_json(path: Path, required: tuple[str, ...]) -> dict | None:
    """A stage's JSON output, or None when absent; a file without the keys the report reads is an error."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise SpecFitError(f"{path} is not valid JSON: {err}") from err
    lacking = [k for k in required if not isinstance(data, dict) or k not in data]
    if lacking:
        raise SpecFitError(f"{path} lacks {', '.join(lacking)} (the report reads these keys)")
    return data


def _load_columns(path: Path, columns: tuple[str, ...]):
    if not path.is_file():
        return None
    table = pq.read_table(path)
    lacking = [c for c in columns if c not in table.column_names]
    if lacking:
        raise SpecFitError(f"{path} lacks columns {', '.join(lacking)}")
    return table.select(list(columns))


def _load_points(path: Path) -> dict[str, np.ndarray] | None:
    """A calibration's probe points: column name -> numpy array."""
    table = _load_columns(path, POINTS_COLUMNS)
    return None if table is None else {c: table.column(c).to_numpy() for c in POINTS_COLUMNS}


def _load_requests(path: Path) -> list[dict] | None:
    """A decode run's requests (the columns the intervals read), one dict per request."""
    table = _load_columns(path, REQUEST_COLUMNS)
    return None if table is None else table.to_pylist()


@dataclass
class Inputs:
    spec: dict
    root: Path
    runs: list[DecodeRun]
    metrics: dict[DecodeRun, dict]  # present runs only
    calibration: dict[tuple[str, str, str], dict]  # (model, device, cache mode)
    points: dict[tuple[str, str, str], dict[str, np.ndarray]]  # column -> values
    theory: dict[tuple[str, str, str], dict]  # (model, device, workload)
    paper: dict
    requests: dict[DecodeRun, list[dict]] = field(default_factory=dict)  # present runs only
    _intervals: dict = field(default_factory=dict, repr=False)

    @property
    def seed(self) -> int:
        return int(self.spec.get("seed", 0))

    def missing(self, runs: list[DecodeRun]) -> list[str]:
        return [f"{r.path}/metrics.json" for r in runs if r not in self.metrics]

    def missing_requests(self, runs) -> list[str]:
        """requests.parquet of runs that have metrics but no requests (their numbers show without an interval)."""
        return list(dict.fromkeys(f"{r.path}/requests.parquet" for r in runs
                                  if r is not None and r in self.metrics and r not in self.requests))

    def run(self, model, device, workload, method, slots) -> dict | None:
        return self.metrics.get(DecodeRun(model, device, workload, method, slots))

    def tps(self, run: DecodeRun | None) -> dict | None:
        """A run's decode TPS (metrics.json) with its bootstrap interval over requests."""
        m = self.metrics.get(run)
        if m is None or m["tps_dec"] is None:
            return None
        if run not in self.requests:
            return est(m["tps_dec"])
        key = ("tps", run)
        if key not in self._intervals:
            try:
                ci = intervals.tps_interval(self.requests[run], seed=self.seed)
            except ValueError as err:
                raise SpecFitError(f"{run.path}/requests.parquet: {err}") from err
            if not math.isclose(ci["value"], m["tps_dec"], rel_tol=TPS_MATCH_RTOL):
                raise SpecFitError(f"{run.path}: metrics.json has tps_dec {m['tps_dec']}, its requests.parquet gives "
                                   f"{ci['value']}: the two files come from different runs")
            self._intervals[key] = ci
        return est(m["tps_dec"], self._intervals[key])

    def speedup(self, num: DecodeRun | None, den: DecodeRun | None) -> dict | None:
        """TPS(num) / TPS(den) with a paired bootstrap interval over the request ids both runs hold."""
        a, b = self.metrics.get(num), self.metrics.get(den)
        if a is None or b is None or a["tps_dec"] is None or not b["tps_dec"]:
            return None
        if num not in self.requests or den not in self.requests:
            return est(ratio(a["tps_dec"], b["tps_dec"]))
        key = ("ratio", num, den)
        if key not in self._intervals:
            for run in (num, den):
                self.tps(run)  # its requests.parquet agrees with its metrics.json
            try:
                self._intervals[key] = intervals.ratio_interval(self.requests[num], self.requests[den],
                                                                seed=self.seed)
            except ValueError as err:
                raise SpecFitError(f"{num.path} over {den.path}: {err}") from err
        ci = self._intervals[key]
        return est(ci["value"], ci)


def load_inputs(spec: dict, root: Path) -> Inputs:
    runs = decode_runs(spec)
    metrics, requests = {}, {}
    for r in runs:
        data = _load_json(root / r.path / "metrics.json", METRICS_REQUIRED)
        if data is not None:
            metrics[r] = data
            rows = _load_requests(root / r.path / "requests.parquet")
            if rows is not None:
                requests[r] = rows
    calibration, points, theory = {}, {}, {}
    for model, device in sorted({(r.model, r.device) for r in runs}):
        for mode in ("cache", "nocache"):
            base = root / "data" / "calibration" / model / device
            data = _load_json(base / f"{mode}.json", CALIBRATION_REQUIRED)
            if data is not None:
                calibration[model, device, mode] = data
            frame = _load_points(base / f"{mode}.points.parquet")
            if frame is not None:
                points[model, device, mode] = frame
    for r in theory_runs(spec):
        data = _load_json(root / "data" / "theory" / r.model / r.device / f"{r.workload}.json", THEORY_REQUIRED)
        if data is not None:
            theory[r.model, r.device, r.workload] = data
    return Inputs(spec, root, runs, metrics, calibration, points, theory, paper_results(), requests)


# ------------------------------------------------------------------------------------ roles of the methods
@dataclass(frozen=True)
class Roles:
    """The config's methods in the paper's roles: AR, EAGLE-3, SpecFit (exact routes), SpecFit noisy routes."""

    ar: str | None
    eagle3: str | None
    specfit: str | None
    noisy: list[str]

    @classmethod
    def of(cls, spec: dict) -> "Roles":
        def first(pred):
            return next((m for m in spec["methods"] if pred(m)), None)

        def routes(m):
            return spec["methods"][m].get("routes", "atlas")

        return cls(
            ar=first(lambda m: method_rule(spec, m) == "ar"),
            eagle3=first(lambda m: method_rule(spec, m) == "eagle3"),
            specfit=first(lambda m: method_rule(spec, m) == "specfit" and routes(m) == "atlas"),
            noisy=[m for m in spec["methods"] if method_rule(spec, m) == "specfit" and routes(m) == "noisy"],
        )


def paper_device(spec: dict, device: str) -> str:
    """The paper's GPU a device stands for: named in its name, label or coefficients, else by order."""
    for name in PAPER_DEVICES:
        key = name.replace("rtx", "")
        d = spec["devices"][device]
        if any(key in str(s).lower() for s in (device, d.get("label", ""), d.get("coefficients", ""))):
            return name
    order = list(spec["devices"])
    return PAPER_DEVICES[min(order.index(device), len(PAPER_DEVICES) - 1)]


def main_slots(spec: dict, model: str, device: str) -> int:
    return spec["models"][model]["main_slots"][device]


def cache_cell(slots: int) -> str:
    return f"Yes ({slots})" if slots > 0 else "No"


# ------------------------------------------------------------------------------------ figures
class Figures:
    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def save(self, fig, name: str, caption: str) -> Figure:
        fig.tight_layout()
        fig.savefig(self.folder / f"{name}.png", dpi=110)
        plt.close(fig)
        return Figure(f"{self.folder.name}/{name}.png", caption)


# ------------------------------------------------------------------------------------ per model and device
class Group:
    """The runs of one (model, device) and the sections about them."""

    def __init__(self, inputs: Inputs, figures: Figures, model: str, device: str):
        self.i, self.figures, self.model, self.device = inputs, figures, model, device
        self.spec = inputs.spec
        self.roles = Roles.of(self.spec)
        self.main = main_slots(self.spec, model, device)
        self.runs = [r for r in inputs.runs if (r.model, r.device) == (model, device)]
        self.workloads = [w for w in self.spec["workloads"] if any(r.workload == w for r in self.runs)]

    def runs_of(self, workload: str) -> list[DecodeRun]:
        order = list(self.spec["methods"])
        runs = [r for r in self.runs if r.workload == workload]
        return sorted(runs, key=lambda r: (r.slots > 0, order.index(r.method), -r.slots))

    def emulated(self, runs) -> bool:
        return any(self.i.metrics[r][LINK_EMULATED] for r in runs if r in self.i.metrics)

    def m(self, workload, method, slots) -> dict | None:
        return None if method is None else self.i.run(self.model, self.device, workload, method, slots)

    def key(self, workload, method, slots) -> DecodeRun | None:
        return None if method is None else DecodeRun(self.model, self.device, workload, method, slots)

    def ar_nocache(self, workload) -> DecodeRun | None:
        return self.key(workload, self.roles.ar, 0)

    def ar_nocache_tps(self, workload) -> float | None:
        m = self.m(workload, self.roles.ar, 0)
        return None if m is None else m["tps_dec"]

    def workload_title(self, workload) -> str:
        """Where a table's numbers come from: model, device, workload and its subset label."""
        label = self.spec["workloads"][workload].get("subset_label", "")
        return f"{self.model} / {self.device}, {workload}" + (f" ({label})" if label else "")

    def sections(self) -> list[Section]:
        return [self.throughput(), self.counters(), self.sweep(), self.theory(), self.calibration(),
                self.selection_cost(), self.noisy_routes(), self.lossless()]

    # 1. Figures 2 and 3
    def throughput(self) -> Section:
        sec = Section("Decode throughput with and without the expert cache (Figures 2 and 3)")
        for w in self.workloads:
            runs = [r for r in self.runs_of(w) if r.slots in (0, self.main)]
            sec.missing += self.i.missing(runs)
            present = [r for r in runs if r in self.i.metrics]
            if not present:
                continue
            emulated = self.emulated(present)
            methods = [m for m in self.spec["methods"] if any(r.method == m for r in present)]
            fig, ax = plt.subplots(figsize=(6.4, 3.6))
            width = 0.8 / len(methods)
            for j, method in enumerate(methods):
                for x, slots in enumerate((self.main, 0)):
                    e = self.i.tps(self.key(w, method, slots))
                    if e is not None:
                        bar = ax.bar(x + (j - (len(methods) - 1) / 2) * width, e["value"], width, color=f"C{j}",
                                     yerr=error_bar(e), capsize=3, ecolor="0.25",
                                     label=method if not any(b.get_label() == method for b in ax.containers) else None)
                        ax.bar_label(bar, fmt="%.2f", fontsize=8, label_type="center")
            ax.set_xticks([0, 1], [f"With expert cache ({self.main} slots)", "Without expert cache"])
            ax.set_ylabel("Decode TPS (tokens/s)")
            ax.set_ylim(top=ax.get_ylim()[1] * 1.2)  # room for the legend above the bars
            ax.set_title(tagged(f"{self.model} / {self.device} / {w}: decode throughput", emulated), fontsize=9)
            ax.legend(fontsize=8, ncol=len(methods), loc="upper center")
            sec.figures.append(self.figures.save(fig, slug(self.model, self.device, w, "tps"),
                                                 tagged(f"Decode TPS with 95% bootstrap intervals, "
                                                        f"{self.workload_title(w)}", emulated)))
            ar = self.ar_nocache(w)
            sec.missing += self.i.missing_requests([*present, ar])
            rows = [[r.method, cache_cell(r.slots), tps_cell(self.i.tps(r)),
                     fmt(self.i.metrics[r]["tps_req"], METRICS["tps_req"].fmt),
                     x_cell(self.i.speedup(r, ar))] for r in present]
            sec.tables.append(Table(
                tagged(f"Throughput, {self.workload_title(w)}", emulated),
                ["Method", "Cache", column("tps_dec", emulated), column("tps_req", emulated),
                 tagged("Speedup over AR without cache", emulated)],
                rows))
        if sec.tables:
            sec.notes.append(interval_note(self.i.seed))
        return sec

    # 2. Tables 2 and 3
    def counters(self) -> Section:
        sec = Section("Verification and transfer counters (Tables 2 and 3)")
        keys = ("draft_nodes_per_cycle", "committed_per_cycle", *SPLIT_KEYS, "cycles", "ms_per_cycle",
                "h2d_per_token", "draft_ms_per_cycle")
        for w in self.workloads:
            runs = self.runs_of(w)
            sec.missing += self.i.missing(runs)
            present = [r for r in runs if r in self.i.metrics]
            if not present:
                continue
            emulated = self.emulated(present)
            rows = []
            for r in present:
                m = self.i.metrics[r]
                is_ar = method_rule(self.spec, r.method) == "ar"
                rows.append([r.method, cache_cell(r.slots)] + [
                    MISSING if is_ar and k in DRAFT_KEYS else fmt(m.get(k), METRICS[k].fmt) for k in keys])
            sec.tables.append(Table(tagged(f"Counters per verification cycle, {self.workload_title(w)}", emulated),
                                    ["Method", "Cache"] + [column(k, emulated) for k in keys], rows))
        if sec.tables:
            sec.notes.append("Cache: 'Yes (n)' = n expert slots per layer; 'No' = cache cleared before every target "
                             "forward. H2D/token counts expert transfers per output token, prefill included.")
            sec.notes.append("Fresh / repeated cycles: a cycle is repeated when the output 4-gram ending at its first "
                             "committed token already occurred earlier in the output (a loop; the prompt does not "
                             "count), fresh otherwise; 'Committed, fresh / repeated cycles' are the mean committed "
                             "tokens of each kind, so loops can be read apart from fresh text.")
        return sec

    # 3. Figure 4
    def sweep(self) -> Section:
        sec = Section("Cache-size sweep (Figure 4)")
        pair = (self.roles.eagle3, self.roles.specfit)
        paper = self.i.paper["slot_sweep"]
        for w in self.workloads:
            slots = {m: sorted({r.slots for r in self.runs_of(w) if r.method == m}, reverse=True) for m in pair if m}
            if len(slots) < 2 or min(len(s) for s in slots.values()) < 3:
                continue
            common = sorted(set(slots[pair[0]]) & set(slots[pair[1]]), key=lambda s: (s == 0, -s))
            runs = [DecodeRun(self.model, self.device, w, m, s) for m in pair for s in common]
            sec.missing += self.i.missing(runs)
            emulated = self.emulated(runs)
            val = {(m, s): self.m(w, m, s) for m in pair for s in common}

            def get(m, s, k):
                return None if val[m, s] is None else val[m, s][k]

            if not any(val.values()):
                continue
            with_paper = (paper_device(self.spec, self.device) == "a100" and w == "summarization"
                          and len(common) == len(paper["slots"]))
            sec.missing += self.i.missing_requests(runs)
            tps = {(m, s): self.i.tps(self.key(w, m, s)) for m in pair for s in common}
            rows = []
            for j, s in enumerate(common):
                gain = as_pct(self.i.speedup(self.key(w, pair[1], s), self.key(w, pair[0], s)))
                row = [str(s), tps_cell(tps[pair[0], s]), tps_cell(tps[pair[1], s]),
                       show(gain, ".1f"), fmt(get(pair[0], s, "ms_per_cycle"), ".1f"),
                       fmt(get(pair[1], s, "ms_per_cycle"), ".1f"), fmt(get(pair[0], s, "h2d_per_token"), ".1f"),
                       fmt(get(pair[1], s, "h2d_per_token"), ".1f")]
                if with_paper:
                    row += [str(paper["slots"][j]), fmt(paper["specfit_gain_pct"][j], ".1f")]
                rows.append(row)
            header = ["Slots", tagged(f"{pair[0]} Decode TPS", emulated), tagged(f"{pair[1]} Decode TPS", emulated),
                      tagged(f"{pair[1]} gain over {pair[0]} (%)", emulated), tagged(f"{pair[0]} ms/cycle", emulated),
                      tagged(f"{pair[1]} ms/cycle", emulated), f"{pair[0]} H2D/token", f"{pair[1]} H2D/token"]
            if with_paper:
                header += ["Paper slots (A100, by rank)", "Paper gain (%)"]
            sec.tables.append(Table(tagged(f"Slot sweep, {self.workload_title(w)} (0 = no cache)", emulated),
                                    header, rows))
            fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
            xs = range(len(common))
            for j, m in enumerate(pair):
                for ax, key in zip(axes, ("tps_dec", "ms_per_cycle", "h2d_per_token")):
                    ys = [get(m, s, key) for s in common]
                    ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None],
                            marker="o", color=f"C{j + 1}", label=m)
                    if key == "tps_dec":  # the 95% bootstrap intervals
                        for x, s in zip(xs, common):
                            if (bar := error_bar(tps[m, s])) is not None:
                                ax.errorbar([x], [tps[m, s]["value"]], yerr=bar, color=f"C{j + 1}", capsize=3)
            for ax, key in zip(axes, ("tps_dec", "ms_per_cycle", "h2d_per_token")):
                ax.set_xticks(list(xs), [str(s) for s in common])
                ax.set_xlabel("Expert slots per layer")
                ax.set_title(column(key, emulated), fontsize=9)
                ax.legend(fontsize=8)
            fig.suptitle(tagged(f"{self.model} / {self.device} / {w}: (a) decode TPS, (b) ms/cycle and H2D/token "
                                "vs slots", emulated), fontsize=9)
            sec.figures.append(self.figures.save(fig, slug(self.model, self.device, w, "sweep"),
                                                 tagged(f"Slot sweep, {self.workload_title(w)}", emulated)))
        if sec.tables:
            sec.notes.append(interval_note(self.i.seed))
        elif not sec.missing:
            sec.notes.append(f"No workload has at least three slot values for both {pair[0]} and {pair[1]}.")
        return sec

    # 5. Table 5
    def theory(self) -> Section:
        sec = Section("Selection theory on the recorded pools (Table 5)")
        runs = [r for r in theory_runs(self.spec) if (r.model, r.device) == (self.model, self.device)]
        workloads = [r.workload for r in runs]
        sec.missing += [f"data/theory/{self.model}/{self.device}/{w}.json" for w in workloads
                        if (self.model, self.device, w) not in self.i.theory]
        present = [w for w in workloads if (self.model, self.device, w) in self.i.theory]
        if not present:
            if not workloads:
                sec.notes.append("No SpecFit run with exact routes at the main slot count: nothing to evaluate.")
            return sec
        paper = self.i.paper["theory"] if paper_device(self.spec, self.device) == "a100" else {}
        header = ["Quantity"]
        for w in present:
            header += [w] + (["paper"] if w in paper else [])
        rows = []
        for row in THEORY:
            cells = [row.label]
            for w in present:
                data = self.i.theory[self.model, self.device, w]
                cells.append(" / ".join(fmt(data[k], row.fmt) for k in row.keys))
                if w in paper:
                    value = None if row.paper is None else paper[w][row.paper]
                    cells.append(" / ".join(fmt(value[k], row.fmt) for k in PAPER_PAIR) if isinstance(value, dict)
                                 else fmt(value, row.fmt))
            rows.append(cells)
        sec.tables.append(Table(f"Theory on the pools SpecFit recorded with the cache ({self.main} slots), "
                                f"{self.model} / {self.device}, with the with-cache coefficients", header, rows))
        sec.notes.append("Percentages of λ* refer to the predicted throughput."
                         + (" Paper: Table 5 (A100)." if paper else ""))
        return sec

    # 6. Appendix B
    def calibration(self) -> Section:
        sec = Section("Calibration fit T(S) = b_|S| + β F(S) (Appendix B)")
        pd_name = paper_device(self.spec, self.device)
        paper = self.i.paper["coefficients_ms"][pd_name]
        fits = {}
        for mode in ("cache", "nocache"):
            key = (self.model, self.device, mode)
            if key in self.i.calibration:
                fits[mode] = self.i.calibration[key]
            else:
                sec.missing.append(f"data/calibration/{self.model}/{self.device}/{mode}.json")
        if not fits:
            return sec
        names = {"cache": "With cache", "nocache": "Without cache"}
        header = ["Coefficient"] + [tagged(f"{names[mode]} ({fit['slots']} slots)", fit["link_emulated"])
                                    for mode, fit in fits.items()]
        header += [f"Paper {pd_name}, with cache", f"Paper {pd_name}, without cache"]
        paper_fits = [paper["cache"], paper["no_cache"]]
        n_b = max(len(f["b"]) for f in fits.values())
        rows = []
        for k in range(n_b):
            rows.append([f"b_{k} (ms)"] + [fmt(f["b"][k], ".3f") if k < len(f["b"]) else MISSING for f in fits.values()]
                        + [fmt(p["b"][k], ".3f") if k < len(p["b"]) else MISSING for p in paper_fits])
        rows.append(["β (ms per expert)"] + [fmt(f["beta"], ".4f") for f in fits.values()]
                    + [fmt(p["beta"], ".4f") for p in paper_fits])
        rows.append(["R²"] + [fmt(f["r2"], ".4f") for f in fits.values()] + [MISSING] * 2)
        rows.append(["RMSE (ms)"] + [fmt(f["rmse_ms"], ".2f") for f in fits.values()] + [MISSING] * 2)
        rows.append(["Points"] + [fmt(f["n_points"], "d") for f in fits.values()] + ["144"] * 2)
        rows.append(["Source"] + [str(f["source"]) for f in fits.values()] + ["paper"] * 2)
        emulated = any(f["link_emulated"] for f in fits.values())
        sec.tables.append(Table(tagged(f"Cost coefficients, {self.model} / {self.device}", emulated), header, rows))
        frames = {mode: self.i.points[self.model, self.device, mode] for mode in fits
                  if (self.model, self.device, mode) in self.i.points}
        sec.missing += [f"data/calibration/{self.model}/{self.device}/{mode}.points.parquet" for mode in fits
                        if mode not in frames and fits[mode]["source"] == "fit"]
        if frames:
            fig, ax = plt.subplots(figsize=(5, 4.2))
            lo = min(min(f["y_ms"].min(), f["pred_ms"].min()) for f in frames.values())
            hi = max(max(f["y_ms"].max(), f["pred_ms"].max()) for f in frames.values())
            ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--", label="y = prediction")
            for j, (mode, frame) in enumerate(frames.items()):
                ax.scatter(frame["pred_ms"], frame["y_ms"], s=12, color=f"C{j}", alpha=0.7, label=names[mode])
            ax.set_xlabel("Predicted cycle time (ms)")
            ax.set_ylabel("Measured cycle time (ms)")
            ax.set_title(tagged(f"{self.model} / {self.device}: calibration probes", emulated), fontsize=9)
            ax.legend(fontsize=8)
            sec.figures.append(self.figures.save(fig, slug(self.model, self.device, "calibration"),
                                                 tagged(f"Calibration, {self.model} / {self.device}: measured vs "
                                                        "predicted cycle time", emulated)))
        return sec

    # 7. section 4.6, selection cost
    def selection_cost(self) -> Section:
        sec = Section("Selection cost (section 4.6)")
        paper = self.i.paper["selection_cost"] if paper_device(self.spec, self.device) == "a100" else None
        rows = []
        emulated = False
        for w in self.workloads:
            for r in self.runs_of(w):
                if method_rule(self.spec, r.method) != "specfit":
                    continue
                if r not in self.i.metrics:
                    sec.missing += self.i.missing([r])
                    continue
                m = self.i.metrics[r]
                emulated |= bool(m[LINK_EMULATED])
                is_main = r.method == self.roles.specfit and r.slots == self.main and paper is not None
                rows.append([w, r.method, cache_cell(r.slots), fmt(m["select_ms_median"], ".2f"),
                             fmt(m["select_share_pct"], ".2f"),
                             fmt(paper["median_ms_per_cycle"].get(w), ".2f") if is_main else MISSING,
                             fmt(paper["share_of_decode_time_pct"].get(w), ".1f") if is_main else MISSING])
        if rows:
            sec.tables.append(Table(tagged("Selector time per cycle, included in every measured throughput", emulated),
                                    ["Workload", "Method", "Cache", column("select_ms_median", emulated),
                                     column("select_share_pct", emulated), "Paper median ms (A100)",
                                     "Paper share (%)"], rows))
        return sec

    # 8. section 4.6, noisy routes
    def noisy_routes(self) -> Section:
        sec = Section("Sensitivity to route-prediction errors (section 4.6)")
        paper = self.i.paper["route_prediction"]
        on_a100 = paper_device(self.spec, self.device) == "a100"
        for w in self.workloads:
            noisy = [r for r in self.runs_of(w) if r.method in self.roles.noisy]
            if not noisy:
                continue
            ar = self.ar_nocache(w)
            if self.ar_nocache_tps(w) is None:
                sec.missing += self.i.missing([DecodeRun(self.model, self.device, w, self.roles.ar or "ar", 0)])
            rows, runs = [], []
            for r in noisy:
                accuracy = self.spec["methods"][r.method].get("accuracy", 0.6)
                pairs = [(r, f"noisy, accuracy {accuracy}", paper["simulated_60pct_speedup"])]
                if self.roles.specfit:
                    exact = DecodeRun(self.model, self.device, w, self.roles.specfit, r.slots)
                    pairs.insert(0, (exact, "exact (atlas)", paper["exact_routes_speedup"]))
                for run, kind, paper_x in pairs:
                    if run not in self.runs:
                        continue
                    runs.append(run)
                    sec.missing += self.i.missing([run])
                    shown = on_a100 and run.slots == self.main
                    rows.append([run.method, kind, cache_cell(run.slots), tps_cell(self.i.tps(run)),
                                 x_cell(self.i.speedup(run, ar)), x_fmt(paper_x) if shown else MISSING])
            if not any(r in self.i.metrics for r in runs):
                continue
            sec.missing += self.i.missing_requests([*runs, ar])
            emulated = self.emulated(runs)
            sec.tables.append(Table(tagged(f"Exact vs noisy routes, {self.workload_title(w)}", emulated),
                                    ["Method", "Routes", "Cache", column("tps_dec", emulated),
                                     tagged("Speedup over AR without cache", emulated),
                                     "Paper speedup (GSM8K, A100; noisy: 60% accuracy)"],
                                    rows))
        if not self.roles.noisy:
            sec.notes.append("No method with noisy routes is configured.")
        if sec.tables:
            sec.notes.append(interval_note(self.i.seed))
        return sec

    # 9. lossless check
    def lossless(self) -> Section:
        sec = Section("Lossless check: outputs identical to the AR reference")
        rows, divergences = [], []
        for w in self.workloads:
            runs = self.runs_of(w)
            sec.missing += self.i.missing(runs)
            for r in runs:
                if r not in self.i.metrics:
                    continue
                m = self.i.metrics[r]
                check = m[LOSSLESS]
                common = [w, r.method, cache_cell(r.slots), fmt(m["n_requests"], "d"), fmt(m["n_output_tokens"], "d"),
                          str(m[TIMING_LABEL]), "yes" if m.get(RESUMED) else "no"]
                if check is None:
                    rows.append(common + ["(this run is the reference)", MISSING, MISSING])
                    continue
                divs = check.get("divergences") or []
                rows.append(common + [str(check["reference"]), f"{check['n_identical']}/{check['n_requests']}",
                                      str(len(divs))])
                for d in divs:
                    divergences.append([w, r.method, cache_cell(r.slots), str(d["request_id"]), str(d["position"]),
                                        fmt(d["margin"], ".4g")])
        if rows:
            sec.tables.append(Table("Lossless check per run", ["Workload", "Method", "Cache", "Requests",
                                                                "Output tokens", "Timing", "Resumed", "Reference",
                                                                "Identical requests", "Divergences"], rows))
        if divergences:
            sec.tables.append(Table("Every divergence: first differing output position and the target's top-2 logit "
                                    "margin there (a small margin points to a numerical tie, not a bug)",
                                    ["Workload", "Method", "Cache", "Request", "Position", "Top-2 margin"],
                                    divergences))
        elif rows:
            sec.notes.append("No divergences: every checked request matches its reference token for token.")
        return sec


# ------------------------------------------------------------------------------------ per model
def cells(get, roles: Roles, main: int) -> dict:
    """(method rule, cache mode) -> metrics dict, for the paper's three methods at the main slots and at 0."""
    out = {}
    for rule, method in (("ar", roles.ar), ("eagle3", roles.eagle3), ("specfit", roles.specfit)):
        for mode, slots in (("cache", main), ("nocache", 0)):
            out[rule, mode] = get(rule, method, mode, slots)
    return out


def paper_cells(paper: dict, device: str, workload: str) -> dict | None:
    """The paper's figures for one GPU and workload, under metrics.json keys."""
    tps = paper["decode_tps"].get(device, {}).get(workload)
    counters = paper["counters"].get(device, {}).get(workload)
    if tps is None:
        return None
    out = {}
    for rule in ("ar", "eagle3", "specfit"):
        for mode, paper_mode in PAPER_CACHE.items():
            row = {"tps_dec": tps[rule][paper_mode]}
            if counters is not None:
                row.update({PAPER_COUNTERS[k]: v for k, v in counters[rule][paper_mode].items()})
            out[rule, mode] = row
    return out


def headline(c: dict, tps_ratio=None) -> list[tuple[str, str, float | dict | None, str]]:
    """The paper's headline ratios from (rule, cache mode) cells; the same code reads paper and run.

    Each entry: label, the key of the paper's text claim (paper_results.yaml ``text_claims``), value, format.
    ``tps_ratio(cell, cell)``, where given, gives the ratio of two cells' decode TPS as an estimate with its
    interval (a run's); without it the ratio is a plain number (the paper's).
    """

    def v(rule, mode, key):
        cell = c.get((rule, mode))
        return None if cell is None else cell.get(key)

    def tps(a, b):
        if tps_ratio is not None:
            return tps_ratio(a, b)
        return ratio(v(*a, "tps_dec"), v(*b, "tps_dec"))

    def pct(a, b):
        r = tps(a, b)
        if isinstance(r, dict):
            return as_pct(r)
        return None if r is None else 100.0 * (r - 1.0)

    return [
        ("SpecFit over cached EAGLE-3 (%)", "vs_cached_eagle3_pct",
         pct(("specfit", "cache"), ("eagle3", "cache")), ".1f"),
        ("SpecFit over vanilla EAGLE-3, no cache (%)", "vs_vanilla_eagle3_no_cache_pct",
         pct(("specfit", "nocache"), ("eagle3", "nocache")), ".1f"),
        ("SpecFit (cache) over AR without cache (×)", "vs_ar_x", tps(("specfit", "cache"), ("ar", "nocache")), ".2f"),
        ("Vanilla EAGLE-3 over AR without cache (×)", "vanilla_eagle3_vs_ar_x",
         tps(("eagle3", "nocache"), ("ar", "nocache")), ".2f"),
        ("SpecFit commits fewer tokens per cycle than cached EAGLE-3 (%)", "fewer_committed_pct",
         pct_less(v("specfit", "cache", "committed_per_cycle"), v("eagle3", "cache", "committed_per_cycle")), ".1f"),
        ("SpecFit cycle shorter than cached EAGLE-3 (%)", "shorter_cycle_pct",
         pct_less(v("specfit", "cache", "ms_per_cycle"), v("eagle3", "cache", "ms_per_cycle")), ".1f"),
        ("SpecFit fewer H2D/token than cached EAGLE-3 (%)", "fewer_h2d_per_token_pct",
         pct_less(v("specfit", "cache", "h2d_per_token"), v("eagle3", "cache", "h2d_per_token")), ".1f"),
        ("SpecFit drafting time per cycle cut vs cached EAGLE-3 (%)", "drafting_time_cut_pct",
         pct_less(v("specfit", "cache", "draft_ms_per_cycle"), v("eagle3", "cache", "draft_ms_per_cycle")), ".1f"),
    ]


class ModelView:
    def __init__(self, inputs: Inputs, figures: Figures, model: str):
        self.i, self.figures, self.model, self.spec = inputs, figures, model, inputs.spec
        self.roles = Roles.of(self.spec)
        devices = [d for d in self.spec["devices"] if any(r.model == model and r.device == d for r in inputs.runs)]
        self.devices = sorted(devices, key=lambda d: PAPER_DEVICES.index(paper_device(self.spec, d)))

    def run_cells(self, device: str, workload: str) -> dict:
        def get(rule, method, mode, slots):
            return None if method is None else self.i.run(self.model, device, workload, method, slots)

        return cells(get, self.roles, main_slots(self.spec, self.model, device))

    def run_keys(self, device: str, workload: str) -> dict:
        """(method rule, cache mode) -> the DecodeRun behind `run_cells`' entry (None: no such method)."""
        def get(rule, method, mode, slots):
            return None if method is None else DecodeRun(self.model, device, workload, method, slots)

        return cells(get, self.roles, main_slots(self.spec, self.model, device))

    def emulated(self, device) -> bool:
        return any(m[LINK_EMULATED] for r, m in self.i.metrics.items() if (r.model, r.device) == (self.model, device))

    # 4. Table 4
    def devices_side_by_side(self) -> Section | None:
        if len(self.devices) < 2:
            return None
        sec = Section("Devices side by side (Table 4 style)")
        keys = ("tps_dec", "draft_nodes_per_cycle", "committed_per_cycle", "cycles", "ms_per_cycle", "h2d_per_token")
        for w in self.spec["workloads"]:
            devices = [d for d in self.devices if any(r.model == self.model and r.device == d and r.workload == w
                                                      for r in self.i.runs)]
            if len(devices) < 2:
                continue
            emulated = any(self.emulated(d) for d in devices)
            rows = []
            for d in devices:
                c, key = self.run_cells(d, w), self.run_keys(d, w)
                for mode in ("nocache", "cache"):
                    for rule in ("ar", "eagle3", "specfit"):
                        m = c[rule, mode]
                        if m is None:
                            continue
                        sec.missing += self.i.missing_requests([key[rule, mode], key["ar", "nocache"]])
                        slots = main_slots(self.spec, self.model, d) if mode == "cache" else 0
                        rows.append([d, rule, cache_cell(slots), tps_cell(self.i.tps(key[rule, mode])),
                                     x_cell(self.i.speedup(key[rule, mode], key["ar", "nocache"]))]
                                    + [MISSING if rule == "ar" and k in DRAFT_KEYS
                                       else fmt(m[k], METRICS[k].fmt) for k in keys[1:]])
            if not rows:
                continue
            header = ["Device", "Method", "Cache", column("tps_dec", emulated),
                      tagged("Speedup over AR without cache", emulated)]
            sec.tables.append(Table(tagged(f"{w} on every device", emulated),
                                    header + [column(k, emulated) for k in keys[1:]], rows))
        if not sec.tables:
            sec.notes.append("No workload runs on more than one device.")
        else:
            sec.missing = list(dict.fromkeys(sec.missing))
            sec.notes.append(interval_note(self.i.seed))
        return sec

    # 10. paper vs this run
    def paper_comparison(self) -> Section:
        sec = Section("The paper's headline figures beside this run's")
        sec.notes.append(
            "This run is a miniature (a toy target and drafter, a workload subset, and, on CPU, an emulated host "
            "link), "
            "so absolute throughputs, cycle times and transfer counts differ from the paper's by orders of magnitude. "
            "Compare ratios: speedups over AR without the cache and gains over cached EAGLE-3.")
        sec.notes.append("Paper ratios are the ones its text states where it states them, else computed from "
                         "its tables.")
        mapping = ", ".join(f"{d} ↔ {self.i.paper['setup']['devices'][paper_device(self.spec, d)]['name']}"
                            for d in self.devices)
        sec.notes.append(f"Devices are mapped by name, label or order: {mapping}.")
        for d in self.devices:
            pd_name = paper_device(self.spec, d)
            emulated = self.emulated(d)
            for w in self.spec["workloads"]:
                paper = paper_cells(self.i.paper, pd_name, w)
                if paper is None or not any(r.model == self.model and r.device == d and r.workload == w
                                            for r in self.i.runs):
                    continue
                run, key = self.run_cells(d, w), self.run_keys(d, w)
                sec.missing += self.i.missing_requests(key.values())
                paper_ar = paper["ar", "nocache"]["tps_dec"]
                rows = []
                for mode in ("nocache", "cache"):
                    for rule in ("ar", "eagle3", "specfit"):
                        p, r = paper[rule, mode], run[rule, mode] or {}
                        rows.append([rule, "Yes" if mode == "cache" else "No",
                                     fmt(p["tps_dec"], ".2f"), tps_cell(self.i.tps(key[rule, mode])),
                                     x_fmt(ratio(p["tps_dec"], paper_ar)),
                                     x_cell(self.i.speedup(key[rule, mode], key["ar", "nocache"])),
                                     fmt(p.get("ms_per_cycle"), ".1f"), fmt(r.get("ms_per_cycle"), ".1f"),
                                     fmt(p.get("h2d_per_token"), ".1f"), fmt(r.get("h2d_per_token"), ".1f")])
                sec.tables.append(Table(
                    tagged(f"{d} vs paper {pd_name}, {w}", emulated),
                    ["Method", "Cache", "Paper Decode TPS", tagged("This run Decode TPS", emulated), "Paper speedup",
                     tagged("This run speedup", emulated), "Paper ms/cycle", tagged("This run ms/cycle", emulated),
                     "Paper H2D/token", "This run H2D/token"], rows))
                # the text's own figure where it states one (computed from rounded table values it can differ)
                claims = self.i.paper["text_claims"].get(w if pd_name == "a100" else f"{pd_name}_{w}", {})
                run_gains = headline(run, lambda a, b, key=key: self.i.speedup(key[a], key[b]))
                gains = [[label, fmt(claims.get(claim, p), spec), show(r, spec, "×" if label.endswith("(×)") else "")]
                         for (label, claim, p, spec), (*_, r, _) in zip(headline(paper), run_gains)]
                sec.tables.append(Table(tagged(f"Headline ratios, {d} vs paper {pd_name}, {w}", emulated),
                                        ["Quantity", "Paper", tagged("This run", emulated)], gains))
        if sec.tables:
            sec.missing = list(dict.fromkeys(sec.missing))
            sec.notes.append(interval_note(self.i.seed) + " The paper's figures carry no interval.")
        return sec

    def parts(self) -> list[Part]:
        parts = []
        for d in self.devices:
            group = Group(self.i, self.figures, self.model, d)
            notes = [f"Main slot count (with-cache runs and fit): {group.main} per layer."]
            if self.emulated(d):
                notes.append(f"Timings on this device are taken over an {EMULATED}.")
            label = self.spec["devices"][d].get("label") or d
            parts.append(Part(f"{self.model} on {d}: {label}", notes, group.sections()))
        across = [s for s in (self.devices_side_by_side(), self.paper_comparison()) if s is not None]
        parts.append(Part(f"{self.model}: across devices and against the paper", [], across))
        return parts


# ------------------------------------------------------------------------------------ provenance and rendering
def config_hash(spec: dict) -> str:
    return hashlib.sha256(spec_json(spec).encode()).hexdigest()


def git_commit(root: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} (dirty tree)" if dirty else head


def versions() -> dict[str, str]:
    out = {}
    for name in VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def provenance(spec: dict, root: Path) -> list[tuple[str, str]]:
    rows = [("Config hash (sha256 of the spec, sorted keys)", config_hash(spec)), ("Git commit", git_commit(root))]
    rows += [(f"{name} version", v) for name, v in versions().items()]
    rows += [(f"Device {d}", d_spec.get("label") or d) for d, d_spec in spec["devices"].items()]
    rows += [(f"Workload {w}", w_spec.get("subset_label") or "full workload")
             for w, w_spec in spec["workloads"].items()]
    rows.append(("Seed", str(spec.get("seed", 0))))
    rows.append(("Date (UTC)", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")))
    return rows


def md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(context: dict, folder: Path) -> None:
    env = jinja2.Environment(loader=jinja2.PackageLoader("specfit", "templates"),
                             autoescape=lambda name: bool(name and name.endswith(".html.j2")),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = md_cell
    (folder / "index.html").write_text(env.get_template("report.html.j2").render(**context))
    (folder / "report.md").write_text(env.get_template("report.md.j2").render(**context))


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    root = Path(inputs["root"])
    data = load_inputs(spec, root)
    log.info("%d of %d decode runs have metrics", len(data.metrics), len(data.runs))
    with atomic_path(outputs["report"], directory=True) as folder:
        figures = Figures(folder / "figures")
        parts = [part for model in spec["models"] if any(r.model == model for r in data.runs)
                 for part in ModelView(data, figures, model).parts()]
        render({"title": "SpecFit reproduction report", "provenance": provenance(spec, root), "parts": parts,
                "emulated": EMULATED, "intervals": interval_note(data.seed)}, folder)


main = stage_main(run)

if __name__ == "__main__":
    main()
