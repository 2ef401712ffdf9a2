"""Method kinds: what the workflow, the decode stage and the report ask of each kind of method, declared once.

A config's method entry names its ``kind``; everything else reads the kind's declaration here: whether it drafts,
whether it reads expert routes (then its runs read coefficients and an atlas or a learned predictor, and the atlas
rule builds its atlas), whether the tune rule chooses its tree, the cost model of its Table 5 theory run, its roles in
the report, and the class that implements it (imported only when a run decodes with it). Torch-free and import-light:
planning reads it.

A kind from outside the package is named ``module:name`` in the config: resolving it imports ``module``, which
registers its kind with ``@register_method(name, reads_routes=...)`` (`specfit.speculative.methods`), a
`register_kind` call. Such a kind has no theory run and no role in the report's comparisons.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass

from specfit.errors import SpecFitError

# Roles in the report: what the report compares a kind as (`Kind.roles`).
REFERENCE = "reference"  # the lossless check's reference and the speedups' denominator: AR
BASELINE = "baseline"  # a bar the cache-aware SpecFit must meet (the best of them; a tie counts)
RIVAL = "rival"  # a bar a prefetching SpecFit must beat (the best of them)
COMPARED = "compared"  # a column of the cache-aware section's table

# Cost models a theory run's Table 5 is computed under (`specfit.stages.theory`).
PAPER = "paper"  # the paper's SpecFit, whose cost model is Eq. 4
CACHE_AWARE = "cache_aware"  # the cache-aware cost T̂_CA (beyond the paper)
THEORY_COSTS = (PAPER, CACHE_AWARE)


@dataclass(frozen=True)
class Kind:
    name: str
    impl: str  # "module:Class" of its `specfit.speculative.methods.Method`, imported by `build_method`
    drafts: bool = True  # False: no drafter, every cycle verifies the root alone
    reads_routes: bool = False  # selects by expert routes Ê_{l,v}: coefficients and an atlas or a learned predictor
    theory_cost: str | None = None  # the cost model of its theory run (one of THEORY_COSTS), None: no theory run
    roles: tuple[str, ...] = ()  # what the report compares it as (REFERENCE, BASELINE, RIVAL, COMPARED)
    label: str = ""  # the report's name for it where the config has no method of it (its name when empty)
    tuned: bool = False  # its tree (k_max, max_depth, top_k_expand) is the tune rule's best on unevaluated prompts
    searches: bool = False  # selects by SpecFit's exact search over A_K (the config bounds its pool's family)
    dense_cost: bool = False  # prices subtrees by size alone, b_k refitted on the calibration's probes (no routes)

    @property
    def calibrated(self) -> bool:
        """Whether its runs read the calibration's coefficients: a kind that reads routes, or one of a dense cost."""
        return self.reads_routes or self.dense_cost

    def __post_init__(self):
        if self.theory_cost not in (None, *THEORY_COSTS):
            raise SpecFitError(f"method kind {self.name!r}: theory cost {self.theory_cost!r} is not one of "
                               f"{', '.join(THEORY_COSTS)}")

    @property
    def shown(self) -> str:
        return self.label or self.name

    def implementation(self) -> type:
        """The class that implements the kind, imported now."""
        module, _, attr = self.impl.partition(":")
        return getattr(importlib.import_module(module), attr)


_METHODS = "specfit.speculative.methods"
_PREFETCHING = "specfit.speculative.prefetching"

AR = Kind("ar", f"{_METHODS}:AR", drafts=False, roles=(REFERENCE, BASELINE, RIVAL, COMPARED), label="AR")
EAGLE3 = Kind("eagle3", f"{_METHODS}:Eagle3", roles=(BASELINE, RIVAL, COMPARED), label="EAGLE-3")
# EAGLE-3 at the fixed tree a user tunes by hand: the best of the `tune` grid on the workload's unevaluated questions
EAGLE3_TUNED = Kind("eagle3-tuned", "specfit.speculative.tuned:Eagle3Tuned", tuned=True, label="EAGLE-3, tuned tree")
SPECFIT = Kind("specfit", f"{_METHODS}:SpecFit", reads_routes=True, theory_cost=PAPER, roles=(COMPARED,),
               label="SpecFit", searches=True)
