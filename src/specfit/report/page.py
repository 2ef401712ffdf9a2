"""The page's building blocks (tables, figures, sections, parts) and how a cell prints a number or an estimate: a
run's value with its 95% bootstrap interval (`specfit.results.intervals`), a ratio of two runs' with its verdict too. A
table has a stable id and a key per row, which tests look it up by."""

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import jinja2

from specfit.report.verdict import Verdict
from specfit.results import intervals

EMULATED = "emulated"  # a timing over an emulated link or device (the device part says which)
MISSING = "–"
NO_INTERVAL = "[no interval]"


@dataclass
class Table:
    id: str  # section / model / device / workload ...
    caption: str
    header: list[str]
    rows: list[list[str]]
    keys: list = field(default_factory=list)  # one per row: what the row is about (a run, a metrics.json key, ...)


def table(id: str, caption: str, columns: list[tuple[str, Callable]], items, key=lambda item: item) -> Table:
    """A row per item, a cell per column (header, the cell of an item)."""
    items = list(items)
    return Table(id, caption, [h for h, _ in columns], [[cell(x) for _, cell in columns] for x in items],
                 [key(x) for x in items])


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
    return value if isinstance(value, str) else format(value, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def pct_less(a, b):
    """How many percent ``a`` lies below ``b``."""
    r = ratio(a, b)
    return None if r is None else 100.0 * (1.0 - r)


def pct_more(a, b):
    """How many percent ``a`` lies above ``b``."""
    r = ratio(a, b)
    return None if r is None else 100.0 * (r - 1.0)


def share_of(part_saved: float, saved: float) -> float:
    """One part's share of a time saving, in percent; NaN ("n/a") when nothing is saved."""
    return float("nan") if saved <= 0 else 100.0 * part_saved / saved


def cache_cell(slots: int) -> str:
    return f"Yes ({slots})" if slots > 0 else "No"


METHOD = ("Method", lambda r: r.method)  # the first columns of a table with a row per run
CACHE = ("Cache", lambda r: cache_cell(r.slots))


def tagged(text: str, emulated: bool) -> str:
    return f"{text} [{EMULATED}]" if emulated else text


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float | None = None  # None: no interval (a requests.parquet is missing)
    high: float | None = None
    verdict: Verdict | None = None  # a ratio's, from its interval


def est(value, ci: dict | None = None) -> Estimate | None:
    """A run's estimate: value, with its interval (and verdict, for a ratio) where the requests give one."""
    if value is None or ci is None:
        return None if value is None else Estimate(value)
    return Estimate(value, ci["low"], ci["high"], Verdict.of(ci["low"], ci["high"]) if "verdict" in ci else None)


def as_pct(e: Estimate | float | None) -> Estimate | float | None:
    """A ratio as a percent change, 100 (r − 1): a number, or an estimate with its interval and verdict."""
    if e is None or not isinstance(e, Estimate):
        return None if e is None else 100.0 * (e - 1.0)
    return replace(e, **{k: None if getattr(e, k) is None else 100.0 * (getattr(e, k) - 1.0)
                         for k in ("value", "low", "high")})


def show(value, spec: str, unit: str = "") -> str:
    """A paper number (float) or a run's estimate: "1.03× [0.97, 1.09] tie", "5.21 [4.80, 5.66]"."""
    if not isinstance(value, Estimate):
        return MISSING if value is None else fmt(value, spec) + unit
    text = fmt(value.value, spec) + unit
    if value.low is None:
        return f"{text} {NO_INTERVAL}"
    text += f" [{fmt(value.low, spec)}, {fmt(value.high, spec)}]"
    return f"{text} {value.verdict}" if value.verdict else text



@functools.cache
def _notes():
    """templates/notes.j2 as a module of macros; they print EMULATED and numbers (`fmt`) as the tables do."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("specfit.report", "templates"),
                             undefined=jinja2.StrictUndefined)
    return env.get_template("notes.j2", globals={"EMULATED": EMULATED, "fmt": fmt}).module


def notes(name: str, /, **values) -> list[str]:
    """A note's fixed prose (templates/notes.j2, one macro per note) with the run's ``values``: its paragraphs,
    separated by a blank line in the macro, each on one line."""
    text = str(getattr(_notes(), name)(**values))
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def note(name: str, /, **values) -> str:
    """A note of one paragraph (`notes`)."""
    return " ".join(notes(name, **values))


def interval_note(seed: int) -> str:
    return note("intervals", n_boot=intervals.N_BOOT, seed=seed, virtual_spread=intervals.VIRTUAL_SPREAD,
                spread=intervals.PROCESS_SPREAD, cpu_spread=intervals.CPU_SPREAD)
