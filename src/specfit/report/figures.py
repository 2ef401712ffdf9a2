"""Every figure of the report, drawn with matplotlib from numbers the sections hand over, saved as PNG beside the page:
the throughput bars (Figures 2-3), the cache-size sweep (Figure 4) and the calibration scatter (Appendix B).
"""

import re
from pathlib import Path

from matplotlib.figure import Figure as MplFigure  # drawn without pyplot: no backend to choose, no global state

from specfit.report.page import Estimate, Figure


class Figures:
    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def save(self, fig, name: str, caption: str) -> Figure:
        fig.tight_layout()
        fig.savefig(self.folder / f"{name}.png", dpi=110)
        return Figure(f"{self.folder.name}/{name}.png", caption)


def slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


def error_bar(e: Estimate | None):
    """Matplotlib yerr of an estimate ([[below], [above]]), None without an interval."""
    if e is None or e.low is None:
        return None
    return [[max(0.0, e.value - e.low)], [max(0.0, e.high - e.value)]]


def throughput_bars(bars: dict[str, list[Estimate | None]], ticks: list[str], title: str):
    """Decode TPS per method (a colour each) at each x (with the cache, without), with its interval."""
    fig = MplFigure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    width = 0.8 / len(bars)
    for j, (method, estimates) in enumerate(bars.items()):
        for x, e in enumerate(estimates):
            if e is not None:
                bar = ax.bar(x + (j - (len(bars) - 1) / 2) * width, e.value, width, color=f"C{j}",
                             yerr=error_bar(e), capsize=3, ecolor="0.25",
                             label=method if not any(b.get_label() == method for b in ax.containers) else None)
                ax.bar_label(bar, fmt="%.2f", fontsize=8, label_type="center")
    ax.set_xticks(range(len(ticks)), ticks)
    ax.set_ylabel("Decode TPS (tokens/s)")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.2)  # room for the legend above the bars
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, ncol=len(bars), loc="upper center")
    return fig


def sweep_panels(panels: list[tuple[str, dict[str, list]]], slots: list[int], title: str):
    """One panel per quantity (title, method -> a value or estimate per slot count) against the slot count."""
    fig = MplFigure(figsize=(14, 3.4))
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
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    return fig


def calibration_scatter(frames: dict[str, dict], title: str):
    """Measured against predicted cycle time of each fit's probes (label -> its points)."""
    fig = MplFigure(figsize=(5, 4.2))
    ax = fig.subplots()
    lo = min(min(f["y_ms"].min(), f["pred_ms"].min()) for f in frames.values())
    hi = max(max(f["y_ms"].max(), f["pred_ms"].max()) for f in frames.values())
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--", label="y = prediction")
    for j, (label, frame) in enumerate(frames.items()):
        ax.scatter(frame["pred_ms"], frame["y_ms"], s=12, color=f"C{j}", alpha=0.7, label=label)
    ax.set_xlabel("Predicted cycle time (ms)")
    ax.set_ylabel("Measured cycle time (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return fig
