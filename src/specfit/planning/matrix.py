"""The run matrix: the decode runs the config's `runs` list, the files each reads, the AR run each is checked
against, the theory runs of Table 5 and the files the report reads.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from specfit.errors import SpecFitError
from specfit.planning import paths
from specfit.speculative.config import MethodConfig
from specfit.speculative.kinds import PAPER, REFERENCE, Kind, kind
from specfit.speculative.sampling import Sampling, twin


def is_toy(entry: dict) -> bool:
    """Whether a model (its config entry) has a toy's folders (`specfit.planning.paths.toy_model`: a tokenizer
    folder beside target and drafter, and their training records): one the toy rules train (``toy: true``) or the
    shipped one."""
    return bool(entry.get("toy") or entry.get("shipped"))


def trained_toys(config: dict) -> list[str]:
    """The models the toy rules train (``toy: true``); the shipped toy is read as it is."""
    return [name for name, model in config["models"].items() if model.get("toy")]



@dataclass(frozen=True, order=True)
class DecodeRun:
    model: str
    device: str
    workload: str
    method: str
    slots: int

    @property
    def path(self) -> str:
        """The run's folder (`specfit.planning.paths.decode_dir`)."""
        return paths.decode_dir(self.model, self.device, self.workload, self.method, self.slots)

    def file(self, name: str) -> str:
        """One of the run's files: requests.parquet, cycles.parquet or metrics.json."""
        return paths.decode(self.model, self.device, self.workload, self.method, self.slots, name)

    @property
    def cache(self) -> str:
        return paths.cache_mode(self.slots)


def decode_runs(config: dict) -> list[DecodeRun]:
    runs = set()
    for block in config["runs"]:
        for combo in itertools.product(block["models"], block["devices"], block["workloads"], block["methods"],
                                       block["slots"]):
            runs.add(DecodeRun(*combo))
    return sorted(runs)


def method_kind(config: dict, method: str) -> Kind:
    """A method's kind (`specfit.speculative.kinds`): what it declares about drafting, routes, theory and roles."""
    return kind(config["methods"][method]["kind"])


def method_config(config: dict, method: str) -> MethodConfig:
    """A method entry with its defaults filled (`specfit.speculative.config.MethodConfig`)."""
    return MethodConfig.of_entry(config["methods"][method])


def workload_ids(config: dict, workload: str) -> list[int]:
    """The question ids a workload evaluates, in order: ids of its source's id field (Spec-Bench's question_id by
    default), or row positions when the source maps no id field."""
    return list(_id_range(config["workloads"][workload]["question_ids"]))


def evaluated_ids(config: dict, workload: str) -> list[int]:
    """The question ids a workload's runs decode: its ids, the first ``max_requests`` of them when it sets one."""
    return workload_ids(config, workload)[: config["workloads"][workload]["max_requests"] or None]


def tune_folds(config: dict, workload: str) -> int:
    """How many folds a tuned method's runs on ``workload`` are cross-fitted over (``tune_folds``); 0: none, the tree
    is chosen once on questions the workload does not evaluate."""
    return config["workloads"][workload].get("tune_folds") or 0


def fold_ids(config: dict, workload: str, fold: int) -> list[int]:
    """The evaluated questions of ``fold`` under cross-fitting: every ``tune_folds``-th from the fold's position,
    so each fold spans the workload."""
    return evaluated_ids(config, workload)[fold:: tune_folds(config, workload)]


def tune_question_ids(config: dict, workload: str, fold: int | None = None) -> list[int]:
    """The questions a tuned method's tree is chosen on (the tune rule), in order; the first ``tune.requests`` of:

    - under cross-fitting (``tune_folds``), for ``fold``: the evaluated questions of the other folds, so the questions
      fold ``fold`` decodes are never tuned on;
    - else the workload's ``tune_question_ids``, or its ids after the first ``max_requests`` (which it does not
      evaluate).
    """
    wl = config["workloads"][workload]
    if tune_folds(config, workload):
        if fold is None:
            raise SpecFitError(f"workload {workload!r} is cross-fitted over {tune_folds(config, workload)} folds: "
                               "name the fold whose tuning questions you want")
        held = set(fold_ids(config, workload, fold))
        ids = [i for i in evaluated_ids(config, workload) if i not in held]
    elif wl.get("tune_question_ids") is not None:
        ids = list(_id_range(wl["tune_question_ids"]))
    else:
        ids = workload_ids(config, workload)[wl["max_requests"]:] if wl["max_requests"] else []
    return ids[: config["tune"]["requests"]]


