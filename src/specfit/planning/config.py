"""The config as the workflow sees it: loaded with its overlays, validated against the schema with its defaults
filled, and checked across sections (every name a run lists is defined, the toys' folders, the shipped toy's
manifest). A config that fails is refused at load, naming the key and what to do.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from specfit.errors import SpecFitError
from specfit.planning import paths
from specfit.planning.matrix import evaluated_question_ids, method_kind, predictor_question_ids, trained_toys
from specfit.planning.methods import check_methods
from specfit.speculative.sampling import KEYS, Sampling


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
    _check_renamed(config)
    _check_resident_entries(config)
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = _with_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise SpecFitError("invalid config:\n  " + "\n  ".join(_describe(e) for e in errors))
    _check_references(config, None if root is None else Path(root))
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


def add_configfile_option(parser, default: str = "none") -> None:
    """``--configfile FILE`` on a command run from the workflow root: an overlay merged over config.yaml, as
    Snakemake's ``--configfile`` merges it (`load_config`); repeat it for several, merged in order. One file a flag,
    so that an argument after it (``specfit generate``'s prompt) is never taken for a config file."""
    parser.add_argument("--configfile", action="append", default=None, metavar="FILE",
                        help=f"a config file merged over config.yaml; repeat for several, merged in order "
                             f"(default: {default})")


def _check_renamed(config: dict) -> None:
    """Refuse a key the config no longer has, naming its new name (before the schema, which would only say that
    the key is not allowed)."""
    methods = config.get("methods")
    problems = [f"config key 'methods.{name}.rule' was renamed to 'kind': write kind: {entry['rule']}"
                for name, entry in (methods.items() if isinstance(methods, dict) else ())
                if isinstance(entry, dict) and "rule" in entry]
    if problems:
        raise SpecFitError("invalid config:\n  " + "\n  ".join(problems))


def _check_resident_entries(config: dict) -> None:
    """Refuse a resident device given a link, copies in flight or an emulated GPU, on the entry as written (before
    the schema fills ``max_inflight``'s default): every expert is resident, nothing is copied."""
    devices = config.get("devices")
    problems = [f"config key 'devices.{name}.{key}' is given to a resident device (devices.{name}.resident): every "
                f"expert is in memory and nothing is copied, so it has no {what}; drop it"
                for name, entry in (devices.items() if isinstance(devices, dict) else ())
                if isinstance(entry, dict) and entry.get("resident") is not None
                for key, what in (("link", "link"), ("max_inflight", "copies in flight"), ("emulate", "emulated GPU"))
                if key in entry and (entry[key] is not None or key == "max_inflight")]
    if problems:
        raise SpecFitError("invalid config:\n  " + "\n  ".join(problems))


# the config.json keys under which transformers' families name their routed experts: specfit.models.loading's own
# (that package imports torch, which planning does not; tests/workflow/test_config.py holds them equal)
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def model_experts(config: dict, model: str, root: Path | None) -> int | None:
    """The routed experts per MoE layer of ``model`` when known at config load: a toy the rules train has the
    config's ``toy.target.num_experts``; another model's target config.json, when it is there under ``root``."""
    entry = config["models"][model]
    if entry.get("toy"):
        return config.get("toy", {}).get("target", {}).get("num_experts")
    if root is None:
        return None
    path = root / entry["target"] / "config.json"
    try:
        target = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    target = target.get("text_config") or target
    experts = max((v for k in EXPERT_COUNT_KEYS if isinstance(v := target.get(k), int)), default=0)
    return experts or None


def _check_resident(config: dict, root: Path | None) -> list[str]:
    """A resident device's measurements (`specfit.engine.resident.check`), on a CPU, and every run on it (and its
    with-cache calibration) at slots for every expert of the model's layers."""
    from specfit.engine.resident import check  # torch-free

    problems = []
    resident = {name: dev for name, dev in config["devices"].items() if dev.get("resident") is not None}
    for name, dev in resident.items():
        problems += check(dev["resident"], f"devices.{name}.resident")
        if dev["torch_device"] != "cpu":
            problems.append(f"config key 'devices.{name}.resident' emulates a resident device on a "
                            f"{dev['torch_device']} device: emulation is for CPU-only machines")
    experts = {}
    for i, run in enumerate(config["runs"]):
        for model, device in itertools.product(run["models"], run["devices"]):
            if device not in resident or model not in config["models"]:
                continue
            n = experts.setdefault(model, model_experts(config, model, root))
            if n is None:
                continue  # not known here: the engine refuses at model load
            short = sorted(s for s in run["slots"] if s < n)
            if short:
                problems.append(f"config key 'runs.{i}.slots' gives resident device {device!r} {short} slots, but "
                                f"model {model!r} has {n} experts per layer: a resident device holds them all; "
                                f"use slots {n}")
            main = config["models"][model].get("main_slots", {}).get(device)
            if isinstance(main, int) and main < n:
                problems.append(f"config key 'models.{model}.main_slots.{device}' is {main}, but model {model!r} "
                                f"has {n} experts per layer: a resident device holds them all; use {n}")
    return problems


def _check_sampling(config: dict) -> list[str]:
    """Each workload's sampling keys (`specfit.speculative.sampling.Sampling`): what the schema cannot say (a
    non-finite temperature, rejection sampling at T = 0), named with the key."""
    problems = []
    for name, wl in config["workloads"].items():
        try:
            Sampling.of(wl)
        except SpecFitError as err:
            key = next((k for k in KEYS if str(err).startswith(k)), "sampling")  # each message opens with its key
            problems.append(f"config key 'workloads.{name}.{key}': {err}")
    return problems


def _check_references(config: dict, root: Path | None = None) -> None:
    problems = []
    for name in config["methods"]:
        try:
            method_kind(config, name)
        except SpecFitError as err:
            problems.append(f"config key 'methods.{name}.kind': {err}")
    for i, run in enumerate(config["runs"]):
        for field in ("models", "devices", "workloads", "methods"):
            for name in run[field]:
                if name not in config[field]:
                    problems.append(
                        f"config key 'runs.{i}.{field}' names {name!r}, which is not defined under "
                        f"'{field}' (defined: {', '.join(config[field])})"
                    )
    problems += _check_toys(config)
    problems += _check_drafter_data(config)
    for run in config["runs"]:
        for model, device in itertools.product(run["models"], run["devices"]):
            if device not in config["models"].get(model, {}).get("main_slots", {device: 0}):
                problems.append(
                    f"config key 'models.{model}.main_slots' has no entry for device {device!r} "
                    "(the slots of its with-cache calibration)"
                )
    problems += check_methods(config)
    problems += _check_sampling(config)
    for name, device in config["devices"].items():
        if device["emulate"] is None:
            continue
        if device["torch_device"] != "cpu":
            problems.append(f"config key 'devices.{name}.emulate' emulates a GPU on a {device['torch_device']} device: "
                            "emulation is for CPU-only machines; drop it on a GPU, whose timings are measured")
        if device["link"] is not None:
            problems.append(f"config key 'devices.{name}.emulate' comes with 'devices.{name}.link': an emulated device "
                            "models its own link (copy_ms); drop the link")
    problems += _check_resident(config, root)
    problems += _check_toy_window(config, {m: config["toy"]["target"]["seq_len"] for m in trained_toys(config)},
                                  "toy.target.seq_len")
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


def _check_toy_window(config: dict, windows: dict[str, int], source: str) -> list[str]:
    """A toy target decodes only positions it trained at: every workload a toy (``windows``: model -> its training
    window, read from ``source``) runs fits that window with its prompt and reply. Past its training window a small
    target falls into loops (docs/toy.md), which would measure the loop rather than the drafter."""
    problems = []
    for block in config["runs"]:
        for model, workload in itertools.product(block["models"], block["workloads"]):
            wl, window = config["workloads"].get(workload), windows.get(model)
            if wl is None or window is None or None in (wl.get("limit_tokens"), wl.get("max_new_tokens")) \
                    or wl["limit_tokens"] + wl["max_new_tokens"] <= window:
                continue
            problems.append(f"{source} is {window}, but workload {workload!r} decodes toy {model!r} up to position "
                            f"{wl['limit_tokens'] + wl['max_new_tokens']} (limit_tokens {wl['limit_tokens']} + "
                            f"max_new_tokens {wl['max_new_tokens']}): a toy target decodes only positions it trained "
                            "at (docs/toy.md); lower the workload's limit_tokens or train a toy with a longer "
                            "toy.target.seq_len")
    return problems


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


def _check_drafter_data(config: dict) -> list[str]:
    """The toy drafter's data (``toy.drafter.categories``) names Spec-Bench categories that no workload evaluates,
    calibration probes or tunes on, and no workload: it trains on chat, never on what it is measured on."""
    from specfit.questions import SPEC_BENCH_CATEGORIES, category_ids  # torch- and datasets-free

    key = "config key 'toy.drafter.categories'"
    evaluated = set(evaluated_question_ids(config))
    problems = []
    for category in config["toy"]["drafter"]["categories"]:
        if category in config["workloads"]:
            problems.append(f"{key} names {category!r}, a workload: the drafter never trains on what it is "
                            "measured on")
        elif category not in SPEC_BENCH_CATEGORIES:
            problems.append(f"{key} names {category!r}, which is not a Spec-Bench category (its categories: "
                            f"{', '.join(SPEC_BENCH_CATEGORIES)})")
        elif held := sorted(evaluated.intersection(category_ids(category))):
            problems.append(f"{key} names {category!r}, which holds {len(held)} evaluated question(s) "
                            f"({_id_list(held)}; specfit.planning.matrix.evaluated_question_ids): the drafter "
                            "trains on chat, never on a workload's questions or their category")
    return problems


def _id_list(ids: list[int], shown: int = 6) -> str:
    return ", ".join(map(str, ids[:shown])) + (", …" if len(ids) > shown else "")


def check_shipped(config: dict, root: Path, models: Iterable[str] | None = None) -> None:
    """The files a config must find before any job: the shipped toy's manifest, for ``models`` (default: every model
    of the config) that are the shipped toy. Its folders are plain inputs, which Snakemake checks, and the manifest
    checks their contents when a stage loads them."""
    manifest = root / paths.SHIPPED_MANIFEST
    problems = [f"config key 'models.{name}.shipped': the shipped toy's manifest {manifest} is missing: restore the "
                f"shipped toy with `git checkout -- {manifest.parent}` (docs/toy.md)"
                for name in (config["models"] if models is None else models)
                if config["models"][name]["shipped"] and not manifest.is_file()]
    shipped = [name for name in (config["models"] if models is None else models) if config["models"][name]["shipped"]]
    if shipped and not problems:  # the window the shipped target trained at, as its manifest records it
        try:  # a manifest that cannot be read is named when a stage loads the toy (specfit.models.shipped)
            window = ((json.loads(manifest.read_text()).get("specs") or {}).get("target") or {}).get("seq_len")
        except (OSError, ValueError, AttributeError):
            window = None
        problems = _check_toy_window(config, dict.fromkeys(shipped, window), f"the shipped toy's window ({manifest})")
    if problems:
        raise SpecFitError("invalid config:\n  " + "\n  ".join(problems))


