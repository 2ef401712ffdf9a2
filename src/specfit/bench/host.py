"""``python -m specfit.bench host``: the selection's host work per cycle, by part, replayed from finished decode runs.

Each SpecFit kind's run of a cell (model, device, workload, slots) is replayed cycle by cycle through its method as
the decode ran it: the recorded pool is handed over level by level, the method asked after each level (`select`),
before level 1 whether to draft (`wants_draft`) and after verification what it learns (`verified`, `committed`),
with the recorded residency and the recorded outcome (the accepted path within what it selected). Every call is
timed on the wall clock, by part:

- route prediction: the route source's answer for the level's new nodes (an atlas lookup, or the learned predictor);
- view: the selector's view of the pool (its arrays, route bitmaps and residency words; under the online
  calibration its calibrated p̃, computed inside the view's one compiled call);
- search: the exact search over the view (`specfit.selection.search`) and its figures;
- depth rule: whether to draft on (the level bound, the look-ahead chain) and the decided cycle's record;
- calibration: what a verification teaches (the online calibration's counts, the skipping rule's history);
- bookkeeping: the rest (the per-level calls themselves).

Each method runs twice in one process: as decoding runs it now (the view grown in place per level) and with the view
rebuilt from the pool's lists after every level, the Python calibration beside it (``SpecFit.rebuild_view``: the
selection as it was before the grown view). The cell's fixed tree (its eagle3-tuned run, else eagle3) is replayed
beside them. Both rebuild and grown views must decide alike, cycle for cycle; the bench says how many cycles also
match the recorded decisions.

What a replay is not: the decode's "select ms/cyc" is measured between model forwards, whose work evicts the host's
caches; a replay runs the selection back to back, so its figures are lower (on this CPU, the emulation's model runs
on the same cores). A learned predictor's inputs (the drafter's hidden states) are not recorded: the replay feeds
stand-in inputs of the same shape, so it times the same operations, and its routes, hence its decisions where the
cost counts experts, differ from the run's.

    python -m specfit.bench host --configfile config.resident.yaml --device cpu-m5max-distinct --workload gsm8k
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from specfit import bench
from specfit.errors import SpecFitError
from specfit.models.checkpoint import read_config
from specfit.planning import specs
from specfit.planning.config import SCHEMA, add_configfile_option, load_config, model_experts
from specfit.planning.matrix import DecodeRun, decode_inputs, decode_runs, method_kind
from specfit.results.records import resident_mask

PARTS = ("route prediction", "view", "search", "depth rule", "calibration", "bookkeeping")
FIXED = ("eagle3-tuned", "eagle3")  # the fixed tree beside them: the tuned tree where the cell runs one


class ReplayEngine:
    """The offload engine as a replayed cycle's method reads it: the residency the cycle recorded (one array while
    it does not change, as `specfit.engine.offload.OffloadEngine.resident` hands it out)."""

    def __init__(self, num_experts: int, layers: int):
        self.num_experts, self.layers = num_experts, layers
        self._ids, self._mask = None, None

    def show(self, ids) -> None:
        key = None if ids is None else tuple(tuple(layer) for layer in ids)
        if key != self._ids or self._mask is None:
            mask = resident_mask(ids, self.num_experts)
            self._mask = mask if mask is not None else np.zeros((self.layers, self.num_experts), dtype=bool)
            self._mask.flags.writeable = False
            self._ids = key

    def resident(self) -> np.ndarray:
        return self._mask


class ReplayTarget:
    def __init__(self, engine: ReplayEngine):
        self.engine = engine


def _is_specfit(config: dict, method: str) -> bool:
    from specfit.speculative.methods import SpecFit

    return issubclass(method_kind(config, method).implementation(), SpecFit)


def replay(method, cycles: list[dict], requests: dict[int, dict], limits, engine: ReplayEngine,
           stand_in=None) -> tuple[list[float], int, list[tuple]]:
    """Replay ``cycles`` (rows of a run's cycles.parquet, in order) through ``method``; returns each cycle's host
    seconds, how many cycles decided as recorded, and the decisions (nodes, drafted levels). ``limits``: the run's
    `specfit.speculative.request.Limits`."""
    import torch

    from specfit.selection.pool import CandidatePool
    from specfit.speculative.cycle import Cycle
    from specfit.speculative.methods import Decision
    from specfit.speculative.verify import greedy_path

    host, same, decisions = [], 0, []
    position: dict[int, int] = {}
    target = ReplayTarget(engine)
    method.reset()
    for c in cycles:
        rid = c["request_id"]
        if rid not in position:
            method.begin(requests[rid]["question_id"])
        start = position.get(rid, 0)
        position[rid] = start + c["committed"]
        output = requests[rid]["output_ids"]
        room = limits.room(c["prefix_len"] - start, start + 1)  # the prompt, the output so far with the root
        cap = max(0, min(method.max_depth, room - 1))  # as `Session.draft` caps the cycle's levels
        levels = c["pool_level"]
        recorded_depth = levels[-1]
        engine.show(c.get("resident"))
        drafter, state = stand_in(c) if stand_in is not None else (None, None)
        cycle = Cycle(rid, c["cycle"], c["prefix_len"], output[: start + 1], target, drafter=drafter, draft=state)
        pool = CandidatePool.root_only(c["pool_token"][0])
        spent = 0.0
        root_only = False
        with torch.inference_mode():
            if cap > 0:
                t0 = time.perf_counter()
                root_only = not method.wants_draft(cycle)
                spent += time.perf_counter() - t0
                if root_only and method.live is None:
                    cap = 0
            decision, v = None, 1
            for depth in range(1, min(cap, recorded_depth) + 1):
                while v < len(levels) and levels[v] == depth:  # the recorded level, drafted (off the timers)
                    pool.token.append(c["pool_token"][v])
                    pool.parent.append(c["pool_parent"][v])
                    pool.path_prob.append(c["pool_prob"][v])
                    pool.level.append(depth)
                    v += 1
                t0 = time.perf_counter()
                decision = method.select(cycle, pool, final=depth == min(cap, recorded_depth))
                spent += time.perf_counter() - t0
                if decision is not None:
                    break
            if decision is None:
                t0 = time.perf_counter()
                decision = method.select(cycle, pool, final=True)
                spent += time.perf_counter() - t0
            if root_only:
                decision = Decision((), 0)
            if list(decision.nodes) == c["selected"]:
                accepted = c["accepted_path"]  # what the target accepted (beyond an output cut at the limit too)
            else:  # the target's greedy tokens, the output at each row's position, within the replay's selection
                rows = (0, *decision.nodes)
                at = [start + 1 + pool.level[v] for v in rows]
                accepted = greedy_path(pool, rows, [output[i] if i < len(output) else -1 for i in at])
            t0 = time.perf_counter()
            method.verified(pool, decision, accepted)
            method.committed(cycle, decision, len(accepted))
            spent += time.perf_counter() - t0
        host.append(spent)
        decisions.append((decision.nodes, decision.drafted_levels))
        same += (list(decision.nodes), decision.drafted_levels) == (list(c["selected"]), c["drafted_levels"])
    return host, same, decisions


class PartTimer:
    """Wall seconds by part (`PARTS`) of a method's selection, by wrapping its calls (an instance attribute each)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, obj, name: str, key: str) -> None:
        inner = getattr(obj, name)
        seconds = self.seconds

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - t0

        setattr(obj, name, timed)

    @classmethod
    def on(cls, method) -> PartTimer:
        timer = cls()
        source = getattr(method, "route_source", None)
        if source is not None:
            timer.wrap(source, "routes", "routes")
        for name in ("view", "choose", "draft_on", "decided", "verified", "committed", "path_probs"):
            if hasattr(method, name):
                timer.wrap(method, name, name)
        return timer

    def parts(self, total: float) -> dict[str, float]:
        """Seconds by part of ``total``: the view without its routes; the rebuilt view's Python calibration
        (``path_probs``) counted as calibration."""
        s = self.seconds
        parts = {"route prediction": s["routes"], "view": s["view"] - s["routes"] - s["path_probs"],
                 "search": s["choose"], "depth rule": s["draft_on"] + s["decided"],
                 "calibration": s["verified"] + s["committed"] + s["path_probs"]}
        parts["bookkeeping"] = total - sum(parts.values())
        return parts


def stand_in_inputs(method, num_tokens: int):
    """A learned route source's inputs for replayed cycles: a drafter whose embedding has the target's vocabulary
    and the predictor's width, and per cycle a drafter state of random hidden states (the recorded run keeps none),
    both seeded, so that every replay reads the same; None for any other route source."""
    from specfit.speculative.learned import LearnedRoutes
    from specfit.speculative.routes import find_source

    source = find_source(getattr(method, "route_source", None), LearnedRoutes)
    if source is None or not method.asks_routes:
        return None
    import torch
    from torch import nn

    from specfit.speculative.draft import new_draft_state

    hidden = source.predictor.hidden_size

    class Drafter(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(num_tokens, hidden)
            with torch.no_grad():  # seeded: every replay of the run (rebuilt and grown views) predicts alike
                seeded = torch.Generator().manual_seed(0)
                self.embed_tokens.weight.copy_(torch.randn(num_tokens, hidden, generator=seeded))

    drafter = Drafter().eval()

    def inputs(c: dict):
        state = new_draft_state()
        generator = torch.Generator().manual_seed(1_000_003 * c["request_id"] + c["cycle"])  # the same every replay
        rows = torch.randn(len(c["pool_token"]), hidden, generator=generator)  # [n+1, H]
        state.root_input = rows[0]
        state.feature = {v: rows[v] for v in range(1, len(rows))}
        return drafter, state

    return inputs


def build(config: dict, run: DecodeRun, num_experts: int):
    """The run's method, as its decode built it, and its limits."""
    from specfit.speculative.config import MethodConfig
    from specfit.speculative.methods import build_method
    from specfit.speculative.request import Limits

    spec = specs.decode(config, run.model, run.device, run.workload, run.method, run.slots)
    method = build_method(MethodConfig(**spec["method"]), decode_inputs(config, run), spec["seed"], num_experts)
    return method, Limits(spec["limit_tokens"], spec["max_new_tokens"], frozenset())


def check_run(config: dict, run: DecodeRun) -> None:
    """A run to replay: its recorded cycles and requests, and the inputs its method reads (coefficients, atlas or
    predictor, tuned tree), all present."""
    make = f"run `snakemake --cores 1 {run.file('metrics.json')}` (with the same --configfile) first"
    if not Path(run.file("cycles.parquet")).is_file() or not Path(run.file("requests.parquet")).is_file():
        raise SpecFitError(f"run {run.path} has no recorded cycles ({run.file('cycles.parquet')}): {make}")
    for name, path in decode_inputs(config, run).items():
        for p in path if isinstance(path, list) else [path]:
            if name != "prompts" and not Path(p).exists():
                raise SpecFitError(f"run {run.path}: its input {name} ({p}) is missing: {make}")


def recorded(run: DecodeRun, limit: int | None) -> tuple[list[dict], dict[int, dict]]:
    """A finished run's cycles (the first ``limit`` requests' whole, in order) and requests by id."""
    requests = {r["request_id"]: r for r in pq.read_table(run.file("requests.parquet")).to_pylist()}
    ids = sorted(requests)[:limit] if limit else sorted(requests)
    keep = set(ids)
    cycles = [c for c in pq.read_table(run.file("cycles.parquet")).to_pylist() if c["request_id"] in keep]
    if not cycles:
        raise SpecFitError(f"run {run.path} recorded no cycles")
    return sorted(cycles, key=lambda c: (c["request_id"], c["cycle"])), requests


def measure(config: dict, run: DecodeRun, engine_shape: tuple[int, int], repeats: int, limit: int | None,
            rebuild: bool, vocab: int) -> dict:
    """Median over cycles of a method's host µs per cycle, its mean parts, and its decisions, over ``repeats``
    replays after one untimed one."""
    cycles, requests = recorded(run, limit)
    method, limits = build(config, run, engine_shape[0])
    if rebuild:
        method.rebuild_view = True
    engine = ReplayEngine(*engine_shape)
    stand_in = stand_in_inputs(method, vocab)
    _, same, decisions = replay(method, cycles, requests, limits, engine, stand_in)  # compiles, loads, warms
    timer = PartTimer.on(method)
    per_cycle = np.zeros(len(cycles))
    for _ in range(repeats):
        host, _, again = replay(method, cycles, requests, limits, engine, stand_in)
        if again != decisions:
            raise AssertionError(f"run {run.path}: a replay of {run.method} decided otherwise than the one before")
        per_cycle += np.array(host)
    per_cycle /= repeats
    total = float(per_cycle.sum())
    parts = {k: v / repeats / len(cycles) * 1e6 for k, v in timer.parts(total * repeats).items()}
    return {"median_us": float(np.median(per_cycle)) * 1e6, "mean_us": total / len(cycles) * 1e6, "parts": parts,
            "cycles": len(cycles), "same": same, "decisions": decisions,
            "levels": float(np.mean([c["drafted_levels"] for c in cycles]))}


def main(argv: list[str] | None = None) -> None:
    parser = bench.parser(__name__, __doc__, raw=True)
    add_configfile_option(parser)
    parser.add_argument("--model", help="the model (default: every model of the matrix)")
    parser.add_argument("--device", help="the device (default: every device of the matrix)")
    parser.add_argument("--workload", help="the workload (default: every workload of the matrix)")
    parser.add_argument("--slots", type=int, help="the cache slots (default: every slot count of the matrix)")
    parser.add_argument("--methods", help="comma-separated SpecFit methods to replay (default: every SpecFit kind of "
                        "the cell)")
    parser.add_argument("--requests", type=int, default=None, help="replay the first N requests of each run "
                        "(default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="timed replays of each run (after one untimed)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise SpecFitError("--repeats must be at least 1")
    config = load_config("config.yaml", SCHEMA, *(args.configfile or []))
    wanted = [m for m in (args.methods or "").split(",") if m]
    for m in wanted:
        if m not in config["methods"]:
            raise SpecFitError(f"--methods: no method {m!r} in the config; its methods: {', '.join(config['methods'])}")
    cells = defaultdict(dict)
    for run in decode_runs(config):
        if all(getattr(args, k) in (None, getattr(run, k)) for k in ("model", "device", "workload", "slots")):
            cells[(run.model, run.device, run.workload, run.slots)][run.method] = run
    if not cells:
        raise SpecFitError("no decode run of the config's matrix matches --model/--device/--workload/--slots")
    plan = []  # (cell, fixed tree, SpecFit methods, runs): everything checked before anything is replayed
    for (model, device, workload, slots), runs in sorted(cells.items()):
        names = [m for m in wanted if m in runs] if wanted else [m for m in runs if _is_specfit(config, m)]
        for m in names:
            if not _is_specfit(config, m):
                raise SpecFitError(f"run {runs[m].path}: {m!r} is of kind {method_kind(config, m).name}, not a "
                                   "SpecFit kind: this bench replays SpecFit's selection")
        if not names:
            continue
        fixed = next((m for k in FIXED for m in runs if method_kind(config, m).name == k), None)
        for m in ([fixed] if fixed else []) + names:
            check_run(config, runs[m])
        plan.append(((model, device, workload, slots), fixed, names, runs))
    if not plan:
        what = ' or '.join(wanted) or 'a SpecFit kind'
        raise SpecFitError(f"no cell of the config's matrix that matches runs {what}")
    from specfit.selection.search import compile_kernels

    compile_kernels()
    for (model, device, workload, slots), fixed, names, runs in plan:
        target = read_config(config["models"][model]["target"], "target model", f"models.{model}.target")
        target = target.get("text_config") or target
        shape = (model_experts(config, model, Path(".")), target["num_hidden_layers"])
        label = config["devices"][device].get("label", device)
        print(f"{model} / {device} / {workload} / slots {slots}  ({label}; host work on this CPU, wall clock)")
        print(f"  {'method':<18}{'view':<9}{'cycles':>7}{'levels':>7}{'median':>9}{'mean':>8}  "
              + "".join(f"{p:>18}" for p in PARTS) + "   decisions")
        for m in ([fixed] if fixed else []) + names:
            for rebuild in ((False,) if m == fixed else (True, False)):
                r = measure(config, runs[m], shape, args.repeats, args.requests, rebuild, target["vocab_size"])
                if m != fixed and rebuild:
                    rebuilt = r["decisions"]
                elif m != fixed and r["decisions"] != rebuilt:
                    raise AssertionError(f"run {runs[m].path}: the grown view decided otherwise than the rebuilt one")
                parts = "".join(f"{r['parts'][p]:>18.1f}" for p in PARTS) if m != fixed else ""
                view = "fixed" if m == fixed else ("rebuilt" if rebuild else "grown")
                print(f"  {m:<18}{view:<9}{r['cycles']:>7}{r['levels']:>7.2f}{r['median_us']:>9.1f}{r['mean_us']:>8.1f}"
                      f"  {parts:<{18 * len(PARTS)}}   {r['same']}/{r['cycles']} as recorded"
                      + ("; rebuilt and grown alike" if m != fixed and not rebuild else ""))
        print("  µs per cycle (median, mean over cycles; parts are means); replayed back to back, so below the "
              "decode's select ms/cyc, which runs between model forwards")
