"""What the report reads: the keys and columns of each input, and `Inputs`, the files the rule declares (a file the
report expects, named by `specfit.planning.paths`, that the rule does not declare or the disk lacks is missing,
and its section says so; one without the keys or columns below is an error), with their decode TPS's bootstrap
intervals."""

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from specfit.errors import SpecFitError
from specfit.paper import paper_results
from specfit.planning import paths
from specfit.planning.matrix import (
    DecodeRun,
    calibration_modes,
    decode_inputs,
    decode_runs,
    is_toy,
    levelled_runs,
    method_config,
    method_kind,
    theory_cost,
    theory_file,
    theory_runs,
)
from specfit.planning.stage import paths_of
from specfit.report.page import Estimate, est
from specfit.report.quantities import METRICS_REQUIRED, THEORY_CACHE_AWARE_REQUIRED, THEORY_REQUIRED
from specfit.results import intervals
from specfit.results.acceptance import LEVEL_COLUMNS, level_calibration
from specfit.speculative.kinds import routed

log = logging.getLogger("specfit.report")

# requests.parquet beside each metrics.json (specfit.speculative.request): the columns the intervals read
REQUEST_COLUMNS = ("request_id", "n_output", "t_request_s", "t_prefill_s")
TPS_MATCH_RTOL = 1e-6  # metrics.json's tps_dec (tps_req) and the one its requests.parquet gives must agree

# paths.calibration and paths.calibration_points (specfit.stages.calibrate)
CALIBRATION_REQUIRED = ("b", "beta", "source", "r2", "rmse_ms", "n_points", "slots", "link_emulated", "cache_aware",
                        "drafting")
# the cache-aware fit ("cache_aware", null for the paper's presets): the keys the report reads
CACHE_AWARE_REQUIRED = ("b", "beta_miss", "beta_hit", "beta_hit_identified", "r2", "rmse_ms", "n_points", "r2_means",
                        "rmse_means_ms", "n_probes")
POINTS_COLUMNS = ("k", "tree", "y_ms", "pred_ms")

# the route predictor (specfit.stages.predictor): its folder (paths.predictor, declared as a folder) holds this file
PREDICTOR_METRICS = "metrics.json"
PREDICTOR_REQUIRED = ("route_accuracy", "recall_per_layer", "root_accuracy", "train_accuracy", "chance_accuracy",
                      "train_requests", "validation_requests", "train_nodes", "validation_nodes", "hidden_size",
                      "num_layers", "num_experts", "top_k", "params", "flop_per_node", "us_per_pool",
                      "pool_nodes_timed", "torch_device", "training")


INPUT_NAMES = ("metrics", "requests", "calibration", "points", "theory", "predictor", "models", "tune",
               "cycles")  # list inputs
TOY_REQUIRED = ("sha256",)  # the toy's folders (declared as folders): the key their paths.TOY_RECORDS must have
TUNE_REQUIRED = ("chosen", "trees", "question_ids")  # a tune job's JSON (specfit.stages.tune)
SHIPPED_REQUIRED = ("commit", "cpu")  # the shipped toy's manifest (paths.SHIPPED_MANIFEST, specfit.models.shipped)


def _key(path: str) -> str:
    """A path as the report matches it: normalized, relative to the working directory (the workflow root)."""
    return os.path.normpath(os.path.relpath(path) if os.path.isabs(path) else path)


class Declared:
    """The files the rule declares, per input name (`INPUT_NAMES`), each as declared."""

    def __init__(self, inputs: dict):
        if unknown := sorted(set(inputs) - set(INPUT_NAMES)):
            log.warning("ignoring inputs the report does not read: %s", ", ".join(unknown))
        self.files = {name: {_key(p): p for p in paths_of(inputs, name)} for name in INPUT_NAMES}
        self.expected: set[tuple[str, str]] = set()

    def path(self, name: str, expected: str) -> str | None:
        """The declared path of an expected file (`specfit.planning.paths`), None when the rule does not declare it."""
        key = _key(expected)
        self.expected.add((name, key))
        return self.files[name].get(key)

    def unexpected(self) -> list[str]:
        """Declared files the report does not expect (the rule and the report disagree on a name)."""
        return [p for name, files in self.files.items() for key, p in files.items()
                if (name, key) not in self.expected]


def _load_json(path: str | None, required: tuple[str, ...]) -> dict | None:
    """A stage's JSON output, None when not declared or absent; an error without the keys the report reads."""
    if path is None or not Path(path).is_file():
        return None
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise SpecFitError(f"{path} is not valid JSON: {err}") from err
    if lacking := [k for k in required if not isinstance(data, dict) or k not in data]:
        raise SpecFitError(f"{path} lacks {', '.join(lacking)} (the report reads these keys)")
    return data


def _load_columns(path: str | None, columns: tuple[str, ...]):
    """A parquet file's ``columns`` (a table), None when not declared or absent; an error without them."""
    if path is None or not Path(path).is_file():
        return None
    table = pq.read_table(path)
    if lacking := [c for c in columns if c not in table.column_names]:
        raise SpecFitError(f"{path} lacks columns {', '.join(lacking)}")
    return table.select(list(columns))


