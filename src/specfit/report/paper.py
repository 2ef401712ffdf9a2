"""The paper beside this run: the config's methods in the paper's roles, which of the paper's GPUs a device stands
for and which of its workloads a workload stands for, the paper's figures (paper_results.yaml) under metrics.json
keys, and the section that puts the paper's headline figures beside this run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specfit.report.inputs import tps_cell
from specfit.report.page import (Section, Table, as_pct, fmt, interval_note, pct_less, pct_more, ratio, share_of,
                                 show, tagged, x_cell, x_fmt)
from specfit.workflow import method_config, method_rule

if TYPE_CHECKING:
    from specfit.report.sections import ModelView

# paper_results.yaml counters -> metrics.json keys, so that paper and run go through the same code
PAPER_COUNTERS = {"draft_nodes": "draft_nodes_per_cycle", "committed": "committed_per_cycle", "cycles": "cycles",
                  "ms_per_cycle": "ms_per_cycle", "h2d_per_token": "h2d_per_token"}
PAPER_CACHE = {"cache": "cache", "nocache": "no_cache"}
PAPER_DEVICES = ("a100", "rtx4090")
PAPER_WORKLOADS = ("summarization", "gsm8k")  # the workload keys of paper_results.yaml


# ------------------------------------------------------------------------------------ roles of the methods
@dataclass(frozen=True)
class Roles:
    """The config's methods in the paper's roles: AR, EAGLE-3, SpecFit (exact routes), SpecFit noisy routes; and,
    beyond the paper, the cache- and draft-aware SpecFit (rule specfit-ca; None: no such method, no section)."""

    ar: str | None
    eagle3: str | None
    specfit: str | None
    noisy: list[str]
    specfit_ca: str | None = None

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
            specfit_ca=first(lambda m: method_rule(spec, m) == "specfit-ca"),
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


def paper_workload(spec: dict, workload: str) -> str | None:
    """The paper's workload a workload stands for: its config key ``paper``, else its own name when that is one of
    the paper's (gsm8k-odd, the RTX 4090's 40 odd-numbered questions, says ``paper: gsm8k``)."""
    key = spec["workloads"][workload].get("paper")
    if key is not None:
        return key
    return workload if workload in PAPER_WORKLOADS else None


def stand_ins(spec: dict, runs, roles: Roles, model: str, device: str) -> dict[str, str]:
    """Paper workload -> the workload of (model, device) whose runs the report puts beside the paper's figures.

    Where several workloads stand for one of the paper's (gsm8k and the noisy-route runs' gsm8k-odd on the A100),
    the one with most of the paper's six runs (AR, EAGLE-3 and SpecFit at the main slots and without the cache) in
    the config's matrix, then the one named as the paper's, then the first in the config.
    """
    main = spec["models"][model]["main_slots"][device]
    wanted = {(m, s) for m in (roles.ar, roles.eagle3, roles.specfit) if m is not None for s in (main, 0)}
    best = {}
    for order, w in enumerate(spec["workloads"]):
        pw = paper_workload(spec, w)
        have = {(r.method, r.slots) for r in runs if (r.model, r.device, r.workload) == (model, device, w)}
        if pw is None or not have & wanted:
            continue
        rank = (len(have & wanted), w == pw, -order)
        if pw not in best or rank > best[pw][0]:
            best[pw] = (rank, w)
    return {pw: w for pw, (_, w) in sorted(best.items(), key=lambda kv: PAPER_WORKLOADS.index(kv[0]))}


def claims_key(paper_gpu: str, paper_wl: str) -> str:
    """The key of paper_results.yaml ``text_claims`` for one GPU and workload."""
    return paper_wl if paper_gpu == "a100" else f"{paper_gpu}_{paper_wl}"


# ------------------------------------------------------------------------------------ paper and run as cells
def cells(get, roles: Roles, main: int) -> dict:
    """(method rule, cache mode) -> metrics dict, for the paper's three methods at the main slots and at 0."""
    out = {}
    for rule, method in (("ar", roles.ar), ("eagle3", roles.eagle3), ("specfit", roles.specfit)):
        for mode, slots in (("cache", main), ("nocache", 0)):
            out[rule, mode] = get(rule, method, mode, slots)
    return out


def paper_cells(paper: dict, device: str, workload: str | None) -> dict | None:
    """The paper's figures for one GPU and paper workload (`paper_workload`), under metrics.json keys."""
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


def share_of_saving(c: dict, key: str) -> float | None:
    """How much of the time a SpecFit cycle saves against a cached EAGLE-3 cycle (ms/cycle) one part of the cycle
    (``key``, e.g. verify_ms_per_cycle) saves, in percent; NaN ("n/a") when SpecFit's cycle saves no time."""
    parts = [None if c.get((rule, "cache")) is None else c[rule, "cache"].get(k)
             for rule in ("eagle3", "specfit") for k in (key, "ms_per_cycle")]
    if any(p is None for p in parts):
        return None
    part_e, total_e, part_s, total_s = parts
    saved = total_e - total_s
    return share_of(part_e - part_s, saved)


