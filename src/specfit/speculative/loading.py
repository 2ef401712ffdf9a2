"""Loading a stream: the target on the offload engine, the method and, if it drafts, the drafter beside it, checked
from their configs and headers before any weight is read (`load`), and what a stream then decodes with
(`Loaded`: one request, the untimed warm-up, the reset to an empty expert cache). The decode and atlas stages
(`specfit.speculative.stream`) and the library API (`specfit.api`) load and warm up through here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

from specfit.engine.offload import OffloadEngine, make_engine
from specfit.errors import SpecFitError
from specfit.models import Eagle3Drafter, check_checkpoints, load_drafter, load_target
from specfit.selection.search import compile_kernels
from specfit.speculative.learned import LearnedRoutes
from specfit.speculative.methods import Method, build_method
from specfit.speculative.prefill import SharedPrefills
from specfit.speculative.request import Limits, decode_cycles, decode_request
from specfit.speculative.routes import AtlasRoutes, LiveRoutes, find_source

if TYPE_CHECKING:
    from specfit.speculative.stream import StreamSpec


@dataclass
class Loaded:
    """What a stream decodes with: the offloaded target, the method and its drafter, and the method's route
    sources that count what they answer."""

    model: torch.nn.Module
    engine: OffloadEngine
    method: Method
    drafter: Eagle3Drafter | None  # None for a method that does not draft (AR)
    live: LiveRoutes | None  # routes of the target itself, kept as atlas rows (the atlas build)
    atlas: AtlasRoutes | None  # routes replayed from an atlas
    learned: LearnedRoutes | None  # routes from a route predictor
    tokenizer: PreTrainedTokenizerBase  # the target's (`specfit.api` renders and detokenizes with it)

    def decode(self, prompt: dict, limits: Limits):
        return decode_request(
            self.model, self.drafter, self.method, prompt["prompt_ids"], request_id=prompt["request_id"],
            question_id=prompt["question_id"], limits=limits, engine=self.engine,
        )

    def decode_cycles(self, prompt: dict, limits: Limits, prefills: SharedPrefills | None = None):
        """`decode` as it goes (`specfit.speculative.request.decode_cycles`): each step's committed tokens;
        ``prefills``: a `specfit.speculative.prefill.SharedPrefills` that replays a prompt prefilled before."""
        return decode_cycles(
            self.model, self.drafter, self.method, prompt["prompt_ids"], request_id=prompt["request_id"],
            question_id=prompt["question_id"], limits=limits, engine=self.engine, prefills=prefills,
        )

    def warm_up(self, prompt: dict, limits: Limits, tokens: int) -> None:
        """Compile the selector's kernels and decode ``prompt`` untimed, at most ``tokens`` output tokens (a stream's
        ``warmup_tokens``), then start over: an empty expert cache and fresh counters. The decode stage and
        `specfit.api.Decoder` both warm up here."""
        compile_kernels()
        self.decode(prompt, dataclasses.replace(limits, max_new_tokens=min(tokens, limits.max_new_tokens)))
        self.reset()

    def reset(self) -> None:
        """An empty expert cache, fresh engine counters, and a method and route sources that forget earlier requests."""
        self.engine.clear_cache()
        self.engine.reset_stats()
        self.method.reset()
        for source in (self.atlas, self.learned):
            if source is not None:
                source.reset_counts()


def offloaded_target(spec: StreamSpec, path) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, OffloadEngine]:
    """The target checkpoint at ``path`` on the offload engine at ``spec.slots`` (its experts on the host)."""
    model, tokenizer = load_target(path, spec.dtype, "cpu", key=f"models.{spec.model}.target",
                                   logits_dtype=spec.logits_dtype, verify=spec.verify)
    return model, tokenizer, make_engine(model, spec.slots, spec.max_inflight, spec.link, spec.torch_device,
                                         spec.emulate)


def drafter_beside(spec: StreamSpec, path, model, engine: OffloadEngine) -> Eagle3Drafter:
    """The drafter checkpoint at ``path`` for ``model``, its forwards timed by ``engine``'s emulated device if any."""
    drafter = load_drafter(path, model, device=spec.torch_device, key=f"models.{spec.model}.drafter")
    engine.emulate_drafter(drafter)
    return drafter


def load(spec: StreamSpec, inputs: dict, outputs: dict) -> Loaded:
    """The target offloaded as ``spec`` says, the method and, if it drafts, the drafter; checkpoints are checked
    from their configs and headers before any weight is read."""
    check_checkpoints(inputs["target"], inputs.get("drafter"), spec.model)  # configs and headers, before any weight
    model, tokenizer, engine = offloaded_target(spec, inputs["target"])
    method = build_method(spec.method, inputs, spec.seed, engine.num_experts)
    drafter = None
    if method.drafts:
        if "drafter" not in inputs:
            raise SpecFitError(f"method {spec.method.name} needs the `drafter` input")
        drafter = drafter_beside(spec, inputs["drafter"], model, engine)
    if method.live is not None and "atlas" not in outputs:
        raise SpecFitError("live routes build an atlas: give the `atlas` output")
    source = getattr(method, "route_source", None)
    return Loaded(model, engine, method, drafter, live=method.live, atlas=find_source(source, AtlasRoutes),
                  learned=find_source(source, LearnedRoutes), tokenizer=tokenizer)