# the paper's thesis as an ablation: SpecFit's selection and adaptive depth under a cost blind to experts
SPECFIT_DENSE = Kind("specfit-dense", "specfit.speculative.dense:SpecFitDense", dense_cost=True,
                     label="SpecFit, dense cost", searches=True)
SPECFIT_CA = Kind("specfit-ca", f"{_METHODS}:SpecFitCA", reads_routes=True, theory_cost=CACHE_AWARE,
                  roles=(COMPARED,), searches=True)
# specfit-ca with online-calibrated commit probabilities, look-ahead stopping and no skipping (beyond the paper); no
# theory run: Table 5's replay reads the drafter's probabilities, not the calibrated ones it selected with
SPECFIT_ONLINE = Kind("specfit-online", "specfit.speculative.online:SpecFitOnline", reads_routes=True,
                      label="SpecFit online", searches=True)
SPECFIT_PREFETCH = Kind("specfit-prefetch", f"{_PREFETCHING}:SpecFitPrefetch", reads_routes=True,
                        theory_cost=CACHE_AWARE, searches=True)
EAGLE3_PREFETCH = Kind("eagle3-prefetch", f"{_PREFETCHING}:Eagle3Prefetch", reads_routes=True, roles=(RIVAL,))

PAPER_KINDS = (AR.name, EAGLE3.name, SPECFIT.name)  # the paper's three methods, which key its results

BUILTIN = (AR, EAGLE3, EAGLE3_TUNED, SPECFIT, SPECFIT_DENSE, SPECFIT_CA, SPECFIT_ONLINE, SPECFIT_PREFETCH,
           EAGLE3_PREFETCH)
KINDS: dict[str, Kind] = {k.name: k for k in BUILTIN}  # and the kinds registered from outside


def register_kind(k: Kind) -> Kind:
    """Register a kind from outside the package (a module named ``module:name``); registering it again replaces
    it. A built-in kind's name is refused."""
    if k.name in {b.name for b in BUILTIN}:
        raise SpecFitError(f"method kind {k.name!r} is built in: name yours otherwise")
    KINDS[k.name] = k
    return k


def _import_from_workflow_root(module: str, name: str) -> None:
    """Import a user's ``module`` as Python would from the workflow root, where every command runs: the working
    directory joins the end of the import path (``python -m`` puts it first; ``snakemake`` and ``specfit``, console
    scripts, leave it out), so a ``mylab/`` beside config.yaml imports and an installed package still wins."""
    root = os.getcwd()
    if root not in sys.path:
        sys.path.append(root)
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise SpecFitError(f"method kind {name!r}: cannot import {module!r} ({err}) from {root} or the installed "
                           "packages: put the module in the workflow root, where the commands run, or install it") \
            from err


def kind(name: str) -> Kind:
    """The kind ``name``: a registered one, or ``module:name``, which imports ``module`` first (it registers it)."""
    module, sep, bare = name.rpartition(":")
    if sep:
        _import_from_workflow_root(module, name)
        name = bare
    if name not in KINDS:
        raise SpecFitError(f"unknown method kind {name!r}; registered: {', '.join(sorted(KINDS))}, or module:name")
    return KINDS[name]


def with_role(role: str) -> tuple[str, ...]:
    """The built-in kinds the report compares as ``role``, in registry order."""
    return tuple(k.name for k in BUILTIN if role in k.roles)


def routed() -> tuple[str, ...]:
    """The registered kinds that read expert routes."""
    return tuple(k.name for k in KINDS.values() if k.reads_routes)
