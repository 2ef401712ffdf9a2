"""The paper beside this run: the config's methods in the paper's roles, which of the paper's GPUs a device stands
for, the paper's figures (paper_results.yaml) under metrics.json keys, and the section that puts the paper's
headline figures beside this run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specfit.report.inputs import tps_cell
from specfit.report.page import Section, Table, as_pct, fmt, interval_note, pct_less, ratio, show, tagged, x_cell, x_fmt
from specfit.workflow import method_config, method_rule

if TYPE_CHECKING:
    from specfit.report.sections import ModelView

# paper_results.yaml counters -> metrics.json keys, so that paper and run go through the same code
PAPER_COUNTERS = {"draft_nodes": "draft_nodes_per_cycle", "committed": "committed_per_cycle", "cycles": "cycles",
                  "ms_per_cycle": "ms_per_cycle", "h2d_per_token": "h2d_per_token"}
PAPER_CACHE = {"cache": "cache", "nocache": "no_cache"}
PAPER_DEVICES = ("a100", "rtx4090")


# ------------------------------------------------------------------------------------ roles of the methods
@dataclass(frozen=True)
class Roles:
    """The config's methods in the paper's roles: AR, EAGLE-3, SpecFit (exact routes), SpecFit noisy routes."""

    ar: str | None
    eagle3: str | None
    specfit: str | None
    noisy: list[str]

    @classmethod
    def of(cls, spec: dict) -> "Roles":
        def first(pred):
            return next((m for m in spec["methods"] if pred(m)), None)

        def routes(m):
            return method_config(spec, m).route_source.name

        return cls(
            ar=first(lambda m: method_rule(spec, m) == "ar"),
            eagle3=first(lambda m: method_rule(spec, m) == "eagle3"),
            specfit=first(lambda m: method_rule(spec, m) == "specfit" and routes(m) == "atlas"),
            noisy=[m for m in spec["methods"] if method_rule(spec, m) == "specfit" and routes(m) == "noisy"],
        )


def paper_device(spec: dict, device: str) -> str:
    """The paper's GPU a device stands for: named in its name, label or coefficients, else by order."""
    for name in PAPER_DEVICES:
        key = name.replace("rtx", "")
        d = spec["devices"][device]
        if any(key in str(s).lower() for s in (device, d.get("label", ""), d.get("coefficients", ""))):
            return name
    order = list(spec["devices"])
    return PAPER_DEVICES[min(order.index(device), len(PAPER_DEVICES) - 1)]


# ------------------------------------------------------------------------------------ paper and run as cells
def cells(get, roles: Roles, main: int) -> dict:
    """(method rule, cache mode) -> metrics dict, for the paper's three methods at the main slots and at 0."""
    out = {}
    for rule, method in (("ar", roles.ar), ("eagle3", roles.eagle3), ("specfit", roles.specfit)):
        for mode, slots in (("cache", main), ("nocache", 0)):
            out[rule, mode] = get(rule, method, mode, slots)
    return out


def paper_cells(paper: dict, device: str, workload: str) -> dict | None:
    """The paper's figures for one GPU and workload, under metrics.json keys."""
    tps = paper["decode_tps"].get(device, {}).get(workload)
    counters = paper["counters"].get(device, {}).get(workload)
    if tps is None:
        return None
    out = {}
    for rule in ("ar", "eagle3", "specfit"):
        for mode, paper_mode in PAPER_CACHE.items():
            row = {"tps_dec": tps[rule][paper_mode]}
            if counters is not None:
                row.update({PAPER_COUNTERS[k]: v for k, v in counters[rule][paper_mode].items()})
            out[rule, mode] = row
    return out


