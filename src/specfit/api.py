"""The decoder as a library: one prompt in, SpecFit's greedy output (AR's, token for token) and its figures out.

`Decoder.from_config` reads the workflow's config as the decode stage does: the model's checkpoints, the device
(its link or emulated GPU), the method's entry and, for SpecFit, the coefficients calibrated for that model and
device and the route predictor trained for that model (the workflow's outputs, `specfit.planning.matrix.method_inputs`).
It loads and warms up through the decode stage's own `specfit.speculative.loading` and decodes through its cycle
loop (`specfit.speculative.request.decode_cycles`), so a prompt decodes here as it would in a decode run.

Only deployable methods: a method that reads its expert routes from an atlas (the target's own routes of the
workflow's prompts) is an experiment oracle, refused with the deployable alternative (`deployable`).

::

    from specfit.api import Decoder

    decoder = Decoder.from_config("toy", "cpu-a100link", "specfit-learned")
    result = decoder.generate("Summarize: ...", max_new_tokens=64)
    print(result.text, result.figures["tps_dec"])
    for piece in decoder.stream("What is 12 * 7?"):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch

from specfit.errors import SpecFitError
from specfit.models.checkpoint import read_config
from specfit.models.loading import eos_ids
from specfit.models.shipped import restore
from specfit.planning import paths
from specfit.results.metrics import stream_metrics
from specfit.results.records import CYCLE_SCHEMA
from specfit.speculative.config import MethodConfig, route_source
from specfit.speculative.kinds import AR, kind
from specfit.speculative.loading import Loaded, load
from specfit.speculative.methods import build_method
from specfit.speculative.request import Limits
from specfit.speculative.sampling import Sampling
from specfit.speculative.stream import StreamSpec

# the figures a generation reports, by their names in a decode run's metrics.json
# (`specfit.results.metrics.stream_metrics`), beside model, device, method, routes, slots and the device's timing_label
FIGURES = ("n_output_tokens", "cycles", "tps_dec", "committed_per_cycle", "draft_nodes_per_cycle", "h2d_per_token",
           "select_ms_per_cycle")
MAX_NEW_TOKENS = 128


@dataclass
class Generation:
    """One prompt's output and how it was decoded. ``figures``: `FIGURES` as metrics.json names them, and the
    device's ``timing_label``; ``request`` and ``cycles``: the decode stage's rows (`specfit.results.records`)."""

    text: str
    prompt_ids: list[int]
    output_ids: list[int]
    figures: dict
    request: dict
    cycles: list[dict]


def deployable(config: dict, method: str) -> None:
    """Refuse a method that needs the workflow's oracle: SpecFit reading its routes from an atlas (or an atlas made
    noisy) exists only for the workflow's own prompts; a tuned tree exists per workload. Names the deployable
    alternative."""
    entry = config["methods"][method]
    if kind(entry["kind"]).tuned:
        raise SpecFitError(
            f"method {method!r} decodes with the tree the tune rule chose for one workload and device "
            f"(data/tune/<model>/<device>/<workload>/{method}/slots<N>.json): add that tree as a method of kind eagle3 "
            "(its max_depth, top_k_expand, k_max) and run that one")
    if not kind(entry["kind"]).reads_routes or route_source(entry.get("routes", "atlas")).learned:
        return
    twins = [name for name, other in config["methods"].items() if other["kind"] == entry["kind"]
             and route_source(other.get("routes", "atlas")).learned]
    alternative = f"--method {twins[0]}, or " if twins else ""
    raise SpecFitError(
        f"method {method!r} reads its expert routes from an atlas (routes: {entry.get('routes', 'atlas')}), the "
        f"target's own routes of the workflow's prompts: an experiment oracle, not a decoder; use {alternative}"
        f"--routes learned to run {method!r} on the trained route predictor"
    )


def method_names(config: dict) -> list[str]:
    """The config's deployable methods (`deployable`), in its order."""
    names = []
    for name in config["methods"]:
        try:
            deployable(config, name)
            names.append(name)
        except SpecFitError:
            pass
    return names


def _known(kind: str, name: str | None, choices: list[str], flag: str, defined: str = "the config defines") -> None:
    if name is None:
        raise SpecFitError(f"no {kind} given: pass {flag} ({defined} {', '.join(choices)})")
    if name not in choices:
        raise SpecFitError(f"unknown {kind} {name!r}: {defined} {', '.join(choices)}")


