"""The report's sections: per (model, device) `Group` (throughput, specfit-ca beyond the paper where configured
(`specfit.report.beyond`), counters, cache-size sweep, theory, calibration, selection cost, noisy routes, lossless
check) and per model `ModelView` (the devices side by side, the paper
beside this run, and the parts of the page in order).
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from specfit import paths
from specfit.report.beyond import beyond_the_paper
from specfit.report.inputs import (CACHE_AWARE_R2_GOAL, DRAFT_KEYS, LINK_EMULATED, LOSSLESS, METRICS, PAPER_PAIR,
                                   RESUMED, SPLIT_KEYS, THEORY, THEORY_CACHE_AWARE, TIMING_LABEL, TOKENS_PER_TRANSFER,
                                   Inputs, column, tokens_per_transfer, tps_cell)
from specfit.report.learned import learned_routes
from specfit.report.page import (EMULATED, MISSING, Part, Section, Table, as_pct, cache_cell, error_bar, fmt,
                                 interval_note, pct_less, pct_more, share_of, show, slug, tagged, x_cell, x_fmt)
from specfit.report.paper import (PAPER_DEVICES, PAPER_WORKLOADS, Roles, cells, comparison, paper_device,
                                  paper_headline, paper_workload, stand_ins)
from specfit.report.render import Figures
from specfit.workflow import (DecodeRun, method_config, method_rule, theory_cost, theory_file, theory_runs,
                              workload_ids)


def main_slots(spec: dict, model: str, device: str) -> int:
    return spec["models"][model]["main_slots"][device]


# ------------------------------------------------------------------------------------ per model and device
class Group:
    """The runs of one (model, device) and the sections about them."""

    def __init__(self, inputs: Inputs, figures: Figures, model: str, device: str):
        self.i, self.figures, self.model, self.device = inputs, figures, model, device
        self.spec = inputs.spec
        self.roles = Roles.of(self.spec)
        self.main = main_slots(self.spec, model, device)
        self.runs = [r for r in inputs.runs if (r.model, r.device) == (model, device)]
        self.workloads = [w for w in self.spec["workloads"] if any(r.workload == w for r in self.runs)]
        self.paper_gpu = paper_device(self.spec, device)
        self.stand_ins = stand_ins(self.spec, inputs.runs, self.roles, model, device)

    def paper_key(self, workload) -> str | None:
        """The paper's workload whose figures sit beside this workload's on this device (`stand_ins`), else None."""
        pw = paper_workload(self.spec, workload)
        return pw if pw is not None and self.stand_ins.get(pw) == workload else None

    def paper_figures(self, workload) -> dict:
        """The paper's headline figures (by text-claim key) for this device's GPU and the workload, {} if none."""
        pw = self.paper_key(workload)
        return {} if pw is None else paper_headline(self.i.paper, self.paper_gpu, pw)

    def runs_of(self, workload: str) -> list[DecodeRun]:
        order = list(self.spec["methods"])
        runs = [r for r in self.runs if r.workload == workload]
        return sorted(runs, key=lambda r: (r.slots > 0, order.index(r.method), -r.slots))

    def emulated(self, runs) -> bool:
        return any(self.i.metrics[r][LINK_EMULATED] for r in runs if r in self.i.metrics)

    def present_runs(self, sec: Section, runs: list[DecodeRun]) -> tuple[list[DecodeRun], bool]:
        """How a section opens on some runs: the metrics.json of those without go to its missing inputs. Returns
        the runs with metrics and whether any of them was timed over an emulated link."""
        sec.missing += self.i.missing(runs)
        present = [r for r in runs if r in self.i.metrics]
        return present, self.emulated(present)

    def m(self, workload, method, slots) -> dict | None:
        return None if method is None else self.i.run(self.model, self.device, workload, method, slots)

    def key(self, workload, method, slots) -> DecodeRun | None:
        return None if method is None else DecodeRun(self.model, self.device, workload, method, slots)

    def ar_nocache(self, workload) -> DecodeRun | None:
        return self.key(workload, self.roles.ar, 0)

    def ar_nocache_tps(self, workload) -> float | None:
        m = self.m(workload, self.roles.ar, 0)
        return None if m is None else m["tps_dec"]

    def workload_title(self, workload) -> str:
        """Where a table's numbers come from: model, device, workload and its subset label."""
        label = self.spec["workloads"][workload].get("subset_label", "")
        return f"{self.model} / {self.device}, {workload}" + (f" ({label})" if label else "")

    def sections(self) -> list[Section]:
        # the sections beyond the paper are None without their method (or runs of it on this device)
        return [s for s in (self.throughput(), beyond_the_paper(self), learned_routes(self), self.counters(),
                            self.sweep(), self.theory(), self.calibration(), self.selection_cost(),
                            self.noisy_routes(), self.lossless()) if s is not None]

    # 1. Figures 2 and 3
    def throughput(self) -> Section:
        sec = Section("Decode throughput with and without the expert cache (Figures 2 and 3)")
        for w in self.workloads:
            present, emulated = self.present_runs(sec, [r for r in self.runs_of(w) if r.slots in (0, self.main)])
            if not present:
                continue
            methods = [m for m in self.spec["methods"] if any(r.method == m for r in present)]
            fig, ax = plt.subplots(figsize=(6.4, 3.6))
            width = 0.8 / len(methods)
            for j, method in enumerate(methods):
                for x, slots in enumerate((self.main, 0)):
                    e = self.i.tps(self.key(w, method, slots))
                    if e is not None:
                        bar = ax.bar(x + (j - (len(methods) - 1) / 2) * width, e["value"], width, color=f"C{j}",
                                     yerr=error_bar(e), capsize=3, ecolor="0.25",
                                     label=method if not any(b.get_label() == method for b in ax.containers) else None)
                        ax.bar_label(bar, fmt="%.2f", fontsize=8, label_type="center")
            ax.set_xticks([0, 1], [f"With expert cache ({self.main} slots)", "Without expert cache"])
            ax.set_ylabel("Decode TPS (tokens/s)")
            ax.set_ylim(top=ax.get_ylim()[1] * 1.2)  # room for the legend above the bars
            ax.set_title(tagged(f"{self.model} / {self.device} / {w}: decode throughput", emulated), fontsize=9)
            ax.legend(fontsize=8, ncol=len(methods), loc="upper center")
            sec.figures.append(self.figures.save(fig, slug(self.model, self.device, w, "tps"),
                                                 tagged(f"Decode TPS with 95% bootstrap intervals, "
                                                        f"{self.workload_title(w)}", emulated)))
            ar = self.ar_nocache(w)
            sec.missing += self.i.missing_requests([*present, ar])
            rows = [[r.method, cache_cell(r.slots), tps_cell(self.i.tps(r)),
                     fmt(self.i.metrics[r]["tps_req"], METRICS["tps_req"].fmt),
                     x_cell(self.i.speedup(r, ar))] for r in present]
            sec.tables.append(Table(
                tagged(f"Throughput, {self.workload_title(w)}", emulated),
                ["Method", "Cache", column("tps_dec", emulated), column("tps_req", emulated),
                 tagged("Speedup over AR without cache", emulated)],
                rows))
            self.gains(sec, w, emulated)
        if sec.tables:
            sec.notes.append(interval_note(self.i.seed))
            sec.notes.append("Request TPS (Eq. 10, TPS_req) counts every output token over the whole request time, "
                             "prefill included; Decode TPS leaves the first token and prefill out.")
        return sec

    def gains(self, sec: Section, workload: str, emulated: bool) -> None:
        """SpecFit over EAGLE-3 at the same cache, in decode TPS and in request TPS (prefill included)."""
        eagle, fit = self.roles.eagle3, self.roles.specfit
        if eagle is None or fit is None:
            return
        paper = self.paper_figures(workload)
        rows = []
        for slots, claim_dec, claim_req in ((self.main, "vs_cached_eagle3_pct", "incl_prefill_pct"),
                                            (0, "vs_vanilla_eagle3_no_cache_pct", None)):
            num, den = self.key(workload, fit, slots), self.key(workload, eagle, slots)
            if num not in self.i.metrics or den not in self.i.metrics:
                continue
            sec.missing += self.i.missing_requests([num, den])
            row = [cache_cell(slots), show(as_pct(self.i.speedup(num, den)), ".1f"),
                   show(as_pct(self.i.request_speedup(num, den)), ".1f")]
            if paper:
                row += [fmt(paper.get(claim_dec), ".1f"), fmt(paper.get(claim_req) if claim_req else None, ".1f")]
            rows.append(row)
        if rows:
            header = ["Cache", tagged(f"{fit} over {eagle}, Decode TPS (%)", emulated),
                      tagged(f"{fit} over {eagle}, Request TPS, prefill included (%)", emulated)]
            if paper:
                header += [f"Paper {self.paper_gpu}, Decode TPS (%)", f"Paper {self.paper_gpu}, prefill included (%)"]
            sec.tables.append(Table(tagged(f"Gains at the same cache, {self.workload_title(workload)}", emulated),
                                    header, rows))

    # 2. Tables 2 and 3
    def counters(self) -> Section:
        sec = Section("Verification and transfer counters (Tables 2 and 3)")
        keys = ("draft_nodes_per_cycle", "committed_per_cycle", *SPLIT_KEYS, "cycles", "ms_per_cycle",
                "h2d_per_token", "draft_ms_per_cycle", "verify_ms_per_cycle")
        saving = False
        for w in self.workloads:
            present, emulated = self.present_runs(sec, self.runs_of(w))
            if not present:
                continue
            rows = []
            for r in present:
                m = self.i.metrics[r]
                is_ar = method_rule(self.spec, r.method) == "ar"
                rows.append([r.method, cache_cell(r.slots)] + [
                    MISSING if is_ar and k in DRAFT_KEYS else fmt(m.get(k), METRICS[k].fmt) for k in keys])
            sec.tables.append(Table(tagged(f"Counters per verification cycle, {self.workload_title(w)}", emulated),
                                    ["Method", "Cache"] + [column(k, emulated) for k in keys], rows))
            self.transfers(sec, w, present)
            saving |= self.time_saved(sec, w)
        if saving:
            sec.notes.append("Time saved per cycle: each part's mean ms per cycle (drafting and verification as "
                             "timed, the rest what ms/cycle leaves); a part's share is its drop over the drop in "
                             "ms/cycle (n/a when SpecFit's cycle is not shorter), as the paper's 78.3% for "
                             "verification on summarization.")
        if sec.tables:
            sec.notes.append("Cache: 'Yes (n)' = n expert slots per layer; 'No' = cache cleared before every target "
                             "forward. H2D/token counts expert transfers per output token, prefill included; "
                             f"{TOKENS_PER_TRANSFER} is its inverse, output tokens per H2D expert transfer over whole "
                             "requests (the paper's token-per-transfer, Section 4.4).")
            sec.notes.append("Fresh / repeated cycles: a cycle is repeated when the output 4-gram ending at its first "
                             "committed token already occurred earlier in the output (a loop; the prompt does not "
                             "count), fresh otherwise; 'Committed, fresh / repeated cycles' are the mean committed "
                             "tokens of each kind, so loops can be read apart from fresh text.")
        return sec

    def transfers(self, sec: Section, workload: str, present: list[DecodeRun]) -> None:
        """Tokens per transfer of every run, and SpecFit's over EAGLE-3's at the same slot count."""
        eagle = self.roles.eagle3
        rows = []
        for r in present:
            m = self.i.metrics[r]
            base = self.m(workload, eagle, r.slots) if r.method != eagle else None
            rows.append([r.method, cache_cell(r.slots), fmt(m.get("h2d_per_token"), METRICS["h2d_per_token"].fmt),
                         fmt(tokens_per_transfer(m), ".4f"),
                         fmt(pct_more(tokens_per_transfer(m), tokens_per_transfer(base)), ".1f")])
        sec.tables.append(Table(f"Tokens per transfer, {self.workload_title(workload)}",
                                ["Method", "Cache", column("h2d_per_token", False), TOKENS_PER_TRANSFER,
                                 f"Tokens per transfer over {eagle} at the same cache (%)"], rows))

    def time_saved(self, sec: Section, workload: str) -> bool:
        """Where the time a SpecFit cycle saves against a cached EAGLE-3 cycle comes from (section 4.2: verification
        accounts for 78.3% of it on summarization): each part's drop over the drop in ms/cycle."""
        runs = [self.key(workload, m, self.main) for m in (self.roles.eagle3, self.roles.specfit)]
        if None in runs or any(r not in self.i.metrics for r in runs):
            return False
        e, s = (self.i.metrics[r] for r in runs)
        keys = ("ms_per_cycle", "draft_ms_per_cycle", "verify_ms_per_cycle")
        if any(m.get(k) is None for m in (e, s) for k in keys):
            return False
        (total_e, draft_e, verify_e), (total_s, draft_s, verify_s) = ([m[k] for k in keys] for m in (e, s))
        saved = total_e - total_s
        paper = self.paper_figures(workload)
        rows = []
        for label, a, b, claim_cut, claim_share in (
                ("Whole cycle (ms/cycle)", total_e, total_s, "shorter_cycle_pct", None),
                ("Drafting", draft_e, draft_s, "drafting_time_cut_pct", None),
                ("Verification (target forward)", verify_e, verify_s, None, "verification_share_of_saving_pct"),
                ("Rest (selection, commit, synchronization)", total_e - draft_e - verify_e,
                 total_s - draft_s - verify_s, None, None)):
            row = [label, fmt(a, ".2f"), fmt(b, ".2f"), fmt(a - b, ".2f"), fmt(pct_less(b, a), ".1f"),
                   fmt(share_of(a - b, saved), ".1f")]
            if paper:
                row += [fmt(paper.get(claim_cut) if claim_cut else None, ".1f"),
                        fmt(paper.get(claim_share) if claim_share else None, ".1f")]
            rows.append(row)
        emulated = self.emulated(runs)
        header = ["Part of the cycle", tagged(f"{runs[0].method} ms", emulated),
                  tagged(f"{runs[1].method} ms", emulated), tagged("Saved ms", emulated), tagged("Cut (%)", emulated),
                  tagged("Share of the time saved (%)", emulated)]
        if paper:
            header += [f"Paper {self.paper_gpu} cut (%)", f"Paper {self.paper_gpu} share of the time saved (%)"]
        sec.tables.append(Table(tagged(f"Time saved per cycle, {runs[1].method} vs {runs[0].method} with the cache "
                                       f"({self.main} slots), {self.workload_title(workload)}", emulated),
                                header, rows))
        return True

    # 3. Figure 4
    def sweep(self) -> Section:
        sec = Section("Cache-size sweep (Figure 4)")
        pair = (self.roles.eagle3, self.roles.specfit)
        paper = self.i.paper["slot_sweep"]
        for w in self.workloads:
            slots = {m: sorted({r.slots for r in self.runs_of(w) if r.method == m}, reverse=True) for m in pair if m}
            if len(slots) < 2 or min(len(s) for s in slots.values()) < 3:
                continue
            common = sorted(set(slots[pair[0]]) & set(slots[pair[1]]), key=lambda s: (s == 0, -s))
            runs = [DecodeRun(self.model, self.device, w, m, s) for m in pair for s in common]
            present, emulated = self.present_runs(sec, runs)
            if not present:
                continue
            val = {(m, s): self.m(w, m, s) for m in pair for s in common}

            def get(m, s, k):
                return None if val[m, s] is None else val[m, s][k]

            def per_transfer(m, s):
                return tokens_per_transfer(val[m, s])

            # the paper's Figure 4 (A100, summarization), slot counts matched by rank (48, 24, 12, 0)
            with_paper = (self.paper_gpu == "a100" and self.paper_key(w) == "summarization"
                          and len(common) == len(paper["slots"]))
            sec.missing += self.i.missing_requests(runs)
            tps = {(m, s): self.i.tps(self.key(w, m, s)) for m in pair for s in common}
            rows, cost_rows = [], []
            for j, s in enumerate(common):
                gain = as_pct(self.i.speedup(self.key(w, pair[1], s), self.key(w, pair[0], s)))
                row = [str(s), tps_cell(tps[pair[0], s]), tps_cell(tps[pair[1], s]), show(gain, ".1f")]
                cost = [str(s), fmt(get(pair[0], s, "ms_per_cycle"), ".1f"), fmt(get(pair[1], s, "ms_per_cycle"), ".1f"),
                        fmt(pct_less(get(pair[1], s, "ms_per_cycle"), get(pair[0], s, "ms_per_cycle")), ".1f"),
                        fmt(get(pair[0], s, "h2d_per_token"), ".1f"), fmt(get(pair[1], s, "h2d_per_token"), ".1f"),
                        fmt(per_transfer(pair[0], s), ".4f"), fmt(per_transfer(pair[1], s), ".4f"),
                        fmt(pct_more(per_transfer(pair[1], s), per_transfer(pair[0], s)), ".1f")]
                if with_paper:
                    p_ms = [paper["ms_per_cycle"][m][j] for m in ("eagle3", "specfit")]
                    p_h2d = [paper["h2d_per_token"][m][j] for m in ("eagle3", "specfit")]
                    stated = paper["tokens_per_transfer_advantage_pct"][j]
                    row += [str(paper["slots"][j]), fmt(paper["decode_tps"]["eagle3"][j], ".2f"),
                            fmt(paper["decode_tps"]["specfit"][j], ".2f"), fmt(paper["specfit_gain_pct"][j], ".1f")]
                    cost += [str(paper["slots"][j]), fmt(p_ms[0], ".1f"), fmt(p_ms[1], ".1f"),
                             fmt(pct_less(p_ms[1], p_ms[0]), ".1f"), fmt(p_h2d[0], ".1f"), fmt(p_h2d[1], ".1f"),
                             fmt(stated if stated is not None else pct_more(p_h2d[0], p_h2d[1]), ".1f")]
                rows.append(row)
                cost_rows.append(cost)
            header = ["Slots", tagged(f"{pair[0]} Decode TPS", emulated), tagged(f"{pair[1]} Decode TPS", emulated),
                      tagged(f"{pair[1]} gain over {pair[0]} (%)", emulated)]
            cost_header = ["Slots", tagged(f"{pair[0]} ms/cycle", emulated), tagged(f"{pair[1]} ms/cycle", emulated),
                           tagged(f"{pair[1]} cycle shorter (%)", emulated), f"{pair[0]} H2D/token",
                           f"{pair[1]} H2D/token", f"{pair[0]} {TOKENS_PER_TRANSFER}", f"{pair[1]} {TOKENS_PER_TRANSFER}",
                           f"{pair[1]} tokens per transfer over {pair[0]} (%)"]
            if with_paper:
                header += ["Paper slots (A100, by rank)", "Paper EAGLE-3 Decode TPS", "Paper SpecFit Decode TPS",
                           "Paper gain (%)"]
                cost_header += ["Paper slots (A100, by rank)", "Paper EAGLE-3 ms/cycle", "Paper SpecFit ms/cycle",
                                "Paper cycle shorter (%)", "Paper EAGLE-3 H2D/token", "Paper SpecFit H2D/token",
                                "Paper tokens per transfer over EAGLE-3 (%)"]
            sec.tables.append(Table(tagged(f"Slot sweep, {self.workload_title(w)} (0 = no cache)", emulated),
                                    header, rows))
            sec.tables.append(Table(tagged(f"Cycle time and transfers per slot count, {self.workload_title(w)} "
                                           "(0 = no cache)", emulated), cost_header, cost_rows))
            panels = (("tps_dec", column("tps_dec", emulated)), ("ms_per_cycle", column("ms_per_cycle", emulated)),
                      ("h2d_per_token", column("h2d_per_token", False)), (TOKENS_PER_TRANSFER, TOKENS_PER_TRANSFER))
            fig, axes = plt.subplots(1, len(panels), figsize=(14, 3.4))
            xs = range(len(common))
            for j, m in enumerate(pair):
                for ax, (key, _) in zip(axes, panels):
                    ys = [per_transfer(m, s) if key == TOKENS_PER_TRANSFER else get(m, s, key) for s in common]
                    ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None],
                            marker="o", color=f"C{j + 1}", label=m)
                    if key == "tps_dec":  # the 95% bootstrap intervals
                        for x, s in zip(xs, common):
                            if (bar := error_bar(tps[m, s])) is not None:
                                ax.errorbar([x], [tps[m, s]["value"]], yerr=bar, color=f"C{j + 1}", capsize=3)
            for ax, (_, title) in zip(axes, panels):
                ax.set_xticks(list(xs), [str(s) for s in common])
                ax.set_xlabel("Expert slots per layer")
                ax.set_title(title, fontsize=9)
                ax.legend(fontsize=8)
            fig.suptitle(tagged(f"{self.model} / {self.device} / {w}: (a) decode TPS, (b) ms/cycle, H2D/token and "
                                "tokens per transfer vs slots", emulated), fontsize=9)
            sec.figures.append(self.figures.save(fig, slug(self.model, self.device, w, "sweep"),
                                                 tagged(f"Slot sweep, {self.workload_title(w)}", emulated)))
        if sec.tables:
            sec.notes.append(interval_note(self.i.seed))
            sec.notes.append(f"{TOKENS_PER_TRANSFER}: output tokens per H2D expert transfer over whole requests, "
                             "prefill included (1 / H2D/token), as the paper's full-request token-per-transfer "
                             "advantages (Section 4.4: 28.3%, 42.7% and 49.5% at 48, 24 and 12 slots; at 0 slots "
                             "computed from Figure 4b).")
        elif not sec.missing:
            sec.notes.append(f"No workload has at least three slot values for both {pair[0]} and {pair[1]}.")
        return sec

    # 5. Table 5
    def theory(self) -> Section:
        sec = Section("Selection theory on the recorded pools (Table 5)")
        runs = [r for r in theory_runs(self.spec) if (r.model, r.device) == (self.model, self.device)]
        sec.missing += [theory_file(self.spec, r) for r in runs if r not in self.i.theory]
        present = [r for r in runs if r in self.i.theory]
        if not runs:
            sec.notes.append("No SpecFit run with exact routes at the main slot count: nothing to evaluate.")
        if paper := [r for r in present if theory_cost(self.spec, r) == "paper"]:
            self.theory_paper(sec, paper)
        if cache_aware := [r for r in present if theory_cost(self.spec, r) == "cache_aware"]:
            self.theory_cache_aware(sec, cache_aware)
        return sec

    def theory_paper(self, sec: Section, runs: list[DecodeRun]) -> None:
        """Table 5 on SpecFit's pools under the paper's cost, beside the paper's."""
        table5 = self.i.paper["theory"] if self.paper_gpu == "a100" else {}
        paper = {r.workload: table5[self.paper_key(r.workload)] for r in runs if self.paper_key(r.workload) in table5}
        header = ["Quantity"]
        for r in runs:
            pw = self.paper_key(r.workload)
            header += [r.workload] + ([f"paper ({pw})" if pw != r.workload else "paper"] if r.workload in paper else [])
        rows = []
        for row in THEORY:
            cells = [row.label]
            for r in runs:
                cells.append(" / ".join(fmt(self.i.theory[r][k], row.fmt) for k in row.keys))
                if r.workload in paper:
                    value = None if row.paper is None else paper[r.workload][row.paper]
                    cells.append(" / ".join(fmt(value[k], row.fmt) for k in PAPER_PAIR) if isinstance(value, dict)
                                 else fmt(value, row.fmt))
            rows.append(cells)
        sec.tables.append(Table(f"Theory on the pools SpecFit recorded with the cache ({self.main} slots), "
                                f"{self.model} / {self.device}, with the with-cache coefficients", header, rows))
        sec.notes.append("Percentages of λ* refer to the predicted throughput. Every recorded cycle counts, the ones "
                         "at the length limit that drafted nothing included. A cycle stopped early when it drafted "
                         "fewer levels than it could: the pool's depth, or, near the length limit, the levels the "
                         "room left allowed; a cycle the limit capped that drafted up to its cap did not stop."
                         + (" Paper: Table 5 (A100; its row counts cycles stopped before level 5)." if paper else ""))

    def theory_cache_aware(self, sec: Section, runs: list[DecodeRun]) -> None:
        """Beyond the paper: the same quantities on specfit-ca's pools under the cache-aware cost it selects with."""
        methods = sorted({r.method for r in runs})
        header = ["Quantity"] + [r.workload if len(methods) == 1 else f"{r.workload}, {r.method}" for r in runs]
        rows = [[row.label] + [" / ".join(fmt(self.i.theory[r][k], row.fmt) for k in row.keys) for r in runs]
                for row in (*THEORY, *THEORY_CACHE_AWARE)]
        sec.tables.append(Table(f"Beyond the paper: theory on the pools {', '.join(methods)} recorded with the cache "
                                f"({self.main} slots) under the cache-aware cost T(S) = b_|S| + D(d) + β_miss M(S) + "
                                f"β_hit H(S), {self.model} / {self.device}", header, rows))
        sec.notes.append("Beyond the paper: the quantities of Table 5 under the cost specfit-ca selects with, from the "
                         "with-cache calibration's cache-aware fit without drafting. M(S) counts the experts of the "
                         "selection's per-layer union that the layer's cache did not hold as the cycle selected (each "
                         "cycle records that residency), H(S) those it held, and D(d) what drafting the cycle's d "
                         "levels costs (the calibration's drafting fit). \"2β\" doubles β_miss and β_hit, not the "
                         "intercepts b_|S| + D(d). A cycle in which specfit-ca skipped drafting records the residency "
                         "too (read off the timers) and is priced as the root alone with its atlas routes; one the "
                         "length limit left without room records none and is priced with nothing resident. A skipped "
                         "cycle counts as stopped early. λ* and Θ are predicted under this cost on specfit-ca's own "
                         "trajectory: not comparable with those of the paper's model.")

    # 6. Appendix B
    def calibration(self) -> Section:
        sec = Section("Calibration fit T(S) = b_|S| + β F(S) (Appendix B)")
        pd_name = paper_device(self.spec, self.device)
        paper = self.i.paper["coefficients_ms"][pd_name]
        fits = {}
        for mode in paths.CACHE_MODES:
            key = (self.model, self.device, mode)
            if key in self.i.calibration:
                fits[mode] = self.i.calibration[key]
            else:
                sec.missing.append(paths.calibration(self.model, self.device, mode))
        if not fits:
            return sec
        names = {"cache": "With cache", "nocache": "Without cache"}
        header = ["Coefficient"] + [tagged(f"{names[mode]} ({fit['slots']} slots)", fit["link_emulated"])
                                    for mode, fit in fits.items()]
        header += [f"Paper {pd_name}, with cache", f"Paper {pd_name}, without cache"]
        paper_fits = [paper["cache"], paper["no_cache"]]
        n_b = max(len(f["b"]) for f in fits.values())
        rows = []
        for k in range(n_b):
            rows.append([f"b_{k} (ms)"] + [fmt(f["b"][k], ".3f") if k < len(f["b"]) else MISSING for f in fits.values()]
                        + [fmt(p["b"][k], ".3f") if k < len(p["b"]) else MISSING for p in paper_fits])
        rows.append(["β (ms per expert)"] + [fmt(f["beta"], ".4f") for f in fits.values()]
                    + [fmt(p["beta"], ".4f") for p in paper_fits])
        rows.append(["R²"] + [fmt(f["r2"], ".4f") for f in fits.values()] + [MISSING] * 2)
        rows.append(["RMSE (ms)"] + [fmt(f["rmse_ms"], ".2f") for f in fits.values()] + [MISSING] * 2)
        rows.append(["Points"] + [fmt(f["n_points"], "d") for f in fits.values()] + ["144"] * 2)
        rows.append(["Source"] + [str(f["source"]) for f in fits.values()] + ["paper"] * 2)
        emulated = any(f["link_emulated"] for f in fits.values())
        sec.tables.append(Table(tagged(f"Cost coefficients, {self.model} / {self.device}", emulated), header, rows))
        self.calibration_cache_aware(sec, fits, names, n_b)
        frames = {mode: self.i.points[self.model, self.device, mode] for mode in fits
                  if (self.model, self.device, mode) in self.i.points}
        sec.missing += [paths.calibration_points(self.model, self.device, mode) for mode in fits
                        if mode not in frames and fits[mode]["source"] == "fit"]
        if frames:
            fig, ax = plt.subplots(figsize=(5, 4.2))
            lo = min(min(f["y_ms"].min(), f["pred_ms"].min()) for f in frames.values())
            hi = max(max(f["y_ms"].max(), f["pred_ms"].max()) for f in frames.values())
            ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--", label="y = prediction")
            for j, (mode, frame) in enumerate(frames.items()):
                ax.scatter(frame["pred_ms"], frame["y_ms"], s=12, color=f"C{j}", alpha=0.7, label=names[mode])
            ax.set_xlabel("Predicted cycle time (ms)")
            ax.set_ylabel("Measured cycle time (ms)")
            ax.set_title(tagged(f"{self.model} / {self.device}: calibration probes", emulated), fontsize=9)
            ax.legend(fontsize=8)
            sec.figures.append(self.figures.save(fig, slug(self.model, self.device, "calibration"),
                                                 tagged(f"Calibration, {self.model} / {self.device}: measured vs "
                                                        "predicted cycle time", emulated)))
        return sec

    def calibration_cache_aware(self, sec: Section, fits: dict, names: dict, n_b: int) -> None:
        """The cache-aware model T(S) = b_|S| + β_miss M(S) + β_hit H(S) (issue 12) beside the paper's, fitted on
        the same probes, and the drafting time of one level."""
        header = ["Quantity"] + [tagged(f"{names[mode]} ({fit['slots']} slots)", fit["link_emulated"])
                                 for mode, fit in fits.items()]
        cas = [f["cache_aware"] for f in fits.values()]

        def ca_row(label, get):
            return [label] + [MISSING if ca is None else get(ca) for ca in cas]

        rows = [ca_row(f"b_{k} (ms)", lambda ca, k=k: fmt(ca["b"][k], ".3f") if k < len(ca["b"]) else MISSING)
                for k in range(n_b)]
        rows.append(ca_row("β_miss (ms per copied expert)", lambda ca: fmt(ca["beta_miss"], ".4f")))
        rows.append(ca_row("β_hit (ms per resident expert)", lambda ca: fmt(ca["beta_hit"], ".4f")
                           + ("" if ca["beta_hit_identified"] else " (not identified: no hits)")))
        rows.append(ca_row("R², cache-aware, on the probe means", lambda ca: fmt(ca["r2_means"], ".4f")))
        rows.append(["R², b + β F, on the probe means"] + [fmt(f["r2"], ".4f") for f in fits.values()])
        rows.append(ca_row("R², cache-aware, per repeat (fitted)", lambda ca: fmt(ca["r2"], ".4f")))
        rows.append(ca_row("RMSE (ms), cache-aware, on the probe means", lambda ca: fmt(ca["rmse_means_ms"], ".2f")))
        rows.append(["RMSE (ms), b + β F, on the probe means"] + [fmt(f["rmse_ms"], ".2f") for f in fits.values()])
        rows.append(ca_row("Points (probes / repeats)", lambda ca: f"{ca['n_probes']} / {ca['n_points']}"))
        rows.append(["Drafting cost D(d): start / further level / selection (ms)"] + [
            MISSING if d is None else f"{d['start_ms']:.3f} / {d['level_ms']:.3f} / {d['select_ms']:.3f}"
            for d in (f["drafting"] for f in fits.values())])
        goal = []
        for mode, f in fits.items():
            ca = f["cache_aware"]
            if mode != "cache" or ca is None:
                goal.append(MISSING)
            else:
                goal.append(f"{'met' if ca['r2_means'] >= CACHE_AWARE_R2_GOAL else 'not met'} "
                            f"(R² {ca['r2_means']:.3f})")
        rows.append([f"Goal: R² ≥ {CACHE_AWARE_R2_GOAL} with the cache"] + goal)
        emulated = any(f["link_emulated"] for f in fits.values())
        caption = (f"Cache-aware cost T(S) = b_|S| + β_miss M(S) + β_hit H(S) beside b_|S| + β F(S), "
                   f"{self.model} / {self.device}")
        sec.tables.append(Table(tagged(caption, emulated), header, rows))
        if "cache" in fits and fits["cache"]["cache_aware"] is not None:
            ca = fits["cache"]["cache_aware"]
            verdict = "met" if ca["r2_means"] >= CACHE_AWARE_R2_GOAL else "not met"
            sec.notes.append(
                f"Goal of issue 12, {self.model} / {self.device}: the cache-aware model explains the with-cache probe "
                f"times with R² ≥ {CACHE_AWARE_R2_GOAL} on the probe means (the points of the paper model's R²): "
                f"{verdict} (R² {ca['r2_means']:.3f}; b + β F: {fits['cache']['r2']:.3f}).")
        sec.notes.append("M(S): the union's experts the verify forward copies (not resident in the layer's cache "
                         "when it starts), H(S): the resident ones, summed over layers (M + H = F). The cache-aware "
                         "model is fitted on one point per repeat of each probe (the repeats meet different caches), "
                         "the paper's on the probe means; both are scored on the means. "
                         "The cache-aware method prices d drafted levels at D(d) = start + (d − 1)·level + "
                         "d·selection: start (the catch-up forward, which also gives level 1) and level by NNLS on "
                         "the probes' drafting times, selection its own selection, which each probe runs after "
                         "every level it drafts, timed apart. Without the cache every expert is a miss, so β_hit "
                         "is not identified there.")

    # 7. section 4.6, selection cost
    def selection_cost(self) -> Section:
        sec = Section("Selection cost (section 4.6)")
        paper = self.i.paper["selection_cost"] if self.paper_gpu == "a100" else None
        rows = []
        emulated = False
        for w in self.workloads:
            present, any_emulated = self.present_runs(
                sec, [r for r in self.runs_of(w) if method_rule(self.spec, r.method) == "specfit"])
            emulated |= any_emulated
            for r in present:
                m = self.i.metrics[r]
                pw = self.paper_key(w)
                is_main = r.method == self.roles.specfit and r.slots == self.main and paper is not None
                rows.append([w, r.method, cache_cell(r.slots), fmt(m["select_ms_median"], ".2f"),
                             fmt(m["select_share_pct"], ".2f"),
                             fmt(paper["median_ms_per_cycle"].get(pw), ".2f") if is_main else MISSING,
                             fmt(paper["share_of_decode_time_pct"].get(pw), ".1f") if is_main else MISSING])
        if rows:
            sec.tables.append(Table(tagged("Selector time per cycle, included in every measured throughput", emulated),
                                    ["Workload", "Method", "Cache", column("select_ms_median", emulated),
                                     column("select_share_pct", emulated), "Paper median ms (A100)",
                                     "Paper share (%)"], rows))
        return sec

    # 8. section 4.6, noisy routes
    def noisy_routes(self) -> Section:
        sec = Section("Sensitivity to route-prediction errors (section 4.6)")
        paper = self.i.paper["route_prediction"]
        q = paper["questions"]
        paper_ids = list(range(q["start"], q["stop"] + 1, q["step"]))
        paper_label = (f"Paper speedup ({paper['device'].upper()}, {paper['questions_label']}; noisy: "
                       f"{paper['accuracy_pct']:g}% accuracy)")
        for w in self.workloads:
            noisy = [r for r in self.runs_of(w) if r.method in self.roles.noisy]
            if not noisy:
                continue
            ar = self.ar_nocache(w)
            if self.ar_nocache_tps(w) is None:
                sec.missing += self.i.missing([DecodeRun(self.model, self.device, w, self.roles.ar or "ar", 0)])
            with_paper = self.paper_gpu == paper["device"] and paper_workload(self.spec, w) == "gsm8k"
            rows, runs = [], []
            for r in noisy:
                accuracy = method_config(self.spec, r.method).accuracy
                pairs = [(r, f"noisy, accuracy {accuracy}", paper["simulated_60pct_speedup"])]
                if self.roles.specfit:
                    exact = DecodeRun(self.model, self.device, w, self.roles.specfit, r.slots)
                    pairs.insert(0, (exact, "exact (atlas)", paper["exact_routes_speedup"]))
                for run, kind, paper_x in pairs:
                    if run not in self.runs:
                        continue
                    runs.append(run)
                    sec.missing += self.i.missing([run])
                    shown = with_paper and run.slots == self.main
                    rows.append([run.method, kind, cache_cell(run.slots), tps_cell(self.i.tps(run)),
                                 x_cell(self.i.speedup(run, ar)), x_fmt(paper_x) if shown else MISSING])
            if not any(r in self.i.metrics for r in runs):
                continue
            sec.missing += self.i.missing_requests([*runs, ar])
            emulated = self.emulated(runs)
            sec.tables.append(Table(tagged(f"Exact vs noisy routes, {self.workload_title(w)}", emulated),
                                    ["Method", "Routes", "Cache", column("tps_dec", emulated),
                                     tagged("Speedup over AR without cache", emulated), paper_label],
                                    rows))
            wl = self.spec["workloads"][w]
            if with_paper and (workload_ids(self.spec, w) != paper_ids or wl.get("max_requests")):
                sec.notes.append(f"{w} does not run the paper's {paper['questions_label']}: its speedups sit "
                                 "beside the paper's for orientation only.")
        if not self.roles.noisy:
            sec.notes.append("No method with noisy routes is configured.")
        if sec.tables:
            sec.notes.append(f"The paper's figures: {paper['source']}.")
            sec.notes.append(interval_note(self.i.seed))
        return sec

    # 9. lossless check
    def lossless(self) -> Section:
        sec = Section("Lossless check: each run's outputs against the AR reference")
        rows, divergences = [], []
        for w in self.workloads:
            present, _ = self.present_runs(sec, self.runs_of(w))
            for r in present:
                m = self.i.metrics[r]
                check = m[LOSSLESS]
                common = [w, r.method, cache_cell(r.slots), fmt(m["n_requests"], "d"), fmt(m["n_output_tokens"], "d"),
                          str(m[TIMING_LABEL]), "yes" if m.get(RESUMED) else "no"]
                if check is None:
                    rows.append(common + ["(this run is the reference)", MISSING, MISSING, "reference"])
                    continue
                divs = check.get("divergences") or []
                rows.append(common + [str(check["reference"]), identical_cell(check), diverged_cell(divs),
                                      lossless_verdict(check)])
                for d in divs:
                    divergences.append([w, r.method, cache_cell(r.slots), str(d["request_id"]), str(d["position"]),
                                        fmt(d.get("ours"), "d"), fmt(d.get("reference"), "d"),
                                        fmt(d["margin"], ".4g")])
        if rows:
            sec.tables.append(Table("Lossless check per run", ["Workload", "Method", "Cache", "Requests",
                                                                "Output tokens", "Timing", "Resumed", "Reference",
                                                                "Identical to the reference",
                                                                "Not identical (first divergence, top-2 margin)",
                                                                "Verdict"], rows))
        if divergences:
            sec.tables.append(Table("Every divergence: first differing output position, the tokens there, and the "
                                    "target's top-2 logit margin on the reference's prefix (a small margin points to "
                                    "a numerical near-tie, not a bug)",
                                    ["Workload", "Method", "Cache", "Request", "Position", "This run's token",
                                     "Reference token", "Top-2 margin"], divergences))
            sec.notes.append("A run with a divergence is not lossless on that request: its verdict says how many "
                             "requests diverged, and the requests not listed are identical token for token.")
        elif rows:
            sec.notes.append("No divergences: every checked request matches its reference token for token.")
        return sec


