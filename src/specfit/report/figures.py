"""Every figure of the report, drawn with matplotlib from numbers the sections hand over, saved as PNG beside the page:
the throughput bars (Figures 2-3), the claims against the line at 1, the cache-size sweep (Figure 4) and the
calibration scatter (Appendix B). Each figure grows with what it holds (a row per method or claim) and keeps its
legend below the axes, so that no label overlaps another or leaves the canvas (constrained layout).
"""

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure as MplFigure  # drawn without pyplot: no backend to choose, no global state
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, NullLocator

from specfit.report.page import Estimate, Figure
from specfit.report.verdict import Verdict

DPI = 110
ROW_IN = 0.24  # inches per row of a bar or claim chart
WRAP = 46  # characters per line of a row's label
VERDICT_COLOURS = {Verdict.CONFIRMED: "#2a9d48", Verdict.REFUTED: "#c8372d", Verdict.TIE: "#d99a1e",
                   Verdict.NOT_JUDGED: "0.6"}
PAPER_MARK = {"marker": "D", "markersize": 5, "markerfacecolor": "white", "markeredgecolor": "black",
              "linestyle": "none"}


class Figures:
    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def save(self, fig, name: str, caption: str) -> Figure:
        fig.savefig(self.folder / f"{name}.png", dpi=DPI)
        return Figure(f"{self.folder.name}/{name}.png", caption)


def canvas(width: float, height: float) -> MplFigure:
    """An empty figure of the report: its size in inches, laid out by matplotlib's constrained layout."""
    return MplFigure(figsize=(width, height), dpi=DPI, layout="constrained")


def slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


def error_bar(e: Estimate | None):
    """Matplotlib yerr of an estimate ([[below], [above]]), None without an interval."""
    if e is None or e.low is None:
        return None
    return [[max(0.0, e.value - e.low)], [max(0.0, e.high - e.value)]]


def legend_below(fig, handles: list, ncol: int | None = None) -> None:
    """The figure's legend under its axes, outside them."""
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol or min(len(handles), 4), fontsize=8,
               frameon=False)


def rows_at(spans: list[float]) -> tuple[list[float], float]:
    """The centre of each row stacked from the top (each ``span`` rows high) and their total height."""
    ys, y = [], 0.0
    for span in spans:
        ys.append(y + span / 2)
        y += span
    return ys, y


