"""What a section sees: `Scope`, one (model, device) of the run, and `ModelScope`, one model on its devices; both with
the config's methods in the paper's roles (`Roles`) and the paper's figures (`Beside`) for the GPU a device stands
for, beside the workload that stands for the paper's there (`stand_ins`)."""

from dataclasses import dataclass, field

from specfit.planning.matrix import DecodeRun
from specfit.report.figures import Figures
from specfit.report.inputs import Inputs, first_method, methods_with
from specfit.report.page import Estimate, Section, cache_cell
from specfit.report.paper_figures import PAPER_DEVICES, PAPER_WORKLOADS, Beside
from specfit.report.quantities import LINK_EMULATED
from specfit.report.verdict import Outcome
from specfit.speculative.kinds import AR, EAGLE3, EAGLE3_TUNED, SPECFIT, SPECFIT_CA, SPECFIT_DENSE


def slot_order(slots) -> list[int]:
    """Slot counts as tables list them: largest cache first, no cache last."""
    return sorted(slots, key=lambda x: (x == 0, -x))


@dataclass(frozen=True)
class Roles:
    """The config's methods in the paper's roles: AR, EAGLE-3, SpecFit (exact routes), SpecFit noisy routes; and,
    beyond the paper, the cache- and draft-aware SpecFit (kind specfit-ca; None: no such method, no section) and EAGLE-3
    at its tuned tree (kind eagle3-tuned)."""

    ar: str | None
    eagle3: str | None
    specfit: str | None
    noisy: list[str]
    specfit_ca: str | None = None
    eagle3_tuned: str | None = None  # EAGLE-3 at the tune rule's best fixed tree (beyond the paper)
    specfit_dense: str | None = None  # SpecFit's selection under a cost blind to experts (the thesis's ablation)

    @classmethod
    def of(cls, spec: dict) -> "Roles":
        return cls(first_method(spec, AR.name), first_method(spec, EAGLE3.name),
                   first_method(spec, SPECFIT.name, "atlas"), methods_with(spec, (SPECFIT.name,), "noisy"),
                   first_method(spec, SPECFIT_CA.name), first_method(spec, EAGLE3_TUNED.name),
                   first_method(spec, SPECFIT_DENSE.name))

    @property
    def baselines(self) -> tuple[str, ...]:
        """The methods whose best a new selection must meet: AR, EAGLE-3, the tuned tree and the paper's SpecFit."""
        return tuple(m for m in (self.ar, self.eagle3, self.eagle3_tuned, self.specfit) if m is not None)

    def by_kind(self) -> dict[str, str | None]:
        return {AR.name: self.ar, EAGLE3.name: self.eagle3, SPECFIT.name: self.specfit}


def paper_gpu(spec: dict, device: str) -> str | None:
    """The paper's GPU a device stands for: named in its name, label or coefficients, else by order; None for a
    resident device (every expert in memory), which stands for none of them."""
    d = spec["devices"][device]
    if d.get("resident") is not None:
        return None
    for name in PAPER_DEVICES:
        if any(name.replace("rtx", "") in str(s).lower() for s in (device, d.get("label", ""), d.get("coefficients"))):
            return name
    return PAPER_DEVICES[min(list(spec["devices"]).index(device), len(PAPER_DEVICES) - 1)]


def paper_workload(spec: dict, workload: str) -> str | None:
    """The paper's workload a workload stands for: its config key ``paper`` (gsm8k-odd, the RTX 4090's 40
    odd-numbered questions, stands for gsm8k), else its own name when that is one of the paper's."""
    key = spec["workloads"][workload].get("paper")
    return key if key is not None else workload if workload in PAPER_WORKLOADS else None


