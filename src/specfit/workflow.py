"""What the Snakefile needs from the package: config validation, the decode matrix, per-rule config
slices and code hashes. Kept free of torch so that ``snakemake -n`` stays fast.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import itertools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from specfit import paths
from specfit.errors import SpecFitError
from specfit.speculative.config import ROUTED_RULES, MethodConfig

PACKAGE_DIR = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------- validation
def _with_defaults(validator_class):
    """A jsonschema validator that fills ``default`` values in as it validates, as snakemake's validate does."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _key(path: Iterable[Any]) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _describe(error: jsonschema.ValidationError) -> str:
    where = _key(error.absolute_path)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        allowed = ", ".join(sorted(error.schema.get("properties", {}))) or "(see the schema)"
        return (f"config key {_key([*error.absolute_path, extra[0]])!r} is not allowed here; "
                f"allowed keys under {where}: {allowed}")
    if error.validator == "required":
        return f"config key {where!r} is missing {error.message.split(' is a required')[0]}"
    if error.validator == "not":  # a combination the schema forbids, described on its `not` clause
        what = error.schema["not"].get("description", "a combination the schema forbids").rstrip(".")
        return f"config key {where!r}: {what}, which is not allowed ({error.schema.get('description', '').strip()})"
    if error.validator == "oneOf" and error.context:
        # "null, or a mapping" (`link`, `emulate`): name what is wrong inside the mapping, not that no branch matched
        return _describe(max(error.context, key=lambda e: (len(e.absolute_path), e.validator != "type")))
    expected = error.schema.get("description", "")
    return f"config key {where!r}: {error.message}" + (f" (expected: {expected})" if expected else "")


