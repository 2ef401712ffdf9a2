"""The paper's figures (paper_results.yaml) beside this run's: its cells under metrics.json keys, its headline ratios
computed by the same code as this run's, and `Beside`, what it has for one of its GPUs, section by section.
"""

from dataclasses import dataclass

from specfit.report.page import as_pct, pct_less, pct_more, ratio, share_of
from specfit.speculative.kinds import PAPER_KINDS

# paper_results.yaml counters -> metrics.json keys, so that paper and run go through the same code
PAPER_COUNTERS = {"draft_nodes": "draft_nodes_per_cycle", "committed": "committed_per_cycle", "cycles": "cycles",
                  "ms_per_cycle": "ms_per_cycle", "h2d_per_token": "h2d_per_token"}
PAPER_CACHE = {"cache": "cache", "nocache": "no_cache"}
PAPER_DEVICES = ("a100", "rtx4090")
PAPER_WORKLOADS = ("summarization", "gsm8k")  # the workload keys of paper_results.yaml
KINDS = PAPER_KINDS  # the paper's methods
CELLS = tuple((kind, mode) for mode in ("nocache", "cache") for kind in KINDS)  # Table 4's (method, cache), in order


def share_of_saving(c: dict, key: str) -> float | None:
    """How much of the time a SpecFit cycle saves against a cached EAGLE-3 cycle (ms/cycle) one part of the cycle
    (``key``, e.g. verify_ms_per_cycle) saves, in percent; NaN ("n/a") when SpecFit's cycle saves no time."""
    parts = [None if c.get((kind, "cache")) is None else c[kind, "cache"].get(k)
             for kind in ("eagle3", "specfit") for k in (key, "ms_per_cycle")]
    if any(p is None for p in parts):
        return None
    part_e, total_e, part_s, total_s = parts
    return share_of(part_e - part_s, total_e - total_s)


FIT, EAGLE = ("specfit", "cache"), ("eagle3", "cache")
# the paper's headline ratios: label, the key of its text claim (``text_claims``), how the two cells compare (tps: a
# TPS ratio, gain: its percent gain, less / more: how many percent one key lies below / above the other, share: a
# part's share of the time a cycle saves), numerator cell, denominator cell, metrics.json key
HEADLINE = (
    ("SpecFit over cached EAGLE-3 (%)", "vs_cached_eagle3_pct", "gain", FIT, EAGLE, "tps_dec"),
    ("SpecFit over cached EAGLE-3, prefill included: Request TPS (%)", "incl_prefill_pct", "gain", FIT, EAGLE,
     "tps_req"),
    ("SpecFit over vanilla EAGLE-3, no cache (%)", "vs_vanilla_eagle3_no_cache_pct", "gain", ("specfit", "nocache"),
     ("eagle3", "nocache"), "tps_dec"),
    ("SpecFit (cache) over AR without cache (×)", "vs_ar_x", "tps", FIT, ("ar", "nocache"), "tps_dec"),
    ("Vanilla EAGLE-3 over AR without cache (×)", "vanilla_eagle3_vs_ar_x", "tps", ("eagle3", "nocache"),
     ("ar", "nocache"), "tps_dec"),
    ("SpecFit commits fewer tokens per cycle than cached EAGLE-3 (%)", "fewer_committed_pct", "less", FIT, EAGLE,
     "committed_per_cycle"),
    ("SpecFit cycle shorter than cached EAGLE-3 (%)", "shorter_cycle_pct", "less", FIT, EAGLE, "ms_per_cycle"),
    ("Verification's share of the time SpecFit saves per cycle vs cached EAGLE-3 (%)",
     "verification_share_of_saving_pct", "share", FIT, EAGLE, "verify_ms_per_cycle"),
    ("SpecFit fewer H2D/token than cached EAGLE-3 (%)", "fewer_h2d_per_token_pct", "less", FIT, EAGLE,
     "h2d_per_token"),
    ("SpecFit more tokens per transfer than cached EAGLE-3 (%)", "tokens_per_transfer_advantage_pct", "more", EAGLE,
     FIT, "h2d_per_token"),
    ("SpecFit drafting time per cycle cut vs cached EAGLE-3 (%)", "drafting_time_cut_pct", "less", FIT, EAGLE,
     "draft_ms_per_cycle"),
)


def headline(c: dict, tps_ratio=None, req_ratio=None) -> list[tuple[str, str, float | object | None, str]]:
    """The paper's headline ratios (`HEADLINE`) from (kind, cache mode) cells, the same code for paper and run:
    label, text-claim key, value, format. ``tps_ratio(cell, cell)`` / ``req_ratio(cell, cell)`` give a run's ratio
    of decode / request TPS as an estimate with its interval; without them the ratio is a plain number (the paper's,
    whose cells have no request TPS: its text states that gain)."""

    def v(cell, key):
        return None if c.get(cell) is None else c[cell].get(key)

    out = []
    for label, claim, how, a, b, key in HEADLINE:
        given = tps_ratio if key == "tps_dec" else req_ratio
        if how in ("tps", "gain"):
            r = given(a, b) if given is not None else ratio(v(a, key), v(b, key))
            value = r if how == "tps" else as_pct(r)
        else:
            compare = {"less": pct_less, "more": pct_more}.get(how)
            value = compare(v(a, key), v(b, key)) if compare else share_of_saving(c, key)
        out.append((label, claim, value, ".2f" if how == "tps" else ".1f"))
    return out


@dataclass(frozen=True)
class Beside:
    """What the paper has for one of its GPUs, per section and paper workload: None (or {}) where it has nothing."""

    paper: dict  # paper_results.yaml
    gpu: str  # PAPER_DEVICES

    def cells(self, workload: str | None) -> dict | None:
        """(method kind, cache mode) -> the paper's figures for a paper workload, under metrics.json keys."""
        tps = self.paper["decode_tps"].get(self.gpu, {}).get(workload)
        counters = self.paper["counters"].get(self.gpu, {}).get(workload)
        if tps is None:
            return None
        out = {}
        for kind, mode in CELLS:
            out[kind, mode] = {"tps_dec": tps[kind][PAPER_CACHE[mode]]}
            if counters is not None:
                out[kind, mode] |= {PAPER_COUNTERS[k]: v for k, v in counters[kind][PAPER_CACHE[mode]].items()}
        return out

    def claims(self, workload: str | None) -> dict[str, float | None]:
        """The headline figures by text-claim key: the one its text states where it states one, else computed from
        its tables."""
        cells = self.cells(workload)
        if cells is None:
            return {}
        claims = self.paper["text_claims"].get(workload if self.gpu == "a100" else f"{self.gpu}_{workload}", {})
        return {claim: claims.get(claim, value) for _, claim, value, _ in headline(cells)}

    def sweep(self, workload: str | None, n_slots: int) -> dict | None:
        """Figure 4 (A100, summarization), its slot counts matched to this run's by rank (48, 24, 12, 0)."""
        sweep = self.paper["slot_sweep"]
        return sweep if (self.gpu, workload, n_slots) == ("a100", "summarization", len(sweep["slots"])) else None

    def table5(self, workload: str | None) -> dict | None:
        return self.paper["theory"].get(workload) if self.gpu == "a100" else None

    def selection_cost(self) -> dict | None:
        return self.paper["selection_cost"] if self.gpu == "a100" else None

    def routes(self, workload: str | None) -> dict | None:
        """Section 4.6's route-prediction figures (its 40 GSM8K questions on one GPU)."""
        routes = self.paper["route_prediction"]
        return routes if (self.gpu, workload) == (routes["device"], "gsm8k") else None