def tuned_slots(config: dict, model: str, device: str, workload: str, method: str) -> list[int]:
    """The slot counts a tuned method runs at in one cell (model, device, workload): one tune job per fold tunes its
    tree at each of them."""
    return sorted({r.slots for r in decode_runs(config)
                   if (r.model, r.device, r.workload, r.method) == (model, device, workload, method)})


def tune_parts(config: dict, workload: str) -> list[int | None]:
    """The tune jobs of one tuned run, by fold: ``[None]`` without cross-fitting, else ``[0, 1, ...]``."""
    return list(range(tune_folds(config, workload))) or [None]


def predictor_question_ids(config: dict) -> list[int]:
    """The Spec-Bench question ids the route predictor trains on, in order."""
    return [i for q in config["predictor"]["question_ids"] for i in _id_range(q)]


def _id_range(q: dict) -> range:
    """Ids ``start``, ``start + step``, ... up to ``stop`` inclusive (a config's question_ids range)."""
    return range(q["start"], q["stop"] + 1, q.get("step", 1))


def evaluated_question_ids(config: dict) -> list[int]:
    """Every Spec-Bench question id some workload evaluates (or tunes on) or calibration probes: the toy models never
    train on these. A workload whose ``source`` is another dataset evaluates no Spec-Bench question, so its ids (ids of
    that dataset) are left out (`specfit.questions.workload_source`)."""
    from specfit.questions import workload_source  # torch- and datasets-free; imported here, as only this needs it

    ids = set(config["calibration"]["question_ids"])
    for workload in config["workloads"]:
        if workload_source(config, workload) is None:
            ids.update(workload_ids(config, workload))
            if (tune := config["workloads"][workload].get("tune_question_ids")) is not None:
                ids.update(_id_range(tune))  # tuning questions are held out of training too
    return sorted(ids)


def decode_inputs(config: dict, run: DecodeRun) -> dict[str, str]:
    """The files a decode run reads, by the stage's input names (the decode rule's inputs): prompts,
    `method_inputs`, and for a method that selects by atlas routes its atlas."""
    inputs = {"prompts": paths.prompts(run.model, run.workload),
              **method_inputs(config, run.model, run.device, run.method, run.slots)}
    if method_kind(config, run.method).reads_routes and not method_config(config, run.method).route_source.learned:
        variant = paths.atlas_variant(run.method, run.slots)
        inputs["atlas"] = paths.atlas(run.model, run.device, run.workload, variant)
    if method_kind(config, run.method).tuned:
        inputs["tune"] = [paths.tune(run.model, run.device, run.workload, run.method, run.slots, fold)
                          for fold in tune_parts(config, run.workload)]
    return inputs


def method_inputs(config: dict, model: str, device: str, method: str, slots: int) -> dict[str, str]:
    """What a method decodes with, whatever the prompts (`specfit generate` reads these too): the checkpoints, for a
    method that selects by a fitted cycle time its coefficients and, with learned routes, its route predictor."""
    entry = config["models"][model]
    inputs = {"target": entry["target"]}
    k = method_kind(config, method)
    if k.drafts:
        inputs["drafter"] = entry["drafter"]
    if k.calibrated:
        inputs["coefficients"] = paths.calibration(model, device, paths.cache_mode(slots))
    if k.reads_routes:
        if method_config(config, method).route_source.learned:
            inputs["predictor"] = paths.predictor(model)
    return inputs


def reference_run(config: dict, run: DecodeRun) -> DecodeRun | None:
    """The AR run whose outputs a method's lossless check compares against (the smallest AR slot count): a run of
    the report's reference kind (`specfit.speculative.kinds.REFERENCE`)."""
    ars = [r for r in decode_runs(config) if (r.model, r.device, r.workload) == (run.model, run.device, run.workload)
           and REFERENCE in method_kind(config, r.method).roles]
    reference = min(ars, key=lambda r: r.slots, default=None)
    return None if reference == run else reference