def validate_config(config: dict, schema_path: str | Path, root: str | Path | None = ".") -> dict:
    """Validate ``config`` in place against the schema, fill defaults, check cross references; return it.

    ``root``: the workflow root (Snakemake's working directory), where the files a config must find at load are
    looked for (`check_shipped`: the shipped toy's manifest); None checks no file.
    A config that does not follow the schema or names something it does not define raises `SpecFitError`."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = _with_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise SpecFitError("invalid config:\n  " + "\n  ".join(_describe(e) for e in errors))
    _check_references(config)
    if root is not None:
        check_shipped(config, Path(root))
    return config


SCHEMA = "workflow/schemas/config.schema.yaml"  # relative to the workflow root, as the Snakefile finds it


def load_config(path: str | Path = "config.yaml", schema: str | Path = SCHEMA, *overlays: str | Path,
                check_files: bool = True) -> dict:
    """A config file with ``overlays`` merged over it as Snakemake's ``--configfile`` merges them (nested mappings
    update, anything else is replaced), validated and with its defaults filled, as the workflow sees it (for
    benchmarks and tools run from the workflow root). The config file's folder is the workflow root, where
    ``check_files`` looks for the files the config must find at load (`validate_config`)."""
    from snakemake.utils import update_config  # the merge --configfile does; imported here, as only this needs it

    config = yaml.safe_load(Path(path).read_text())
    for overlay in overlays:
        update_config(config, yaml.safe_load(Path(overlay).read_text()))
    return validate_config(config, schema, Path(path).parent if check_files else None)


def _check_references(config: dict) -> None:
    problems = []
    for i, run in enumerate(config["runs"]):
        for field in ("models", "devices", "workloads", "methods"):
            for name in run[field]:
                if name not in config[field]:
                    problems.append(
                        f"config key 'runs.{i}.{field}' names {name!r}, which is not defined under "
                        f"'{field}' (defined: {', '.join(config[field])})"
                    )
    problems += _check_toys(config)
    for run in config["runs"]:
        for model, device in itertools.product(run["models"], run["devices"]):
            if device not in config["models"].get(model, {}).get("main_slots", {device: 0}):
                problems.append(
                    f"config key 'models.{model}.main_slots' has no entry for device {device!r} "
                    "(the slots of its with-cache calibration)"
                )
    for block in config["runs"]:
        for method, device in itertools.product(block["methods"], block["devices"]):
            if method not in config["methods"] or device not in config["devices"]:
                continue
            if config["methods"][method]["rule"] in ROUTED_RULES:
                k_max = method_config(config, method).k_max
                fit = config["devices"][device]["coefficients"] == "fit"
                sizes = config["calibration"]["sizes"] if fit else 8  # the paper's presets: b_0..b_7
                if k_max + 1 > sizes:
                    problems.append(
                        f"config key 'methods.{method}.k_max' is {k_max}, but device {device!r} has intercepts "
                        f"b_0..b_{sizes - 1} only ({'calibration.sizes' if fit else 'the paper preset'}): "
                        f"{'set calibration.sizes to at least k_max + 1' if fit else 'use k_max <= 7'}"
                    )
    for name, device in config["devices"].items():
        if device["emulate"] is None:
            continue
        if device["torch_device"] != "cpu":
            problems.append(f"config key 'devices.{name}.emulate' emulates a GPU on a {device['torch_device']} device: "
                            "emulation is for CPU-only machines; drop it on a GPU, whose timings are measured")
        if device["link"] is not None:
            problems.append(f"config key 'devices.{name}.emulate' comes with 'devices.{name}.link': an emulated device "
                            "models its own link (copy_ms); drop the link")
    overlap = sorted(set(predictor_question_ids(config)) & set(evaluated_question_ids(config)))
    if overlap:
        problems.append(f"config key 'predictor.question_ids' holds questions a workload evaluates or calibration "
                        f"probes ({', '.join(map(str, overlap[:8]))}{', ...' if len(overlap) > 8 else ''}): the route "
                        "predictor must train on other questions")
    if config["predictor"]["method"] not in config["methods"]:
        problems.append(f"config key 'predictor.method' names {config['predictor']['method']!r}, which is not defined "
                        "under 'methods'")
    if problems:
        raise SpecFitError("invalid config:\n  " + "\n  ".join(sorted(set(problems))))


def _check_toys(config: dict) -> list[str]:
    """A toy the rules train (``toy: true``) lives in its own name's folders, never the shipped toy's; the shipped toy
    (``shipped: true``) is the model named `paths.SHIPPED_TOY`, read from its folders; no model is both."""
    problems = []
    shipped_folders = {part: paths.toy_model(paths.SHIPPED_TOY, part) for part in ("target", "drafter")}
    for name, model in config["models"].items():
        folders = {part: os.path.normpath(model[part]) for part in ("target", "drafter")}
        if model["toy"] and model["shipped"]:
            problems.append(f"config key 'models.{name}': `toy: true` (the toy rules train it) and `shipped: true` "
                            "(the toy the repository ships) exclude each other")
        elif model["toy"]:
            for part, folder in folders.items():
                if folder != paths.toy_model(name, part):
                    problems.append(f"config key 'models.{name}.{part}': a toy model is built at "
                                    f"{paths.toy_model(name, part)!r}")
            if name == paths.SHIPPED_TOY:  # its folders, checked above, are then the shipped toy's
                problems.append(f"config key 'models.{name}.toy': a toy to train named {name!r}, whose folders are "
                                f"the shipped toy's ({paths.toy_dir(paths.SHIPPED_TOY)}/): training would "
                                "overwrite it; pick another model name for a toy of your own (docs/toy.md)")
        elif model["shipped"]:
            if name != paths.SHIPPED_TOY:
                problems.append(f"config key 'models.{name}.shipped': the shipped toy is the model named "
                                f"{paths.SHIPPED_TOY!r}; name it so, or set `toy: true` to train a toy named {name!r}")
            for part, folder in shipped_folders.items():
                if folders[part] != folder:
                    problems.append(f"config key 'models.{name}.{part}': the shipped toy's {part} is {folder!r}")
    return problems


def check_shipped(config: dict, root: Path, models: Iterable[str] | None = None) -> None:
    """The files a config must find before any job: the shipped toy's manifest, for ``models`` (default: every model
    of the config) that are the shipped toy. Its folders are plain inputs, which Snakemake checks, and the manifest
    checks their contents when a stage loads them."""
    manifest = root / paths.SHIPPED_MANIFEST
    problems = [f"config key 'models.{name}.shipped': the shipped toy's manifest {manifest} is missing: restore the "
                f"shipped toy with `git checkout -- {manifest.parent}` (docs/toy.md)"
                for name in (config["models"] if models is None else models)
                if config["models"][name]["shipped"] and not manifest.is_file()]
    if problems:
        raise SpecFitError("invalid config:\n  " + "\n  ".join(problems))


def is_toy(entry: dict) -> bool:
    """Whether a model (its config entry) has a toy's folders (`specfit.paths.toy_model`: a tokenizer folder beside
    target and drafter, and their training records): one the toy rules train (``toy: true``) or the shipped one."""
    return bool(entry.get("toy") or entry.get("shipped"))


def trained_toys(config: dict) -> list[str]:
    """The models the toy rules train (``toy: true``); the shipped toy is read as it is."""
    return [name for name, model in config["models"].items() if model.get("toy")]


# --------------------------------------------------------------------------------------------- the matrix
@dataclass(frozen=True, order=True)
class DecodeRun:
    model: str
    device: str
    workload: str
    method: str
    slots: int

    @property
    def path(self) -> str:
        """The run's folder (`specfit.paths.decode_dir`)."""
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