def identical_cell(check: dict) -> str:
    """"identical: x of n requests", and the requests the check could not compare."""
    text = f"identical: {check['n_identical']} of {check['n_requests']} requests"
    if check.get("missing"):
        text += f" ({check['missing']} more without a reference output, not compared)"
    return text


def diverged_cell(divergences: list[dict]) -> str:
    if not divergences:
        return "none"
    return "; ".join(f"request {d['request_id']} (position {d['position']}, margin {fmt(d['margin'], '.4g')})"
                     for d in divergences)


def lossless_verdict(check: dict) -> str:
    """Lossless only when every request was compared and is identical; a divergence is never "lossless"."""
    divs = check.get("divergences") or []
    n, same = check["n_requests"], check["n_identical"]
    if divs or same < n:
        return f"diverges: {n - same} of {n} requests differ from the reference"
    if check.get("missing"):
        return f"identical on the {n} requests compared; {check['missing']} not compared"
    return f"lossless: all {n} requests identical"


# ------------------------------------------------------------------------------------ per model
class ModelView:
    """One model's runs: a part per device (`Group`), then the devices side by side and the paper beside them."""

    def __init__(self, inputs: Inputs, figures: Figures, model: str):
        self.i, self.figures, self.model, self.spec = inputs, figures, model, inputs.spec
        self.roles = Roles.of(self.spec)
        devices = [d for d in self.spec["devices"] if any(r.model == model and r.device == d for r in inputs.runs)]
        self.devices = sorted(devices, key=lambda d: PAPER_DEVICES.index(paper_device(self.spec, d)))

    def run_cells(self, device: str, workload: str) -> dict:
        def get(rule, method, mode, slots):
            return None if method is None else self.i.run(self.model, device, workload, method, slots)

        return cells(get, self.roles, main_slots(self.spec, self.model, device))

    def run_keys(self, device: str, workload: str) -> dict:
        """(method rule, cache mode) -> the DecodeRun behind `run_cells`' entry (None: no such method)."""
        def get(rule, method, mode, slots):
            return None if method is None else DecodeRun(self.model, device, workload, method, slots)

        return cells(get, self.roles, main_slots(self.spec, self.model, device))

    def emulated(self, device) -> bool:
        return any(m[LINK_EMULATED] for r, m in self.i.metrics.items() if (r.model, r.device) == (self.model, device))

    # 4. Table 4
    def workload_on(self, device: str, group: str) -> str | None:
        """The workload of ``device`` in a side-by-side group: the device's stand-in for the paper's workload
        ``group`` (`stand_ins`: gsm8k on the A100, gsm8k-odd on the RTX 4090), else the workload named ``group``."""
        if group in PAPER_WORKLOADS:
            return stand_ins(self.spec, self.i.runs, self.roles, self.model, device).get(group)
        if any(r.model == self.model and r.device == device and r.workload == group for r in self.i.runs):
            return group
        return None

    def devices_side_by_side(self) -> Section | None:
        if len(self.devices) < 2:
            return None
        sec = Section("Devices side by side (Table 4 style)")
        keys = ("tps_dec", "draft_nodes_per_cycle", "committed_per_cycle", "cycles", "ms_per_cycle", "h2d_per_token")
        groups = list(dict.fromkeys(paper_workload(self.spec, w) or w for w in self.spec["workloads"]))
        for group in groups:
            on = {d: w for d in self.devices if (w := self.workload_on(d, group)) is not None}
            if len(on) < 2:
                continue
            emulated = any(self.emulated(d) for d in on)
            rows = []
            for d, w in on.items():
                c, key = self.run_cells(d, w), self.run_keys(d, w)
                for mode in ("nocache", "cache"):
                    for rule in ("ar", "eagle3", "specfit"):
                        m = c[rule, mode]
                        if m is None:
                            continue
                        sec.missing += self.i.missing_requests([key[rule, mode], key["ar", "nocache"]])
                        slots = main_slots(self.spec, self.model, d) if mode == "cache" else 0
                        rows.append([d, w, rule, cache_cell(slots), tps_cell(self.i.tps(key[rule, mode])),
                                     x_cell(self.i.speedup(key[rule, mode], key["ar", "nocache"]))]
                                    + [MISSING if rule == "ar" and k in DRAFT_KEYS
                                       else fmt(m[k], METRICS[k].fmt) for k in keys[1:]])
            if not rows:
                continue
            header = ["Device", "Workload", "Method", "Cache", column("tps_dec", emulated),
                      tagged("Speedup over AR without cache", emulated)]
            shown = ", ".join(f"{d}: {w}" for d, w in on.items()) if any(w != group for w in on.values()) else ""
            sec.tables.append(Table(tagged(f"{group} on every device" + (f" ({shown})" if shown else ""), emulated),
                                    header + [column(k, emulated) for k in keys[1:]], rows))
        if not sec.tables:
            sec.notes.append("No workload runs on more than one device.")
        else:
            sec.missing = list(dict.fromkeys(sec.missing))
            sec.notes.append("A paper workload's row on each device comes from the workload that stands for it there "
                             "(config key `paper`: gsm8k-odd, the RTX 4090's 40 odd-numbered questions, for gsm8k).")
            sec.notes.append(interval_note(self.i.seed))
        return sec

    def parts(self) -> list[Part]:
        parts = []
        for d in self.devices:
            group = Group(self.i, self.figures, self.model, d)
            notes = [f"Main slot count (with-cache runs and fit): {group.main} per layer."]
            if self.emulated(d):
                notes.append(f"Timings on this device are taken over an {EMULATED}.")
            label = self.spec["devices"][d].get("label") or d
            parts.append(Part(f"{self.model} on {d}: {label}", notes, group.sections()))
        across = [s for s in (self.devices_side_by_side(), comparison(self)) if s is not None]
        parts.append(Part(f"{self.model}: across devices and against the paper", [], across))
        return parts