def throughput_bars(panels: dict[str, dict[str, Estimate | None]], groups: dict[str, list[str]], title: str,
                    paper: dict[str, dict[str, float]] | None = None, paper_label: str = ""):
    """Decode TPS of each method (a row, coloured by its group, e.g. baselines, the paper's method, beyond the
    paper) in one panel per cache setting (panel title -> method -> its estimate, None: not run), a shared TPS axis,
    the 95% interval and the values in a column at the right; ``paper``: panel title -> method -> the paper's TPS,
    marked."""
    methods = [m for ms in groups.values() for m in ms]
    ys, height = [], 0.0
    for g, ms in enumerate(groups.values()):
        height += 0.6 if g else 0.0  # a gap above each group but the first
        for _ in ms:
            ys.append(height + 0.5)
            height += 1.0
    colour = {m: f"C{g}" for g, ms in enumerate(groups.values()) for m in ms}
    fig = canvas(2.2 + 3.0 * len(panels), 1.5 + ROW_IN * height)
    axes = fig.subplots(1, len(panels), sharex=True, sharey=True, squeeze=False)[0]
    top = max([e.high if e.high is not None else e.value for p in panels.values() for e in p.values() if e]
              + [v for p in (paper or {}).values() for v in p.values()] + [1e-9])
    for ax, (name, estimates) in zip(axes, panels.items()):
        for m, y in zip(methods, ys):
            e = estimates.get(m)
            if e is None:
                ax.text(0.02 * top, y, "not run", va="center", fontsize=7, color="0.45", style="italic")
                continue
            ax.barh(y, e.value, 0.7, color=colour[m])
            if (bar := error_bar(e)) is not None:
                ax.errorbar(e.value, y, xerr=bar, color="0.2", capsize=2, lw=0.8)
            ax.text(1.28 * top, y, f"{e.value:.2f}", ha="right", va="center", fontsize=7)  # a column, right of all
        for m, v in (paper or {}).get(name, {}).items():
            if m in methods:
                ax.plot(v, ys[methods.index(m)], **PAPER_MARK)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("Decode TPS (tokens/s)", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.tick_params(axis="y", length=0)
    axes[0].set_yticks(ys, methods)
    axes[0].set_ylim(height, 0)
    axes[0].set_xlim(0, top * 1.3)
    handles = [Patch(color=f"C{g}", label=label) for g, label in enumerate(groups)]
    if paper:
        handles.append(Line2D([], [], label=paper_label, **PAPER_MARK))
    legend_below(fig, handles)
    fig.suptitle(title, fontsize=9)
    return fig


@dataclass(frozen=True)
class Mark:
    """One row of a claims chart: a ratio of this run with its interval, the verdict that colours it and the
    reference it is read against (the paper's ratio, or a projected range), if any."""

    label: str
    ratio: Estimate | None
    verdict: Verdict
    reference: float | tuple[float, float] | None = None


def wrapped(text: str) -> str:
    return textwrap.fill(text, WRAP, break_on_hyphens=False)


def span(label: str) -> float:
    """A row's height in rows: one, or more for a label of several lines."""
    return max(1.0, (0.15 * (label.count("\n") + 1) + 0.07) / ROW_IN)


RATIO_TICKS = ((0.8, 0.9, 1.0, 1.1, 1.25), (0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0),
               (0.33, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
               (0.01, 0.1, 1.0, 10.0, 100.0))  # finer first


def ratio_ticks(low: float, high: float) -> list[float]:
    """Round ratios on a log axis from ``low`` to ``high``: the finest set that spans it."""
    steps = next((s for s in RATIO_TICKS if s[0] <= low and high <= s[-1]), RATIO_TICKS[-1])
    return [t for t in steps if low <= t <= high]


def claims_chart(groups: dict[str, list[Mark]], title: str, reference: str):
    """Each claim's ratio (a row, in its table's order, under its group's heading) with its 95% interval on a log
    axis, the line at 1, the reference marked (``reference`` names it in the legend: a ratio as a diamond, a range as
    a band) and the verdict by colour."""
    labels, kinds = [], []  # a heading (None) or a mark per row
    for heading, marks in groups.items():
        labels.append(wrapped(heading))
        kinds.append(None)
        labels += [wrapped(m.label) for m in marks]
        kinds += marks
    ys, height = rows_at([span(label) for label in labels])
    fig = canvas(7.6, 1.5 + ROW_IN * height)
    ax = fig.subplots()
    values = [1.0] + [v for m in kinds if m is not None and m.ratio is not None
                      for v in (m.ratio.value, m.ratio.low, m.ratio.high) if v is not None and v > 0]
    values += [v for m in kinds if m is not None and m.reference is not None
               for v in (m.reference if isinstance(m.reference, tuple) else (m.reference,))]
    low, high = min(values) / 1.15, max(values) * 1.15
    ax.axvline(1.0, color="0.3", lw=1, zorder=0)
    for y, m in zip(ys, kinds):
        if m is None:
            continue
        if isinstance(m.reference, tuple):
            ax.plot(m.reference, [y, y], color="0.55", lw=6, alpha=0.35, solid_capstyle="butt")
        elif m.reference is not None:
            ax.plot(m.reference, y, **PAPER_MARK)
        if m.ratio is None:
            ax.text(1.0, y, " not measured", va="center", fontsize=7, color="0.45", style="italic")
            continue
        ax.errorbar(m.ratio.value, y, xerr=error_bar(m.ratio), fmt="o", markersize=5, capsize=2, lw=1.2,
                    color=VERDICT_COLOURS.get(m.verdict, "0.6"))
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ticks = ratio_ticks(low, high)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{t:g}×" for t in ticks])
    ax.set_yticks(ys, labels)
    for tick, kind in zip(ax.get_yticklabels(), kinds):
        tick.set_fontweight("bold" if kind is None else "normal")
    ax.set_ylim(height, 0)
    ax.tick_params(labelsize=8)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("Ratio of decode TPS with its 95% interval (log scale; 1: no difference)", fontsize=8)
    shown = [v for v in VERDICT_COLOURS if any(m is not None and m.verdict == v for m in kinds)]
    handles = [Line2D([], [], marker="o", color=VERDICT_COLOURS[v], linestyle="none", label=str(v)) for v in shown]
    if any(m is not None and isinstance(m.reference, tuple) for m in kinds):
        handles.append(Line2D([], [], color="0.55", lw=6, alpha=0.35, label=reference))
    elif any(m is not None and m.reference is not None for m in kinds):
        handles.append(Line2D([], [], label=reference, **PAPER_MARK))
    legend_below(fig, handles, ncol=len(handles))
    fig.suptitle(title, fontsize=9)
    return fig


def sweep_panels(panels: list[tuple[str, dict[str, list]]], slots: list[int], title: str):
    """One panel per quantity (title, method -> a value or estimate per slot count) against the slot count."""
    fig = canvas(14, 3.6)
    axes = fig.subplots(1, len(panels))
    xs = range(len(slots))
    methods = list(panels[0][1])
    for j, m in enumerate(methods):
        for ax, (_, values) in zip(axes, panels):
            ys = [v.value if isinstance(v, Estimate) else v for v in values[m]]
            ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None],
                    marker="o", color=f"C{j + 1}", label=m)
            for x, v in zip(xs, values[m]):  # the 95% bootstrap intervals
                if (bar := error_bar(v if isinstance(v, Estimate) else None)) is not None:
                    ax.errorbar([x], [v.value], yerr=bar, color=f"C{j + 1}", capsize=3)
    for ax, (name, _) in zip(axes, panels):
        ax.set_xticks(list(xs), [str(s) for s in slots])
        ax.set_xlabel("Expert slots per layer")
        ax.set_title(name, fontsize=9)
    legend_below(fig, axes[0].get_legend_handles_labels()[0])
    fig.suptitle(title, fontsize=9)
    return fig


def calibration_scatter(frames: dict[str, dict], title: str):
    """Measured against predicted cycle time of each fit's probes (label -> its points)."""
    fig = canvas(5, 4.6)
    ax = fig.subplots()
    lo = min(min(f["y_ms"].min(), f["pred_ms"].min()) for f in frames.values())
    hi = max(max(f["y_ms"].max(), f["pred_ms"].max()) for f in frames.values())
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--", label="y = prediction")
    for j, (label, frame) in enumerate(frames.items()):
        ax.scatter(frame["pred_ms"], frame["y_ms"], s=12, color=f"C{j}", alpha=0.7, label=label)
    ax.set_xlabel("Predicted cycle time (ms)")
    ax.set_ylabel("Measured cycle time (ms)")
    ax.set_title(title, fontsize=9)
    legend_below(fig, ax.get_legend_handles_labels()[0])
    return fig

