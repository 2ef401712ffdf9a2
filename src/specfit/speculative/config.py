"""What a method's config entry means: `MethodConfig` (with every method parameter's default, in one place) and
the route sources SpecFit can read (`RouteSource`). Torch-free: the workflow and the report read them too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from specfit.errors import SpecFitError


@dataclass(frozen=True)
class RouteSource:
    """Where SpecFit's selector gets the expert routes Ê_{l,v} of the pool nodes (Section 3.3).

    ``live``: the target itself is queried once per cycle over the whole pool (outside the request timer): the
    atlas build. Otherwise the routes are read back from that build's atlas. ``noisy``: the routes are degraded
    to the method's ``accuracy`` (the paper's simulated predictor, Section 4.6). ``learned``: a trained route
    predictor guesses them from the drafter's state inside the request timer (`specfit.speculative.learned`); no
    atlas, no target query.
    """

    name: str
    live: bool
    noisy: bool
    learned: bool = False

    @property
    def exact(self) -> bool:
        return not self.noisy and not self.learned

    @property
    def built_by(self) -> RouteSource:
        """The live source whose run builds the atlas this source reads (itself when live)."""
        if self.learned:
            raise SpecFitError("learned routes read no atlas: no atlas build serves them")
        return next(s for s in ROUTE_SOURCES.values() if s.live and s.noisy == self.noisy)


ROUTE_SOURCES = {s.name: s for s in (
    RouteSource("atlas", live=False, noisy=False),  # measured runs: the atlas, exact
    RouteSource("noisy", live=False, noisy=True),  # measured runs: the atlas at `accuracy`
    RouteSource("live", live=True, noisy=False),  # the atlas build of "atlas"
    RouteSource("live-noisy", live=True, noisy=True),  # the atlas build of "noisy" (its trajectory differs)
    RouteSource("learned", live=False, noisy=False, learned=True),  # measured runs: the predictor rule's predictor
)}


def route_source(name: str) -> RouteSource:
    if name not in ROUTE_SOURCES:
        raise SpecFitError(f"unknown route source {name!r}: use one of {', '.join(ROUTE_SOURCES)}")
    return ROUTE_SOURCES[name]


CALIBRATIONS = ("none", "online")  # a method's commit probabilities: the drafter's own, or calibrated online


@dataclass(frozen=True)
class MethodConfig:
    """A method's parameters: the ``method`` slice of a decode rule's spec. The defaults are the paper's.

    The config's method entries carry only what they set (the schema fills no defaults there), so that a default
    of a parameter a method does not use cannot rerun it; `of_entry` fills the rest from here.
    """

    name: str  # its kind: a registered one, or "module:name" (`specfit.speculative.kinds.kind`)
    k_max: int = 7  # K: most draft nodes one cycle verifies
    max_depth: int = 5  # pool levels
    top_k_expand: int = 2  # children per expanded node, and nodes expanded per level
    routes: str = "atlas"  # SpecFit's route source, a name in ROUTE_SOURCES
    accuracy: float = 0.6  # route accuracy of a noisy source (the paper's simulated predictor)
    # beyond the paper, for the kinds that read routes (`specfit.speculative.methods.SpecFit`); None: the kind's own
    # default (`SpecFit.DEFAULTS`: the paper's for specfit, specfit-ca's, specfit-online's)
    calibration: str | None = None  # "online": commit probabilities calibrated from verification outcomes; "none"
    lookahead: bool | None = None  # draft on while a chain through the next levels could pay, not only the next level
    skip: bool | None = None  # specfit-ca: verify the root alone while drafting has not paid lately

    def __post_init__(self):
        route_source(self.routes)
        if self.calibration not in (None, *CALIBRATIONS):
            raise SpecFitError(f"method {self.name}: calibration {self.calibration!r} is not one of "
                               f"{', '.join(CALIBRATIONS)}")

    @property
    def route_source(self) -> RouteSource:
        return ROUTE_SOURCES[self.routes]

    @classmethod
    def of_entry(cls, entry: dict) -> MethodConfig:
        """From a method entry of config.yaml, whose ``kind`` is the name."""
        entry = dict(entry)
        if "rule" in entry:
            raise SpecFitError(f"method entry {entry}: its key 'rule' was renamed to 'kind'")
        name = entry.pop("kind")
        unknown = set(entry) - {f.name for f in fields(cls)}
        if unknown:
            raise SpecFitError(f"method entry {entry} has unknown keys {sorted(unknown)}")
        return cls(name=name, **entry)