def stand_ins(spec: dict, runs, roles: Roles, model: str, device: str) -> dict[str, str]:
    """Paper workload -> the workload of (model, device) whose runs the report puts beside the paper's figures.

    Where several workloads stand for one of the paper's (gsm8k and the noisy-route runs' gsm8k-odd on the A100),
    the one with most of the paper's six runs (AR, EAGLE-3 and SpecFit at the main slots and without the cache) in
    the config's matrix, then the one named as the paper's, then the first in the config.
    """
    main = spec["models"][model]["main_slots"][device]
    wanted = {(m, s) for m in roles.by_kind().values() if m is not None for s in (main, 0)}
    best = {}
    for order, w in enumerate(spec["workloads"]):
        pw = paper_workload(spec, w)
        have = {(r.method, r.slots) for r in runs if (r.model, r.device, r.workload) == (model, device, w)}
        rank = (len(have & wanted), w == pw, -order)
        if pw is not None and have & wanted and (pw not in best or rank > best[pw][0]):
            best[pw] = (rank, w)
    return {pw: w for pw, (_, w) in sorted(best.items(), key=lambda kv: PAPER_WORKLOADS.index(kv[0]))}


@dataclass
class Cell:
    """One workload × slots of a method beyond the paper: the run of each role beside it (None: not in the config's
    matrix), the ratios between them and the verdict on each of its goals."""

    workload: str
    slots: int
    runs: dict[str, DecodeRun | None]  # by role
    ratios: dict[str, Estimate | None] = field(default_factory=dict)  # by name, decode TPS with paired intervals
    goals: dict[str, Outcome] = field(default_factory=dict)  # by goal
    best: str | None = None  # the role a ratio is taken against where the section chooses it (the faster one)

    @property
    def cached(self) -> bool:
        return self.slots > 0

    @property
    def label(self) -> str:
        return f"{self.workload}, cache {cache_cell(self.slots)}"