@dataclass
class Inputs:
    spec: dict
    runs: list[DecodeRun]
    metrics: dict[DecodeRun, dict]  # present runs only
    calibration: dict[tuple[str, str, str], dict]  # (model, device, cache mode)
    points: dict[tuple[str, str, str], dict[str, np.ndarray]]  # column -> values
    theory: dict[DecodeRun, dict]  # by theory run (`specfit.planning.matrix.theory_runs`)
    paper: dict
    requests: dict[DecodeRun, list[dict]] = field(default_factory=dict)  # present runs only
    predictor: dict[str, dict] = field(default_factory=dict)  # model -> its learned route predictor's metrics.json
    toy: dict[tuple[str, str], dict] = field(default_factory=dict)  # (model, part) -> its training record
    shipped: dict[str, dict] = field(default_factory=dict)  # model -> the shipped toy's manifest (SHIPPED.json)
    tune: dict[DecodeRun, list[dict]] = field(default_factory=dict)  # a tuned run -> its tune jobs' JSON, by fold
    levels: dict[DecodeRun, dict] = field(default_factory=dict)  # a levelled run -> `level_calibration` of its cycles
    _intervals: dict = field(default_factory=dict, repr=False)

    @property
    def seed(self) -> int:
        return int(self.spec.get("seed", 0))

    def missing(self, runs: list[DecodeRun]) -> list[str]:
        return [r.file("metrics.json") for r in runs if r not in self.metrics]

    def missing_requests(self, runs) -> list[str]:
        """requests.parquet of runs that have metrics but no requests (their numbers show without an interval)."""
        return [r.file("requests.parquet") for r in runs if r in self.metrics and r not in self.requests]

    def tps(self, run: DecodeRun | None) -> Estimate | None:
        """A run's decode TPS (metrics.json) with its bootstrap interval over requests."""
        m = self.metrics.get(run)
        if m is None or m["tps_dec"] is None:
            return None
        if run not in self.requests:
            return est(m["tps_dec"])
        ci = self._interval(("tps", run), run.file("requests.parquet"),
                            lambda: intervals.tps_interval(self.requests[run], seed=self.seed))
        self._check_agrees(run, "tps_dec", ci["value"])
        return est(m["tps_dec"], ci)

    def speedup(self, num: DecodeRun | None, den: DecodeRun | None) -> Estimate | None:
        """TPS(num) / TPS(den) with a paired bootstrap interval over the request ids both runs hold."""
        return self.tps_ratio((num,), (den,))

    def request_speedup(self, num: DecodeRun | None, den: DecodeRun | None) -> Estimate | None:
        """TPS_req(num) / TPS_req(den), prefill included (Eq. 10), with the same paired bootstrap as `speedup`."""
        return self.tps_ratio((num,), (den,), "tps_req", whole_requests)

    def tps_ratio(self, num: tuple, den: tuple, key: str = "tps_dec", rows_of=lambda rows: rows) -> Estimate | None:
        """Π metrics.json ``key`` of the num runs over Π of the den runs (each its own decode job); the interval
        resamples ``rows_of(requests)`` (whose decode TPS, `specfit.results.intervals`, is that key) on the ids all of
        them hold, after checking each run's requests.parquet gives its metrics.json's, widened by the spread between
        their processes (`specfit.results.intervals.process_spread` per ratio of two jobs, in quadrature)."""
        runs, metrics = (*num, *den), self.metrics
        if any(r not in metrics for r in runs) or any(metrics[r][key] is None for r in num) \
                or not all(metrics[r][key] for r in den):
            return None
        if any(r not in self.requests for r in runs):
            return est(math.prod(metrics[r][key] for r in num) / math.prod(metrics[r][key] for r in den))
        rows = {r: rows_of(self.requests[r]) for r in runs}
        for r in runs:
            tokens, seconds = intervals.decode_sums(rows[r])  # [requests] each
            self._check_agrees(r, key, float(tokens.sum() / seconds.sum()))
        spread = intervals.process_spread(*(metrics[r] for r in runs)) * math.sqrt(len(runs) / 2)
        ci = self._interval((key, num, den), " over ".join(" * ".join(r.path for r in side) for side in (num, den)),
                            lambda: intervals.products_ratio_interval([rows[r] for r in num], [rows[r] for r in den],
                                                                      seed=self.seed, spread=spread))
        return est(ci["value"], ci)

    def _interval(self, key: tuple, where: str, compute) -> dict:
        """An interval computed once per report; a sample it cannot resample is an error about ``where``."""
        if key not in self._intervals:
            try:
                self._intervals[key] = compute()
            except ValueError as err:
                raise SpecFitError(f"{where}: {err}") from err
        return self._intervals[key]

    def _check_agrees(self, run: DecodeRun, key: str, value: float) -> None:
        """metrics.json's ``key`` is ``value``, what the run's requests.parquet gives; else they are not one run's."""
        if not math.isclose(value, self.metrics[run][key], rel_tol=TPS_MATCH_RTOL):
            raise SpecFitError(f"{run.path}: metrics.json has {key} {self.metrics[run][key]}, its requests.parquet "
                               f"gives {value}: the two files come from different runs")