def headline(c: dict, tps_ratio=None) -> list[tuple[str, str, float | dict | None, str]]:
    """The paper's headline ratios from (rule, cache mode) cells; the same code reads paper and run.

    Each entry: label, the key of the paper's text claim (paper_results.yaml ``text_claims``), value, format.
    ``tps_ratio(cell, cell)``, where given, gives the ratio of two cells' decode TPS as an estimate with its
    interval (a run's); without it the ratio is a plain number (the paper's).
    """

    def v(rule, mode, key):
        cell = c.get((rule, mode))
        return None if cell is None else cell.get(key)

    def tps(a, b):
        if tps_ratio is not None:
            return tps_ratio(a, b)
        return ratio(v(*a, "tps_dec"), v(*b, "tps_dec"))

    def pct(a, b):
        r = tps(a, b)
        if isinstance(r, dict):
            return as_pct(r)
        return None if r is None else 100.0 * (r - 1.0)

    return [
        ("SpecFit over cached EAGLE-3 (%)", "vs_cached_eagle3_pct",
         pct(("specfit", "cache"), ("eagle3", "cache")), ".1f"),
        ("SpecFit over vanilla EAGLE-3, no cache (%)", "vs_vanilla_eagle3_no_cache_pct",
         pct(("specfit", "nocache"), ("eagle3", "nocache")), ".1f"),
        ("SpecFit (cache) over AR without cache (×)", "vs_ar_x", tps(("specfit", "cache"), ("ar", "nocache")), ".2f"),
        ("Vanilla EAGLE-3 over AR without cache (×)", "vanilla_eagle3_vs_ar_x",
         tps(("eagle3", "nocache"), ("ar", "nocache")), ".2f"),
        ("SpecFit commits fewer tokens per cycle than cached EAGLE-3 (%)", "fewer_committed_pct",
         pct_less(v("specfit", "cache", "committed_per_cycle"), v("eagle3", "cache", "committed_per_cycle")), ".1f"),
        ("SpecFit cycle shorter than cached EAGLE-3 (%)", "shorter_cycle_pct",
         pct_less(v("specfit", "cache", "ms_per_cycle"), v("eagle3", "cache", "ms_per_cycle")), ".1f"),
        ("SpecFit fewer H2D/token than cached EAGLE-3 (%)", "fewer_h2d_per_token_pct",
         pct_less(v("specfit", "cache", "h2d_per_token"), v("eagle3", "cache", "h2d_per_token")), ".1f"),
        ("SpecFit drafting time per cycle cut vs cached EAGLE-3 (%)", "drafting_time_cut_pct",
         pct_less(v("specfit", "cache", "draft_ms_per_cycle"), v("eagle3", "cache", "draft_ms_per_cycle")), ".1f"),
    ]


# ------------------------------------------------------------------------------------ 10. paper vs this run
def comparison(view: ModelView) -> Section:
    """One model's runs on every device beside the paper's figures for the GPU the device stands for."""
    i, spec = view.i, view.spec
    sec = Section("The paper's headline figures beside this run's")
    sec.notes.append(
        "This run is a miniature (a toy target and drafter, a workload subset, and, on CPU, an emulated host "
        "link), "
        "so absolute throughputs, cycle times and transfer counts differ from the paper's by orders of magnitude. "
        "Compare ratios: speedups over AR without the cache and gains over cached EAGLE-3.")
    sec.notes.append("Paper ratios are the ones its text states where it states them, else computed from "
                     "its tables.")
    mapping = ", ".join(f"{d} ↔ {i.paper['setup']['devices'][paper_device(spec, d)]['name']}"
                        for d in view.devices)
    sec.notes.append(f"Devices are mapped by name, label or order: {mapping}.")
    for d in view.devices:
        pd_name = paper_device(spec, d)
        emulated = view.emulated(d)
        for w in spec["workloads"]:
            paper = paper_cells(i.paper, pd_name, w)
            if paper is None or not any(r.model == view.model and r.device == d and r.workload == w
                                        for r in i.runs):
                continue
            run, key = view.run_cells(d, w), view.run_keys(d, w)
            sec.missing += i.missing_requests(key.values())
            paper_ar = paper["ar", "nocache"]["tps_dec"]
            rows = []
            for mode in ("nocache", "cache"):
                for rule in ("ar", "eagle3", "specfit"):
                    p, r = paper[rule, mode], run[rule, mode] or {}
                    rows.append([rule, "Yes" if mode == "cache" else "No",
                                 fmt(p["tps_dec"], ".2f"), tps_cell(i.tps(key[rule, mode])),
                                 x_fmt(ratio(p["tps_dec"], paper_ar)),
                                 x_cell(i.speedup(key[rule, mode], key["ar", "nocache"])),
                                 fmt(p.get("ms_per_cycle"), ".1f"), fmt(r.get("ms_per_cycle"), ".1f"),
                                 fmt(p.get("h2d_per_token"), ".1f"), fmt(r.get("h2d_per_token"), ".1f")])
            sec.tables.append(Table(
                tagged(f"{d} vs paper {pd_name}, {w}", emulated),
                ["Method", "Cache", "Paper Decode TPS", tagged("This run Decode TPS", emulated), "Paper speedup",
                 tagged("This run speedup", emulated), "Paper ms/cycle", tagged("This run ms/cycle", emulated),
                 "Paper H2D/token", "This run H2D/token"], rows))
            # the text's own figure where it states one (computed from rounded table values it can differ)
            claims = i.paper["text_claims"].get(w if pd_name == "a100" else f"{pd_name}_{w}", {})
            run_gains = headline(run, lambda a, b, key=key: i.speedup(key[a], key[b]))
            gains = [[label, fmt(claims.get(claim, p), form), show(r, form, "×" if label.endswith("(×)") else "")]
                     for (label, claim, p, form), (*_, r, _) in zip(headline(paper), run_gains)]
            sec.tables.append(Table(tagged(f"Headline ratios, {d} vs paper {pd_name}, {w}", emulated),
                                    ["Quantity", "Paper", tagged("This run", emulated)], gains))
    if sec.tables:
        sec.missing = list(dict.fromkeys(sec.missing))
        sec.notes.append(interval_note(i.seed) + " The paper's figures carry no interval.")
    return sec
