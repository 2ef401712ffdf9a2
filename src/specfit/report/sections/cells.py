"""The cells of a section beyond the paper: one per workload × slots where its method ran on the device, with the run
of each role beside it, the ratios between them and the verdict on each of the issue's goals."""

from __future__ import annotations

from dataclasses import dataclass, field

from specfit.report.page import Estimate, cache_cell
from specfit.report.scope import Scope
from specfit.report.verdict import Outcome
from specfit.workflow import DecodeRun


@dataclass
class Cell:
    workload: str
    slots: int
    runs: dict[str, DecodeRun | None]  # by role; None: not in the config's matrix
    ratios: dict[str, Estimate | None] = field(default_factory=dict)  # by name, decode TPS with paired intervals
    best: str | None = None  # the role a ratio is taken against where the section chooses it (the faster one)
    goals: dict[str, Outcome] = field(default_factory=dict)  # by goal

    @property
    def cached(self) -> bool:
        return self.slots > 0

    @property
    def label(self) -> str:
        return f"{self.workload}, cache {cache_cell(self.slots)}"


def cells_of(s: Scope, method: str, roles: dict[str, str | None]) -> list[Cell]:
    """A cell per workload × slots where ``method`` ran on the scope's device; ``roles``: role -> method name."""
    matrix = set(s.runs)
    cells = []
    for w in s.workloads:
        for slots in sorted({r.slots for r in s.runs if r.workload == w and r.method == method},
                            key=lambda x: (x == 0, -x)):
            runs = {role: s.run(w, name, slots) for role, name in roles.items()}
            cells.append(Cell(w, slots, {role: r if r in matrix else None for role, r in runs.items()}))
    return cells
