"""Where every artifact of the workflow lives, relative to the workflow root: the one place for file names.

The rules build their patterns from these functions with wildcards as arguments (``prompts("{model}",
"{workload}")``), the helpers in ``rules/common.smk`` build concrete inputs from them, and the report and the tests
find files through them. Torch-free, so that ``snakemake -n`` stays fast.

::

    data/prompts/{model}/{workload}.parquet                           extract
    data/prompts/{model}/tune/{workload}{fold}.parquet                extract_tune (a tuned method's questions)
    data/models/{model}/{tokenizer,target,drafter}/                   toy models (data/models/toy/SHIPPED.json: shipped)
    data/calibration/{model}/{device}/{cache}.json, .points.parquet   calibrate
    data/atlas/{model}/{device}/{workload}/{method}-{cache}/          atlas
    data/predictor/{model}/                                           predictor (learned routes)
    data/tune/{model}/{device}/{workload}/{method}/slots{slots}{fold}.json  tune (a tuned method's tree)
    data/decode/{model}/{device}/{workload}/{method}/slots{slots}/    decode
    data/theory/{model}/{device}/{workload}[.{method}].json           theory (a method: beyond the paper)
    reports/all/                                                      report
    data/logs/{rule}[/{wildcards}].log                                every rule's log (one per job)
"""

from __future__ import annotations

CACHE_MODES = ("cache", "nocache")
RUN_FILES = ("requests.parquet", "cycles.parquet", "metrics.json")  # what a decode run writes
ATLAS_FILES = ("atlas.parquet", *RUN_FILES)  # what an atlas build writes (its own run's records as diagnostics)
REPORT = "reports/all"


def cache_mode(slots) -> str:
    """Which calibration fit a run uses: with the cache for every slots > 0 (as the paper does), else without."""
    return "cache" if int(slots) > 0 else "nocache"


def atlas_variant(method: str, slots) -> str:
    """One atlas per SpecFit variant: the method (its route source) and the coefficient set (cache mode).

    Variants select different trees and so follow different cycles; the seed is the config's, shared by all.
    """
    return f"{method}-{cache_mode(slots)}"


def prompts(model: str, workload: str) -> str:
    return f"data/prompts/{model}/{workload}.parquet"


def fold_part(fold) -> str:
    """A cross-fitted fold's part of a tune file name (`tune`, `tune_prompts`): ``.fold{fold}``, nothing without
    folds (None); a rule's wildcard pattern passes its ``{fold}`` through."""
    return "" if fold is None else fold if str(fold).startswith("{") else f".fold{fold}"


def tune_prompts(model: str, workload: str, fold=None) -> str:
    """The questions a tuned method's tree is chosen on: the workload's that it does not evaluate (under
    cross-fitting, those of the other folds than ``fold``)."""
    return f"data/prompts/{model}/tune/{workload}{fold_part(fold)}.parquet"


def tune_grid(model: str, device: str, workload: str, method: str, fold=None) -> str:
    """A tune job's sweep (JSON): every tree of the grid at every slot count the tuned method runs at in the cell,
    with its decode TPS, and the best one at each (`specfit.stages.tune`); under cross-fitting one per fold."""
    return f"data/tune/{model}/{device}/{workload}/{method}/grid{fold_part(fold)}.json"


def tune(model: str, device: str, workload: str, method: str, slots, fold=None) -> str:
    """A tune job's choice at one slot count (JSON, rule tune_choice): the grid's trees with their decode TPS and the
    best one (`specfit.speculative.tuning`), tuned at the run's own cache size; under cross-fitting one per fold."""
    return f"data/tune/{model}/{device}/{workload}/{method}/slots{slots}{fold_part(fold)}.json"


def toy_dir(model: str) -> str:
    """The folder of a toy model: its parts' folders (`toy_model`) and, for the shipped toy, their manifest."""
    return f"data/models/{model}"


def toy_model(model: str, part: str) -> str:
    """The folder of a toy model's ``part``: tokenizer, target or drafter."""
    return f"{toy_dir(model)}/{part}"


# the toy shipped in the repository: the model named so (config `shipped: true`), and beside its parts' folders its
# manifest, the sha256 of every file and what trained them (specfit.models.shipped)
SHIPPED_TOY = "toy"
SHIPPED_MANIFEST = f"{toy_dir(SHIPPED_TOY)}/SHIPPED.json"


# the file in a trained toy part's folder that records its training (steps, time, numerics, sha256 of the weights)
TOY_RECORDS = {"target": "training.json", "drafter": "acceptance.json"}


def calibration(model: str, device: str, cache: str) -> str:
    """The fitted coefficients (JSON) of one cache mode."""
    return f"data/calibration/{model}/{device}/{cache}.json"


def calibration_points(model: str, device: str, cache: str) -> str:
    """The probe points (Parquet) that fit came from."""
    return f"data/calibration/{model}/{device}/{cache}.points.parquet"


def atlas_dir(model: str, device: str, workload: str, variant: str) -> str:
    return f"data/atlas/{model}/{device}/{workload}/{variant}"


def atlas(model: str, device: str, workload: str, variant: str, name: str = "atlas.parquet") -> str:
    """A file of an atlas build (`ATLAS_FILES`)."""
    return f"{atlas_dir(model, device, workload, variant)}/{_one_of(name, ATLAS_FILES)}"


def predictor(model: str) -> str:
    """The folder of a model's learned route predictor (`specfit.stages.predictor`)."""
    return f"data/predictor/{model}"


def decode_dir(model: str, device: str, workload: str, method: str, slots) -> str:
    return f"data/decode/{model}/{device}/{workload}/{method}/slots{slots}"


def decode(model: str, device: str, workload: str, method: str, slots, name: str) -> str:
    """A file of a decode run (`RUN_FILES`)."""
    return f"{decode_dir(model, device, workload, method, slots)}/{_one_of(name, RUN_FILES)}"


def theory(model: str, device: str, workload: str, method: str | None = None) -> str:
    """Table 5 on one run's recorded pools: the paper's SpecFit under the workload's name (``method`` None), another
    method's (specfit-ca under its cache-aware cost, beyond the paper) with the method's name after it."""
    return f"data/theory/{model}/{device}/{workload}{'' if method is None else '.' + method}.json"


def log(rule: str, *parts: str) -> str:
    return f"data/logs/{'/'.join((rule, *parts))}.log"


def _one_of(name: str, names: tuple[str, ...]) -> str:
    if name not in names:
        raise ValueError(f"{name!r} is not one of {names}")
    return name