def whole_requests(rows: list[dict]) -> list[dict]:
    """Requests as `specfit.results.intervals` reads them, for Eq. 10's TPS_req: its decode TPS counts n_output − 1
    tokens over t_request − t_prefill, so one more token and no prefill give n_output over t_request."""
    return [{"request_id": r["request_id"], "n_output": r["n_output"] + 1, "t_request_s": r["t_request_s"],
             "t_prefill_s": 0.0} for r in rows]


def predictor_metrics(model: str) -> str:
    """The metrics.json of a model's learned route predictor (in the folder the rule declares)."""
    return f"{paths.predictor(model)}/{PREDICTOR_METRICS}"


def methods_with(spec: dict, kinds: tuple[str, ...], routes: str | None = None) -> list[str]:
    """The config's methods whose kind is one of ``kinds`` and, if given, whose routes come from ``routes`` (atlas:
    exact; noisy: simulated; learned: a learned route predictor)."""
    return [m for m in spec["methods"] if method_kind(spec, m).name in kinds
            and (routes is None or method_config(spec, m).route_source.name == routes)]


def first_method(spec: dict, kind: str, routes: str | None = None) -> str | None:
    """The config's first method of ``kind`` (and ``routes``, if given; `methods_with`), None if it has none."""
    return next(iter(methods_with(spec, (kind,), routes)), None)


def learned_methods(spec: dict) -> list[str]:
    return methods_with(spec, routed(), "learned")


def load_inputs(spec: dict, inputs: dict) -> Inputs:
    """Every file the report expects for ``spec``, read when ``inputs`` declares it (`Declared`)."""
    files = Declared(inputs)
    runs = decode_runs(spec)
    metrics, requests, calibration, points, theory, predictor = {}, {}, {}, {}, {}, {}
    for r in runs:
        requests_path = files.path("requests", r.file("requests.parquet"))
        if (data := _load_json(files.path("metrics", r.file("metrics.json")), METRICS_REQUIRED)) is not None:
            metrics[r] = data
            if (table := _load_columns(requests_path, REQUEST_COLUMNS)) is not None:
                requests[r] = table.to_pylist()
    for model, device in sorted({(r.model, r.device) for r in runs}):
        for mode in calibration_modes(spec, device):
            path = paths.calibration(model, device, mode)
            if (data := _load_json(files.path("calibration", path), CALIBRATION_REQUIRED)) is not None:
                if lacking := [k for k in CACHE_AWARE_REQUIRED if data["cache_aware"] is not None
                               and k not in data["cache_aware"]]:
                    raise SpecFitError(f"{path}: cache_aware lacks {', '.join(lacking)} (the report reads these keys)")
                calibration[model, device, mode] = data
            table = _load_columns(files.path("points", paths.calibration_points(model, device, mode)), POINTS_COLUMNS)
            if table is not None:
                points[model, device, mode] = {c: table.column(c).to_numpy() for c in POINTS_COLUMNS}
    for r in theory_runs(spec):
        required = THEORY_REQUIRED if theory_cost(spec, r) == "paper" else THEORY_CACHE_AWARE_REQUIRED
        if (data := _load_json(files.path("theory", theory_file(spec, r)), required)) is not None:
            theory[r] = data
    learned = set(learned_methods(spec))
    for model in sorted({r.model for r in runs if r.method in learned}):
        folder = files.path("predictor", paths.predictor(model))
        if (data := _load_json(folder and f"{folder}/{PREDICTOR_METRICS}", PREDICTOR_REQUIRED)) is not None:
            predictor[model] = data
    toy, shipped = {}, {}
    for model in sorted({r.model for r in runs if is_toy(spec["models"][r.model])}):
        for part, record in paths.TOY_RECORDS.items():
            folder = files.path("models", paths.toy_model(model, part))
            if (data := _load_json(folder and f"{folder}/{record}", TOY_REQUIRED)) is not None:
                toy[model, part] = data
        if spec["models"][model].get("shipped"):
            manifest = _load_json(files.path("models", paths.SHIPPED_MANIFEST), SHIPPED_REQUIRED)
            if manifest is not None:
                shipped[model] = manifest
    tune = {}
    for r in runs:  # a tuned method's run reads its tune jobs' choices (a decode input; one per cross-fitted fold)
        if found := decode_inputs(spec, r).get("tune"):
            folds = [_load_json(files.path("tune", path), TUNE_REQUIRED) for path in found]
            if all(data is not None for data in folds):
                tune[r] = folds
    levels = {}
    for r in levelled_runs(spec):
        if (table := _load_columns(files.path("cycles", r.file("cycles.parquet")), LEVEL_COLUMNS)) is not None:
            levels[r] = level_calibration(table.to_pylist())
    if unexpected := files.unexpected():
        log.warning("%d declared inputs are not read: %s", len(unexpected), ", ".join(unexpected))
    return Inputs(spec, runs, metrics, calibration, points, theory, paper_results(), requests, predictor, toy,
                  shipped, tune, levels)
