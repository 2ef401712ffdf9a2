"""Every verdict the report prints, one type: a ratio's (faster, slower, tie), decided by its interval alone
(`specfit.results.intervals.verdict`), and a goal's (met, not met, not required, not judged), decided from such verdicts
or a number against its bound. A new kind of claim adds its words here and judges with `Verdict.of` like the rest."""

from dataclasses import dataclass
from enum import Enum

from specfit.results import intervals


class Verdict(str, Enum):
    FASTER, SLOWER, TIE = "faster", "slower", "tie"
    MET, MISSED, NOT_REQUIRED, NOT_JUDGED = "met", "not met", "not required", "not judged"
    CONFIRMED, REFUTED = "confirmed", "refuted"  # a claim of the paper against this run

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def of(cls, low: float, high: float) -> "Verdict":
        """A ratio's verdict from its interval: faster when it lies above 1, slower when below, else a tie."""
        return cls(intervals.verdict(low, high))


def confronted(claim: Verdict, run: Verdict | None) -> Verdict:
    """A claim of the paper (faster, slower or tie) against this run's verdict on the same ratio: confirmed when they
    agree, refuted when the run finds the opposite direction, or a direction where the paper claims a tie; a run's tie
    against a claimed direction is a tie (neither); not judged without an interval."""
    if run is None:
        return Verdict.NOT_JUDGED
    if run == claim:
        return Verdict.CONFIRMED
    return Verdict.TIE if run == Verdict.TIE else Verdict.REFUTED


@dataclass(frozen=True)
class Outcome:
    """One goal's verdict in one place (a cell, a device); ``why``: the reason it is not judged or not required, or
    what decided it; ``basis``: the ratio's verdict it was decided on, if one."""

    verdict: Verdict
    why: str = ""
    basis: Verdict | None = None

    @classmethod
    def of(cls, met: bool, why: str = "") -> "Outcome":
        """A goal judged by a number against its bound: met or not met."""
        return cls(Verdict.MET if met else Verdict.MISSED, why)

    def answer(self) -> str:
        """As a goal column prints it: "yes", "no", "not judged (why)", ..."""
        word = {Verdict.MET: "yes", Verdict.MISSED: "no"}.get(self.verdict, str(self.verdict))
        return f"{word} ({self.why})" if self.why else word

    def word(self) -> str:
        """As a sentence prints it: "met (why)", "not met (why)", ..."""
        return f"{self.verdict} ({self.why})" if self.why else str(self.verdict)


def at_least(value: float, bound: float, why: str = "") -> Outcome:
    return Outcome.of(value >= bound, why)


def not_judged(runs: list, metrics: dict, what: str) -> Outcome:
    """Why a goal over ``runs`` (None: not in the config's matrix) has no verdict: a run, its metrics.json or a
    requests.parquet (the interval) is missing."""
    if any(r is None for r in runs):
        return Outcome(Verdict.NOT_JUDGED, f"no {what} run in this cell")
    if lacking := [r.method for r in runs if r not in metrics]:
        return Outcome(Verdict.NOT_JUDGED, f"no metrics.json of {', '.join(lacking)}")
    return Outcome(Verdict.NOT_JUDGED, "no interval: a requests.parquet is missing")


def judged(e, ok: tuple[Verdict, ...], runs: list, metrics: dict, what: str) -> Outcome:
    """Met when the ratio ``e``'s verdict is one of ``ok``; not judged without a ratio or its interval."""
    if e is None or e.verdict is None:
        return not_judged(runs, metrics, what)
    return Outcome(Verdict.MET if e.verdict in ok else Verdict.MISSED, basis=e.verdict)


def overall(outcomes: list[Outcome]) -> Outcome:
    """Several goals at once: the first not met (even if another cannot be judged), else the first not judged."""
    for v in (Verdict.MISSED, Verdict.NOT_JUDGED):
        if first := next((o for o in outcomes if o.verdict == v), None):
            return first
    return Outcome(Verdict.MET)