class Decoder:
    """A target, its drafter and a method, loaded once, that decode prompts one at a time (batch size 1).

    Requests share the engine's expert cache, as a decode run's do; `reset` empties it. As in a decode run, the
    first prompt is decoded once untimed (`StreamSpec.warmup_tokens` tokens; compiling the selection search and
    the first forwards' allocations would otherwise land in its figures), then from an empty cache."""

    def __init__(self, spec: dict | StreamSpec, inputs: dict, name: dict | None = None):
        """``spec``: a decode run's spec (`specfit.speculative.stream.StreamSpec`; its limit_tokens caps prompt +
        output, max_new_tokens is the default output length); ``inputs``: the decode stage's input paths, without
        prompts. ``name``: model, device and method as the config names them, for the figures."""
        self.spec = spec if isinstance(spec, StreamSpec) else StreamSpec.from_dict(spec)
        torch.manual_seed(self.spec.seed)
        self.loaded: Loaded = load(self.spec, inputs, {})
        self.name = {"model": self.spec.model, "method": self.spec.method.name, **(name or {})}
        self.requests = 0
        self.warm = False  # the first request is decoded once untimed first, as the decode stage's warm-up

    @classmethod
    def from_config(cls, model: str, device: str, method: str, *, configfile: str | Path = "config.yaml",
                    overlays: Sequence[str | Path] = (), slots: int | None = None, routes: str | None = None,
                    max_new_tokens: int = MAX_NEW_TOKENS, sampling: dict | None = None) -> Decoder:
        """The decoder of ``model`` on ``device`` with ``method``, as the workflow's config (``configfile`` with
        ``overlays`` merged over it, as Snakemake's ``--configfile``) sets them; paths are relative to the config's
        folder, the workflow root. ``slots``: the model's with-cache calibration slots on the device when None;
        ``routes``: a route source (``learned``) in place of the method entry's; ``sampling``: temperature, top_p,
        top_k, seed and sampling (the mode), as a workload sets them (`specfit.speculative.sampling.Sampling`; none:
        greedy)."""
        from specfit.planning import specs  # the workflow's config helpers: torch-free
        from specfit.planning.config import SCHEMA, check_shipped, load_config
        from specfit.planning.matrix import method_inputs

        Sampling.of(sampling)  # refused before anything loads
        configfile = Path(configfile)
        root = configfile.parent
        if not configfile.is_file():
            raise SpecFitError(f"no config at {configfile}: run from the workflow root or give --configfile")
        config = load_config(configfile, root / SCHEMA, *overlays, check_files=False)
        _known("model", model, list(config["models"]), "--model")
        check_shipped(config, root, [model])  # only the model it decodes needs its files
        _known("device", device, list(config["devices"]), "--device")
        if method not in config["methods"]:  # an oracle is named as one below
            _known("method", method, method_names(config), "--method", "the config's deployable methods are")
        if routes is not None:
            config = copy.deepcopy(config)
            if not kind(config["methods"][method]["kind"]).reads_routes:
                raise SpecFitError(f"--routes: method {method!r} selects by no expert routes")
            config["methods"][method]["routes"] = route_source(routes).name
        deployable(config, method)
        if slots is None:
            main = config["models"][model].get("main_slots", {})
            if device not in main:
                raise SpecFitError(f"models.{model}.main_slots has no entry for device {device!r}: give --slots")
            slots = main[device]
        inputs = method_inputs(config, model, device, method, slots)
        _check_outputs(config, model, device, inputs, root)
        inputs = {k: str(root / v) for k, v in inputs.items()}
        target = read_config(inputs["target"], "target model", f"models.{model}.target")
        limit = (target.get("text_config") or target).get("max_position_embeddings")
        if not limit:
            raise SpecFitError(f"the target's config.json sets no max_position_embeddings: its token limit is unknown "
                               f"(set by `models.{model}.target` in config.yaml)")
        spec = specs.generate(config, model, device, method, slots, limit, max_new_tokens, sampling)
        return cls(spec, inputs, {"model": model, "device": device, "method": method})

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """A prompt's token ids: text as the first user turn in the model's chat template (as the extract stage
        renders the workloads' questions), a sequence of ints as it is."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise SpecFitError("the prompt is empty: give the text to answer")
            from specfit.questions import render_prompt  # as the workloads' prompts are rendered

            if self.tokenizer.chat_template is None:
                raise SpecFitError(f"the tokenizer of {self.name['model']} has no chat template: pass token ids")
            return render_prompt(self.tokenizer, {"turns": [prompt]})[1]
        return [int(t) for t in prompt]

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int | None = None
               ) -> Generator[str, None, Generation]:
        """Decode ``prompt``, yielding the text as cycles commit it; returns (``StopIteration.value``, or
        ``result = yield from decoder.stream(...)``) the `Generation`. The caller's time between pieces is off the
        request's timers."""
        prompt_ids = self.encode(prompt)
        limits = self._limits(prompt_ids, max_new_tokens)
        row = {"request_id": self.requests, "question_id": self.requests, "prompt_ids": prompt_ids}
        self.requests += 1
        if not self.warm:  # as the decode stage: compile and allocate off the record, then start from scratch
            self.loaded.warm_up(row, limits, self.spec.warmup_tokens)
            self.warm = True
        steps = self.loaded.decode_cycles(row, limits)
        output, shown = [], ""
        while True:
            try:
                output += next(steps)
            except StopIteration as done:
                result = done.value
                break
            text = self._text(output)
            if not text.endswith("\ufffd") and text.startswith(shown) and len(text) > len(shown):  # whole characters
                yield text[len(shown):]
                shown = text
        text = self._text(result.request["output_ids"])
        if text.startswith(shown) and len(text) > len(shown):
            yield text[len(shown):]
        figures = self.figures(row, result.request, result.cycles)
        return Generation(text, prompt_ids, list(result.request["output_ids"]), figures, result.request,
                          result.cycles)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int | None = None) -> Generation:
        """Decode ``prompt``: its text, ids and figures."""
        pieces = self.stream(prompt, max_new_tokens)
        while True:
            try:
                next(pieces)
            except StopIteration as done:
                return done.value

    def figures(self, prompt: dict, request: dict, cycles: list[dict]) -> dict:
        """`FIGURES` of one request, computed as its decode run's metrics.json computes them."""
        metrics = stream_metrics([request], pa.Table.from_pylist(cycles, schema=CYCLE_SCHEMA), [prompt],
                                 self.spec.seed)
        method = self.spec.method
        routes = method.routes if kind(method.name).reads_routes else None  # where SpecFit's routes came from
        return {**self.name, "routes": routes, "slots": self.spec.slots, "sampling": self.sampling.record(),
                "timing_label": self.loaded.engine.timing_label, **{k: metrics[k] for k in FIGURES}}

    def reset(self) -> None:
        """An empty expert cache and fresh counters, as after the decode stage's warm-up."""
        self.loaded.reset()

    def ar(self) -> Decoder:
        """AR over this decoder's target and engine (no second copy of the target): the reference of `compare`."""
        ar = copy.copy(self)
        ar.loaded = dataclasses.replace(self.loaded, method=build_method(MethodConfig(AR.name)), drafter=None,
                                        live=None, atlas=None, learned=None)
        ar.name = {**self.name, "method": AR.name}
        return ar

    def _limits(self, prompt_ids: list[int], max_new_tokens: int | None) -> Limits:
        limit = self.spec.limit_tokens
        if len(prompt_ids) >= limit:
            raise SpecFitError(f"the prompt is {len(prompt_ids)} tokens, and {self.name['model']} takes at most "
                               f"{limit} tokens of prompt and output: shorten the prompt")
        new = self.spec.max_new_tokens if max_new_tokens is None else max_new_tokens
        if new < 1:
            raise SpecFitError(f"max_new_tokens is {new}: ask for at least 1 token")
        return Limits(limit, new, eos_ids(self.loaded.model), self.sampling)

    @property
    def sampling(self) -> Sampling:
        """How this decoder samples (greedy unless its spec sets a temperature)."""
        return Sampling.of(self.spec.sampling)

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def compare(decoder: Decoder, prompt: str | Sequence[int], max_new_tokens: int | None = None
            ) -> tuple[Generation, Generation]:
    """``prompt`` decoded by ``decoder`` and by AR on the same target, each from an empty expert cache."""
    decoder.reset()
    request = decoder.requests
    ours = decoder.generate(prompt, max_new_tokens)
    decoder.reset()
    ar = decoder.ar()
    ar.requests = request  # the same request index: the same sampling noise
    return ours, ar.generate(prompt, max_new_tokens)


def _check_outputs(config: dict, model: str, device: str, inputs: dict, root: Path) -> None:
    """The workflow outputs a method reads (``inputs``, relative to ``root``) must be there: a missing one is named
    with the Snakemake target that makes it (nothing is defaulted), the shipped toy's with the command restoring it."""
    what = {"coefficients": f"no calibration of {model} on {device}", "predictor": f"no route predictor for {model}"}
    entry = config["models"][model]
    if entry["toy"]:
        what.update(target=f"no toy target for {model}", drafter=f"no toy drafter for {model}")
    if entry["shipped"]:
        what.update(target="no shipped toy target", drafter="no shipped toy drafter")
    for name, why in what.items():
        if name in inputs and not (root / inputs[name]).exists():
            fix = (restore(Path(paths.toy_dir(paths.SHIPPED_TOY))) if entry["shipped"] and name in ("target", "drafter")
                   else f"make it with `snakemake --cores 1 {inputs[name]}`")
            raise SpecFitError(f"{why} at {root / inputs[name]}: {fix} (in the workflow root)")