def headline(c: dict, tps_ratio=None, req_ratio=None) -> list[tuple[str, str, float | dict | None, str]]:
    """The paper's headline ratios from (rule, cache mode) cells; the same code reads paper and run.

    Each entry: label, the key of the paper's text claim (paper_results.yaml ``text_claims``), value, format.
    ``tps_ratio(cell, cell)`` / ``req_ratio(cell, cell)``, where given, give the ratio of two cells' decode /
    request TPS as an estimate with its interval (a run's); without them the ratio is a plain number (the
    paper's, whose cells have no request TPS: its text states that gain).
    """

    def v(rule, mode, key):
        cell = c.get((rule, mode))
        return None if cell is None else cell.get(key)

    def tps(a, b, key="tps_dec", given=tps_ratio):
        if given is not None:
            return given(a, b)
        return ratio(v(*a, key), v(*b, key))

    def pct(a, b, key="tps_dec", given=tps_ratio):
        r = tps(a, b, key, given)
        if isinstance(r, dict):
            return as_pct(r)
        return None if r is None else 100.0 * (r - 1.0)

    fit, eagle = ("specfit", "cache"), ("eagle3", "cache")
    return [
        ("SpecFit over cached EAGLE-3 (%)", "vs_cached_eagle3_pct", pct(fit, eagle), ".1f"),
        ("SpecFit over cached EAGLE-3, prefill included: Request TPS (%)", "incl_prefill_pct",
         pct(fit, eagle, "tps_req", req_ratio), ".1f"),
        ("SpecFit over vanilla EAGLE-3, no cache (%)", "vs_vanilla_eagle3_no_cache_pct",
         pct(("specfit", "nocache"), ("eagle3", "nocache")), ".1f"),
        ("SpecFit (cache) over AR without cache (×)", "vs_ar_x", tps(fit, ("ar", "nocache")), ".2f"),
        ("Vanilla EAGLE-3 over AR without cache (×)", "vanilla_eagle3_vs_ar_x",
         tps(("eagle3", "nocache"), ("ar", "nocache")), ".2f"),
        ("SpecFit commits fewer tokens per cycle than cached EAGLE-3 (%)", "fewer_committed_pct",
         pct_less(v(*fit, "committed_per_cycle"), v(*eagle, "committed_per_cycle")), ".1f"),
        ("SpecFit cycle shorter than cached EAGLE-3 (%)", "shorter_cycle_pct",
         pct_less(v(*fit, "ms_per_cycle"), v(*eagle, "ms_per_cycle")), ".1f"),
        ("Verification's share of the time SpecFit saves per cycle vs cached EAGLE-3 (%)",
         "verification_share_of_saving_pct", share_of_saving(c, "verify_ms_per_cycle"), ".1f"),
        ("SpecFit fewer H2D/token than cached EAGLE-3 (%)", "fewer_h2d_per_token_pct",
         pct_less(v(*fit, "h2d_per_token"), v(*eagle, "h2d_per_token")), ".1f"),
        ("SpecFit more tokens per transfer than cached EAGLE-3 (%)", "tokens_per_transfer_advantage_pct",
         pct_more(v(*eagle, "h2d_per_token"), v(*fit, "h2d_per_token")), ".1f"),
        ("SpecFit drafting time per cycle cut vs cached EAGLE-3 (%)", "drafting_time_cut_pct",
         pct_less(v(*fit, "draft_ms_per_cycle"), v(*eagle, "draft_ms_per_cycle")), ".1f"),
    ]


def paper_headline(paper: dict, paper_gpu: str, paper_wl: str | None) -> dict[str, float | None]:
    """The paper's headline figures for one GPU and workload, by text-claim key: the one its text states where it
    states one, else computed from its tables (None: neither)."""
    cells = paper_cells(paper, paper_gpu, paper_wl)
    if cells is None:
        return {}
    claims = paper["text_claims"].get(claims_key(paper_gpu, paper_wl), {})
    return {claim: claims.get(claim, value) for _, claim, value, _ in headline(cells)}


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
    standing = []
    for d in view.devices:
        pd_name = paper_device(spec, d)
        emulated = view.emulated(d)
        for pw, w in stand_ins(spec, i.runs, view.roles, view.model, d).items():
            paper = paper_cells(i.paper, pd_name, pw)
            if paper is None:
                continue
            if w != pw:
                standing.append(f"{w} on {d} for the paper's {pw}")
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
            name = w if w == pw else f"{w} (paper: {pw})"
            sec.tables.append(Table(
                tagged(f"{d} vs paper {pd_name}, {name}", emulated),
                ["Method", "Cache", "Paper Decode TPS", tagged("This run Decode TPS", emulated), "Paper speedup",
                 tagged("This run speedup", emulated), "Paper ms/cycle", tagged("This run ms/cycle", emulated),
                 "Paper H2D/token", "This run H2D/token"], rows))
            # the text's own figure where it states one (computed from rounded table values it can differ)
            papers = paper_headline(i.paper, pd_name, pw)
            run_gains = headline(run, lambda a, b, key=key: i.speedup(key[a], key[b]),
                                 lambda a, b, key=key: i.request_speedup(key[a], key[b]))
            gains = [[label, fmt(papers.get(claim), form), show(r, form, "×" if label.endswith("(×)") else "")]
                     for label, claim, r, form in run_gains]
            sec.tables.append(Table(tagged(f"Headline ratios, {d} vs paper {pd_name}, {name}", emulated),
                                    ["Quantity", "Paper", tagged("This run", emulated)], gains))
    if standing:
        sec.notes.append("Workloads are mapped by their config key `paper`: " + "; ".join(standing) + ".")
    if sec.tables:
        sec.missing = list(dict.fromkeys(sec.missing))
        sec.notes.append(interval_note(i.seed) + " The paper's figures carry no interval.")
    return sec