def method_rule(config: dict, method: str) -> str:
    return config["methods"][method]["rule"]


def method_config(config: dict, method: str) -> MethodConfig:
    """A method entry with its defaults filled (`specfit.speculative.config.MethodConfig`)."""
    return MethodConfig.of_entry(config["methods"][method])


def workload_ids(config: dict, workload: str) -> list[int]:
    """The question ids a workload evaluates, in order: ids of its source's id field (Spec-Bench's question_id by
    default), or row positions when the source maps no id field."""
    return list(_id_range(config["workloads"][workload]["question_ids"]))


def predictor_question_ids(config: dict) -> list[int]:
    """The Spec-Bench question ids the route predictor trains on, in order."""
    return [i for q in config["predictor"]["question_ids"] for i in _id_range(q)]


def _id_range(q: dict) -> range:
    """Ids ``start``, ``start + step``, ... up to ``stop`` inclusive (a config's question_ids range)."""
    return range(q["start"], q["stop"] + 1, q.get("step", 1))


def evaluated_question_ids(config: dict) -> list[int]:
    """Every Spec-Bench question id some workload evaluates or calibration probes: the toy models never train on
    these. A workload whose ``source`` is another dataset evaluates no Spec-Bench question, so its ids (ids of
    that dataset) are left out (`specfit.questions.workload_source`)."""
    from specfit.questions import workload_source  # torch- and datasets-free; imported here, as only this needs it

    ids = set(config["calibration"]["question_ids"])
    for workload in config["workloads"]:
        if workload_source(config, workload) is None:
            ids.update(workload_ids(config, workload))
    return sorted(ids)


def decode_inputs(config: dict, run: DecodeRun) -> dict[str, str]:
    """The files a decode run reads, by the stage's input names (the decode rule's inputs): prompts,
    `method_inputs`, and for a method that selects by atlas routes its atlas."""
    inputs = {"prompts": paths.prompts(run.model, run.workload),
              **method_inputs(config, run.model, run.device, run.method, run.slots)}
    if method_rule(config, run.method) in ROUTED_RULES and not method_config(config, run.method).route_source.learned:
        variant = paths.atlas_variant(run.method, run.slots)
        inputs["atlas"] = paths.atlas(run.model, run.device, run.workload, variant)
    return inputs


def method_inputs(config: dict, model: str, device: str, method: str, slots: int) -> dict[str, str]:
    """What a method decodes with, whatever the prompts (`specfit generate` reads these too): the checkpoints, and
    for a method that selects by routes its coefficients and, with learned routes, its route predictor."""
    entry = config["models"][model]
    inputs = {"target": entry["target"]}
    kind = method_rule(config, method)
    if kind != "ar":
        inputs["drafter"] = entry["drafter"]
    if kind in ROUTED_RULES:
        inputs["coefficients"] = paths.calibration(model, device, paths.cache_mode(slots))
        if method_config(config, method).route_source.learned:
            inputs["predictor"] = paths.predictor(model)
    return inputs


def reference_run(config: dict, run: DecodeRun) -> DecodeRun | None:
    """The AR run whose outputs a method's lossless check compares against (the smallest AR slot count)."""
    ars = [r for r in decode_runs(config) if (r.model, r.device, r.workload) == (run.model, run.device, run.workload)
           and method_rule(config, r.method) == "ar"]
    reference = min(ars, key=lambda r: r.slots, default=None)
    return None if reference == run else reference


# The cost model each theory run's Table 5 is computed under (`specfit.theory`), by the rule of its method: the
# paper's for SpecFit, the cache-aware cost for specfit-ca and specfit-prefetch (beyond the paper; specfit-prefetch's
# cycles record the copies in flight as they selected, which that cost reads).
THEORY_COSTS = {"specfit": "paper", "specfit-ca": "cache_aware", "specfit-prefetch": "cache_aware"}