class Scope:
    """One (model, device): its runs by workload, its main slot count, the paper's GPU and workloads it stands for."""

    def __init__(self, inputs: Inputs, figures: Figures, model: str, device: str):
        self.inputs, self.figures, self.model, self.device, self.spec = inputs, figures, model, device, inputs.spec
        self.roles = Roles.of(self.spec)
        self.main = self.spec["models"][model]["main_slots"][device]
        self.runs = [r for r in inputs.runs if (r.model, r.device) == (model, device)]
        self.workloads = [w for w in self.spec["workloads"] if any(r.workload == w for r in self.runs)]
        self.gpu = paper_gpu(self.spec, device)
        self.resident = self.spec["devices"][device].get("resident") is not None  # every expert in memory
        self.paper = Beside(inputs.paper, self.gpu)
        self.stand_ins = stand_ins(self.spec, inputs.runs, self.roles, model, device)
        self.link_emulated = self.emulated(self.runs)

    def id(self, name: str, *more) -> str:
        """A table's stable id: its name, the model, the device and what more tells it apart."""
        return "/".join((name, self.model, self.device, *map(str, more)))

    def paper_key(self, workload: str) -> str | None:
        """The paper's workload whose figures sit beside this workload's on this device (`stand_ins`), else None."""
        pw = paper_workload(self.spec, workload)
        return pw if pw is not None and self.stand_ins.get(pw) == workload else None

    def claims(self, workload: str) -> dict:
        """The paper's headline figures (by text-claim key) beside the workload, {} if none."""
        return self.paper.claims(self.paper_key(workload))

    def runs_of(self, workload: str) -> list[DecodeRun]:
        order = list(self.spec["methods"])
        runs = [r for r in self.runs if r.workload == workload]
        return sorted(runs, key=lambda r: (r.slots > 0, order.index(r.method), -r.slots))

    def run(self, workload: str, method: str | None, slots: int) -> DecodeRun | None:
        return None if method is None else DecodeRun(self.model, self.device, workload, method, slots)

    def ar(self, workload: str) -> DecodeRun | None:
        """AR without the cache: every speedup's baseline."""
        return self.run(workload, self.roles.ar, 0)

    def emulated(self, runs) -> bool:
        return any(self.inputs.metrics[r][LINK_EMULATED] for r in runs if r in self.inputs.metrics)

    def present(self, sec: Section, runs: list[DecodeRun]) -> tuple[list[DecodeRun], bool]:
        """How a section opens on some runs: the metrics.json of those without go to its missing inputs. Returns
        the runs with metrics and whether any of them was timed over an emulated link."""
        sec.missing += self.inputs.missing(runs)
        present = [r for r in runs if r in self.inputs.metrics]
        return present, self.emulated(present)

    def section_on(self, title: str, cells: list[Cell]) -> tuple[Section, bool]:
        """A section on ``cells`` (`cells`): the metrics.json and requests.parquet their runs lack go to its missing
        inputs. Returns it and whether any of those runs was timed over an emulated link or device."""
        runs = [r for c in cells for r in c.runs.values() if r is not None]
        sec = Section(title)
        sec.missing += self.inputs.missing(runs) + self.inputs.missing_requests(runs)
        return sec, self.emulated(runs)

    def cells(self, method: str, roles: dict) -> list[Cell]:
        """A `Cell` per workload × slots where ``method`` ran on this device; ``roles``: role -> method name."""
        matrix = set(self.runs)
        return [Cell(w, slots, {role: r if (r := self.run(w, name, slots)) in matrix else None
                                for role, name in roles.items()})
                for w in self.workloads
                for slots in slot_order({r.slots for r in self.runs if r.workload == w and r.method == method})]

    def paper_runs(self, workload: str) -> dict[tuple[str, str], DecodeRun | None]:
        """(method kind, cache mode) -> the run of the paper's three methods at the main slots and at 0."""
        return {(kind, mode): self.run(workload, method, slots) for kind, method in self.roles.by_kind().items()
                for mode, slots in (("cache", self.main), ("nocache", 0))}

    @property
    def at_paper_scale(self) -> bool:
        """Whether this device's timings read beside the paper's milliseconds and its claims: an emulated GPU (the
        paper's own units) or a GPU; a CPU's own regime (a link-only device, the wall clock) does neither."""
        device = self.spec["devices"][self.device]
        return device.get("emulate") is not None or device.get("torch_device") == "cuda"

    def paper_value(self, r: DecodeRun, key: str) -> float | None:
        """The paper's figure (a metrics.json key) for the cell that run ``r`` stands for: the paper's three methods at
        the main slots and without the cache, on the GPU this device stands for; None elsewhere."""
        cells = self.paper.cells(self.paper_key(r.workload))
        cell = next((c for c, run in self.paper_runs(r.workload).items() if run == r), None)
        return None if cells is None or cell is None else cells[cell].get(key)

    def title(self, workload: str) -> str:
        """Where a table's numbers come from: model, device, workload and its subset label."""
        label = self.spec["workloads"][workload].get("subset_label", "")
        return f"{self.model} / {self.device}, {workload}" + (f" ({label})" if label else "")


class ModelScope:
    """One model on each device it ran on, the devices in the paper's order (`Scope` per device)."""

    def __init__(self, inputs: Inputs, figures: Figures, model: str):
        self.inputs, self.figures, self.model, self.spec = inputs, figures, model, inputs.spec
        devices = [d for d in self.spec["devices"] if any(r.model == model and r.device == d for r in inputs.runs)]
        devices.sort(key=lambda d: PAPER_DEVICES.index(gpu) if (gpu := paper_gpu(self.spec, d)) else len(PAPER_DEVICES))
        self.on = {d: Scope(inputs, figures, model, d) for d in devices}

    def id(self, name: str, *more) -> str:
        return "/".join((name, self.model, *map(str, more)))

    def workload_on(self, device: str, group: str) -> str | None:
        """The workload of ``device`` in a side-by-side group: the device's stand-in for the paper's workload
        ``group`` (`stand_ins`), else the workload named ``group``."""
        if group in PAPER_WORKLOADS:
            return self.on[device].stand_ins.get(group)
        return group if group in self.on[device].workloads else None