def theory_runs(config: dict) -> list[DecodeRun]:
    """The pools of Table 5: per (model, device, workload), the run with the cache at the model's main slot count
    and exact routes of each kind with a theory cost (`specfit.speculative.kinds.Kind.theory_cost`: SpecFit the
    paper's, specfit-ca and specfit-prefetch the cache-aware cost), the first method of each kind where several are
    configured."""
    runs = {}
    for r in decode_runs(config):
        k = method_kind(config, r.method)
        if (k.theory_cost is not None and method_config(config, r.method).route_source.name == "atlas"
                and r.slots == config["models"][r.model]["main_slots"][r.device]):
            runs.setdefault((r.model, r.device, r.workload, k.name), r)
    return list(runs.values())


def theory_cost(config: dict, run: DecodeRun) -> str:
    """The cost model of a theory run's Table 5: "paper" or "cache_aware" (its kind's `theory_cost`)."""
    return method_kind(config, run.method).theory_cost


def theory_file(config: dict, run: DecodeRun) -> str:
    """A theory run's Table 5 (`specfit.planning.paths.theory`): under the paper's cost the workload's file, under
    another the method's beside it."""
    method = None if theory_cost(config, run) == PAPER else run.method
    return paths.theory(run.model, run.device, run.workload, method)


def calibration_modes(config: dict, device: str) -> tuple[str, ...]:
    """The cache modes a device is calibrated in (`specfit.planning.paths.CACHE_MODES`): a resident device holds
    every expert, so it has no run without the cache and no such fit."""
    return ("cache",) if config["devices"][device].get("resident") is not None else paths.CACHE_MODES


def report_inputs(config: dict) -> dict[str, list[str]]:
    """Every file the report reads (the report rule's inputs, by the stage's input names): each run's metrics and
    requests, the fits and their points, the theory, the toy pair's folders (the report shows the
    sha256 of their training records) with the shipped toy's manifest (and the commit and CPU it names), the
    learned route predictors decode runs read (folders: the report reads their metrics.json), the tuned methods'
    trees, and the cycles of every drafting run of a sampled workload and of its greedy twin (commit probabilities
    against acceptance per level, `levelled_runs`)."""
    runs = decode_runs(config)
    pairs = sorted({(r.model, r.device) for r in runs})
    toys = [m for m in sorted({r.model for r in runs}) if is_toy(config["models"][m])]
    return {
        "metrics": [r.file("metrics.json") for r in runs],
        "requests": [r.file("requests.parquet") for r in runs],
        "calibration": [paths.calibration(m, d, c) for m, d in pairs for c in calibration_modes(config, d)],
        "points": [paths.calibration_points(m, d, c) for m, d in pairs for c in calibration_modes(config, d)],
        "theory": sorted({theory_file(config, r) for r in theory_runs(config)}),
        "models": [*(paths.toy_model(m, part) for m in toys for part in paths.TOY_RECORDS),
                   *(paths.SHIPPED_MANIFEST for m in toys if config["models"][m].get("shipped"))],
        "predictor": sorted({p for r in runs if (p := decode_inputs(config, r).get("predictor"))}),
        "tune": sorted({p for r in runs for p in decode_inputs(config, r).get("tune", [])}),
        "cycles": [r.file("cycles.parquet") for r in levelled_runs(config)],
    }


def levelled_runs(config: dict) -> list[DecodeRun]:
    """The runs whose commit probabilities the report sets against acceptance per level: those that draft, of the
    sampled workloads and their greedy twins (`specfit.speculative.sampling.twin`); none in a greedy config."""
    sampled = [w for w, entry in config["workloads"].items() if not Sampling.of(entry).greedy]
    workloads = {*sampled, *(twin(config["workloads"], w, 0.0, "coupled") for w in sampled)} - {None}
    return [r for r in decode_runs(config) if r.workload in workloads and method_kind(config, r.method).drafts]