def theory_runs(config: dict) -> list[DecodeRun]:
    """The pools of Table 5: per (model, device, workload), the run with the cache at the model's main slot count
    and exact routes of SpecFit (the paper's cost), of specfit-ca and of specfit-prefetch (the cache-aware cost),
    the first method of each rule where several are configured."""
    runs = {}
    for r in decode_runs(config):
        if (method_rule(config, r.method) in THEORY_COSTS
                and method_config(config, r.method).route_source.name == "atlas"
                and r.slots == config["models"][r.model]["main_slots"][r.device]):
            runs.setdefault((r.model, r.device, r.workload, method_rule(config, r.method)), r)
    return list(runs.values())


def theory_cost(config: dict, run: DecodeRun) -> str:
    """The cost model of a theory run's Table 5: "paper" or "cache_aware" (`THEORY_COSTS`)."""
    return THEORY_COSTS[method_rule(config, run.method)]


def theory_file(config: dict, run: DecodeRun) -> str:
    """A theory run's Table 5 (`specfit.paths.theory`): under the paper's cost the workload's file, under another
    the method's beside it."""
    method = None if theory_cost(config, run) == "paper" else run.method
    return paths.theory(run.model, run.device, run.workload, method)


def report_inputs(config: dict) -> dict[str, list[str]]:
    """Every file the report reads (the report rule's inputs, by the stage's input names): each run's metrics and
    requests, the fits and their points, the theory, the toy pair's folders (the report shows the
    sha256 of their training records) with the shipped toy's manifest (and the commit and CPU it names), and the
    learned route predictors decode runs read (folders: the report reads their metrics.json)."""
    runs = decode_runs(config)
    pairs = sorted({(r.model, r.device) for r in runs})
    toys = [m for m in sorted({r.model for r in runs}) if is_toy(config["models"][m])]
    return {
        "metrics": [r.file("metrics.json") for r in runs],
        "requests": [r.file("requests.parquet") for r in runs],
        "calibration": [paths.calibration(m, d, c) for m, d in pairs for c in paths.CACHE_MODES],
        "points": [paths.calibration_points(m, d, c) for m, d in pairs for c in paths.CACHE_MODES],
        "theory": sorted({theory_file(config, r) for r in theory_runs(config)}),
        "models": [*(paths.toy_model(m, part) for m in toys for part in paths.TOY_RECORDS),
                   *(paths.SHIPPED_MANIFEST for m in toys if config["models"][m].get("shipped"))],
        "predictor": sorted({p for r in runs if (p := decode_inputs(config, r).get("predictor"))}),
    }


# --------------------------------------------------------------------------------------------- rule params
def spec_json(obj: Any) -> str:
    """A config slice as rule params: sorted keys, so equal slices compare equal across runs."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _module_file(module: str) -> Path | None:
    parts = module.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _specfit_imports(path: Path, module: str) -> set[str]:
    """The ``specfit`` modules ``module`` imports when it runs: its imports outside ``if TYPE_CHECKING:`` blocks,
    and the packages above each of them (Python runs a package's ``__init__`` before its submodules)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)  # type-only imports change no behaviour
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    parents = {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 1)}
    return {m for m in found | parents | {package} if m == "specfit" or m.startswith("specfit.")}


# Package data a module reads at run time: an edit to it reruns the rules that run the module.
MODULE_DATA = {
    "specfit.report.render": ("templates/report.html.j2", "templates/report.md.j2"),
    "specfit.report.page": ("templates/notes.j2",),
    "specfit.coefficients": ("data/paper_coefficients.yaml",),
    "specfit.paper": ("data/paper_results.yaml",),
}


def code_closure(module: str) -> dict[str, Path]:
    """Every ``specfit`` module that runs when ``module`` runs, by name: its imports, transitively, outside
    ``if TYPE_CHECKING:`` blocks, with the packages above them."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        todo.extend(_specfit_imports(path, name))
    return seen


def code_hash(module: str) -> str:
    """Hash of a stage module's `code_closure` with the package data those modules read (`MODULE_DATA`).

    Snakemake does not see edits to modules run with ``python -m``; a rule that carries this as a param
    reruns when its own code changes, and only then (not on every edit to the package). Methods imported
    from outside the package (``rule: "module:name"``) are not followed.
    """
    seen = code_closure(module)
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(name.encode() + b"\0" + seen[name].read_bytes() + b"\0")
        for data in MODULE_DATA.get(name, ()):
            digest.update(data.encode() + b"\0" + (PACKAGE_DIR / data).read_bytes() + b"\0")
    return digest.hexdigest()[:16]
