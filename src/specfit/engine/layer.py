"""One offloaded MoE layer: its experts' host rows, its device slot buffers and LRU (`specfit.engine.cache`), and
the forward the ``specfit_offload`` experts implementation hands it (`OffloadedLayer.forward`), which runs the
target's own experts implementation over the slot rows through a thin view (`SlotView`); with the helpers that
move a model's experts to the host and allocate the slots.

What the numbers guarantee, on every machine, for every family and dtype: a layer forward whose experts are all
resident (all hits) is one call of the target's own experts implementation on the same values, so it is
bit-identical to the un-offloaded model. A forward with misses (cold, warm and split into hit and miss groups, no
cache) computes each routed entry's expert output per group and then weights and sums the top-k once, in the
dtypes and the order of the target's own implementation (``SPLIT_ARITHMETIC``: Mixtral's router returns float32
gate weights, under which grouped_mm sums bfloat16 expert outputs in float32 and rounds once), so it differs only
in rounding: fp32 logits agree with the all-hit ones to a few ulps (the tests hold them to 1e-5 absolute), bf16
logits to a few bf16 ulps, and routes and greedy tokens are the same unless a router or argmax margin is itself
within rounding. It is not bit-identical everywhere (the rows a matmul computes together change its blocking on
some CPUs), so whatever compares runs across cache states (the route atlas) tolerates that. Experts
implementations other than those of ``SPLIT_ARITHMETIC`` are refused. Where the host rows are where the device
computes and no copy is timed on the wall clock (`OffloadEngine.host_compute`: a CPU engine without an emulated
link), every forward computes its union from the host rows in one call of the target's implementation instead: the
un-offloaded model's bits at any cache state, with the same admissions, counters, LRU order and modelled cost. Its
copies are counted and priced on the clock as the cache plans them, but none is made: nothing reads a slot row
there, and a copy on the CPU would be a memcpy that the emulated clock does not time.

An exact verify (`specfit.speculative.exact`) hands a layer its rows through `forward_rows` (its module path through
`RowCalls`, which records each row's experts call and replays its output): the same
admission, copies, LRU order and modelled cost as one forward over all rows, with every token's experts computed
alone, as a one-token forward computes them, and combined per token. At one token every expert computes one row
whichever group it falls in, so a token's output does not depend on how hits and misses split the forward: it is
bit-identical to AR's step at any cache state (held to 0 by tests/engine/test_exact_verify.py). On the CPU such a
one-token call computes only the experts it routes to (`specfit.engine.one_token`: grouped_mm's own products for
its groups, without the empty ones), the same bits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers.integrations.moe import ExpertsInterface

from specfit.engine.cache import ExpertCache
from specfit.engine.copiers import CopyJob
from specfit.engine.families import MoEFamily
from specfit.engine.one_token import applies, entries, one_token_forward

if TYPE_CHECKING:
    from specfit.engine.offload import OffloadEngine

EXPERTS_IMPLEMENTATION = "specfit_offload"

# How each supported experts implementation of transformers combines an entry's expert output with its gate weight,
# which a forward split into cache groups reproduces (an all-hit forward is the implementation's own call):
# "promote": output * weight in the promoted dtype, summed over the top-k there, cast to the states' dtype once;
# "sequential": each weighted entry cast to the states' dtype, added in increasing expert id (every eager forward).
SPLIT_ARITHMETIC = {"grouped_mm": "promote", "batched_mm": "promote", "eager": "sequential"}


class SlotView:
    """The experts module as its implementation sees it: slot buffers in place of the fused weights.

    ``num_experts`` is the number of slot rows, which is also the sentinel index of the routed entries that the
    current group does not compute (transformers' expert-parallel convention: they contribute nothing).
    """

    def __init__(self, module: nn.Module, slots: dict[str, torch.Tensor], rows: int, sentinels: bool) -> None:
        self._module = module
        self.__dict__.update(slots)
        self.num_experts = rows
        self._is_expert_parallel = sentinels

    def __getattr__(self, name: str):
        return getattr(self._module, name)


class RowCalls:
    """The exact verify's module path's experts calls at one layer (`specfit.speculative.exact.module_tree_forward`):
    every row's MoE block calls the experts once to be recorded (zeros returned, the layer's output discarded), the
    layer then runs one forward over all rows (`forward`), and every row's block calls again to replay its output."""

    def __init__(self) -> None:
        self.layer: OffloadedLayer | None = None
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # per row: [1, H], [1, k], [1, k]
        self.outputs: list[torch.Tensor] | None = None  # per row: [1, H], once computed

    def call(self, layer: OffloadedLayer, hidden_states, top_k_index, top_k_weights) -> torch.Tensor:
        if self.outputs is None:
            if hidden_states.shape[0] != 1 or (self.layer is not None and layer is not self.layer):
                raise RuntimeError("an exact verify records one row of one layer per experts call")
            self.layer = layer
            self.calls.append((hidden_states, top_k_index, top_k_weights))
            return torch.zeros_like(hidden_states)
        return self.outputs.pop(0)

    def forward(self) -> RowCalls:
        """The layer's one forward over the recorded rows; then every row's call replays its output."""
        hidden, index, weights = (torch.cat(x) for x in zip(*self.calls))  # [T, H], [T, k], [T, k]
        self.outputs = list(self.layer.forward_rows(hidden, index, weights).split(1))
        return self


class OffloadedLayer:
    """One MoE layer: host rows, device slot buffers, its LRU, and the forward the experts interface calls."""

    def __init__(
        self,
        engine: OffloadEngine,
        index: int,
        module: nn.Module,
        host: dict[str, torch.Tensor],
        slots: dict[str, torch.Tensor],
        capacity: int,
        inner: Callable,
    ) -> None:
        self.engine = engine
        self.index = index
        self.host = host  # name -> [E, ...] host rows
        self.slots = slots  # name -> [R, ...] device slot rows, R >= 2
        self.rows = next(iter(slots.values())).shape[0]
        self.num_experts = next(iter(host.values())).shape[0]
        self.cache = ExpertCache(capacity)
        self.slot_table: torch.Tensor | None = None  # [E] slot row of each resident expert; None after a change
        self.inner = inner
        self.prefetched: dict[int, tuple[float, float]] = {}  # expert -> copy (start, landing) since last forward
        self.prefetch_handles: list = []  # the copier's handles of those copies
        self.views = (SlotView(module, slots, self.rows, False), SlotView(module, slots, self.rows, True))
        self.host_view = SlotView(module, host, self.num_experts, False)  # the experts as the un-offloaded model's
        # a forward whose experts hold one entry each skips grouped_mm's empty groups (`specfit.engine.one_token`)
        self.one_token = applies(engine.experts_implementation, module, engine.device)

    def _load(self, loads: list[tuple[int, int]]) -> list:
        """Submit the copies of ``loads`` ((expert, slot) pairs), counted; the copier's handles."""
        self.engine._on_transfers(self.index, len(loads))
        return self.engine.copier.submit(self.copy_jobs(loads))

    def copy_jobs(self, loads: list[tuple[int, int]]) -> list[CopyJob]:
        """The copies of ``loads``: none on a host-compute engine, which reads no slot row (a prefetch's neither)."""
        if self.engine.host_compute:
            return []
        nbytes = self.engine.expert_bytes
        return [([(self.slots[n][slot], self.host[n][e]) for n in self.slots], nbytes) for e, slot in loads]

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        # hidden_states [T, H], top_k_index [T, k] expert ids, top_k_weights [T, k] gate weights
        calls = self.engine.row_calls
        if calls is not None:  # an exact verify: one row of this layer, recorded or replayed
            return calls.call(self, hidden_states, top_k_index, top_k_weights)
        return self.run(hidden_states, top_k_index, top_k_weights, by_row=False)

    def forward_rows(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """One forward over T rows, as `forward` admits, copies and times it, with each row's experts computed as a
        one-row forward computes them (`specfit.speculative.exact`): [T, H] -> [T, H]."""
        return self.run(hidden_states, top_k_index, top_k_weights, by_row=True)

    def admit(self, top_k_index: torch.Tensor) -> tuple[list, list, list]:
        """A forward of T rows routed to ``top_k_index`` [T, k] as the cache, the counters and the clocks see it,
        before any expert is computed: the cache's hits, misses and plan for the rows' expert union. On a
        host-compute engine the plan's loads are counted here (`copy_jobs`: none is made); elsewhere `run` issues
        them. A replayed forward (`specfit.engine.replay`) admits its recorded routes here and computes nothing."""
        engine = self.engine
        tokens = top_k_index.shape[0]
        with torch.no_grad():
            counts = torch.bincount(top_k_index.reshape(-1), minlength=self.num_experts)  # [E]
            union = counts.nonzero().flatten().tolist()  # increasing expert ids; a host sync
        if self.prefetch_handles:  # the prefetched slots are written before anything reads or overwrites them
            engine.copier.wait(self.prefetch_handles)
            self.prefetch_handles = []
        hits, misses, steps = self.cache.admit(union)
        if misses:
            self.slot_table = None
        engine._on_layer(self.index, len(union), len(hits), len(misses), top_k_index)
        landing = engine._settle_prefetch(self, union) if self.prefetched else None
        if engine.timeline is not None:
            engine.timeline.layer(self.index, tokens, steps, landing)
        for priced in engine.priced:  # other slot counts priced on this forward (specfit.engine.pricing)
            priced.admit(self.index, tokens, union)
        if engine.host_compute:
            for step in steps:
                if step[0] == "load":
                    self._load(step[1])
        return hits, misses, steps

    def run(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, by_row: bool
    ) -> torch.Tensor:
        engine = self.engine
        hits, misses, steps = self.admit(top_k_index)

        compute = partial(self._compute_by_row, top_k_index.shape[0]) if by_row else self._compute
        if engine.host_compute:  # the host rows are where it computes (the loads counted in `admit`)
            return compute(self.host_view, top_k_index, hidden_states, top_k_weights)
        if not misses and steps:  # all hits: one call of the target's own implementation over the slot rows
            return compute(self.views[0], self._slot_index(steps[0][1], True, top_k_index), hidden_states,
                           top_k_weights)
        # Several groups: one row per routed entry, top-1 each, with a unit gate weight, so that every group
        # returns its entries' expert outputs [T*k, H] exactly (zero elsewhere). The gate weights are applied and
        # the top-k summed once, afterwards, as the target's own implementation does it (see _combine). How hits
        # and misses split the forward changes only the rounding (which rows a matmul computes together), not the
        # experts, the dtypes or the order of the sum: see the module docstring.
        T, k = top_k_index.shape
        entry_states = hidden_states.repeat_interleave(k, dim=0)  # [T*k, H]
        entry_index = top_k_index.reshape(T * k, 1)  # [T*k, 1]
        entry_weights = torch.ones(T * k, 1, dtype=hidden_states.dtype, device=hidden_states.device)  # [T*k, 1]
        out = None
        in_flight: list = []
        for step in steps:
            if step[0] == "load":
                in_flight += self._load(step[1])
                continue
            _, group, wait = step
            if wait:
                started = time.perf_counter()
                engine.copier.wait(in_flight)
                engine._copy_wait_s += time.perf_counter() - started
                in_flight = []
            whole = len(group) == len(hits) + len(misses)  # the whole union
            part = compute(self.views[0 if whole else 1], self._slot_index(group, whole, entry_index), entry_states,
                           entry_weights)
            out = part if out is None else out.add_(part)
        if out is None:
            return torch.zeros_like(hidden_states)
        if by_row:
            return torch.cat([self._combine(out[t * k:(t + 1) * k], top_k_index[t:t + 1], top_k_weights[t:t + 1])
                              for t in range(T)])  # [T, H]
        return self._combine(out, top_k_index, top_k_weights)  # [T, H]

    def _combine(self, outputs: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """The weighted sum over the top-k of the entries' expert outputs [T*k, H], in the target's arithmetic.

        grouped_mm and batched_mm multiply in the promoted dtype (float32 when the router returns float32 gate
        weights, as Mixtral's does, over bfloat16 states), sum over k in the entries' order there and cast to the
        states' dtype once. The eager forward casts each weighted entry to the states' dtype and adds the entries
        of a token in increasing expert id, rounding after each addition (``index_add_`` expert by expert).
        """
        T, k = top_k_index.shape
        dtype = outputs.dtype
        weighted = (outputs * top_k_weights.reshape(T * k, 1)).view(T, k, -1)  # [T, k, H], the promoted dtype
        if self.engine.split_arithmetic == "promote":
            return weighted.sum(dim=1).to(dtype)
        weighted = weighted.to(dtype)
        order = top_k_index.argsort(dim=1)  # [T, k]: each token's entries by increasing expert id
        tokens = torch.arange(T, device=order.device)
        total = torch.zeros_like(weighted[:, 0])  # [T, H]
        for j in range(k):
            total = total + weighted[tokens, order[:, j]]
        return total

    def _slot_index(self, group: list[tuple[int, int]], whole: bool, top_k_index: torch.Tensor) -> torch.Tensor:
        """[T, k] the slot row of each routed entry of ``group``, the sentinel (the slot rows' count) outside it."""
        return self._group_table(group, whole, top_k_index.device)[top_k_index]

    def _compute(self, view, slot_index: torch.Tensor, hidden_states: torch.Tensor,
                 top_k_weights: torch.Tensor) -> torch.Tensor:
        """The target's experts implementation over ``view``'s rows (slot rows, or the host rows) for the routed
        entries ``slot_index`` indexes [T, k] (the sentinel ``view.num_experts`` outside the group)."""
        slots = entries(slot_index, view.num_experts) if self.one_token else None  # a host sync, on the CPU only
        if slots is not None:
            return one_token_forward(view, hidden_states, slots, top_k_weights)
        return self.inner(view, hidden_states, slot_index, top_k_weights)

    def _compute_by_row(self, tokens: int, view, slot_index: torch.Tensor, hidden_states: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
        """`_compute` one token at a time: its rows ([1, H] of a token, or its k entries [k, H]), each a new
        tensor as a one-row forward's are, so that no kernel sees another token's rows. A token with no entry in
        the group gets the zeros the implementation would return for it, without a call."""
        per_token = hidden_states.shape[0] // tokens  # 1 (the tokens' rows) or k (their entries)
        sentinel = view.num_experts
        table = slot_index.reshape(tokens, -1).tolist()  # [tokens][entries], one host sync
        parts = []
        for t, start in enumerate(range(0, hidden_states.shape[0], per_token)):
            rows = slice(start, start + per_token)
            if all(s == sentinel for s in table[t]):
                parts.append(torch.zeros_like(hidden_states[rows]))
            elif self.one_token:  # one token's entries: a router's top-k, each expert in one slot row
                parts.append(one_token_forward(view, hidden_states[rows], table[t], top_k_weights[rows]))
            else:
                parts.append(self.inner(view, *(x[rows].clone() for x in (hidden_states, slot_index, top_k_weights))))
        return torch.cat(parts)

    def _group_table(self, group: list[tuple[int, int]], whole: bool, device: torch.device) -> torch.Tensor:
        """[E] slot row of each expert of ``group``, the sentinel elsewhere. A group that is the whole union was
        never evicted from during this forward, so the table of all resident experts serves it; it is rebuilt only
        after a change, which keeps the all-hit path short."""
        if not whole:
            return self._table(group, device)
        if self.slot_table is None:
            self.slot_table = self._table(self.cache.slot_of.items(), device)
        return self.slot_table

    def _table(self, pairs, device: torch.device) -> torch.Tensor:
        slot_of = [self.rows] * self.num_experts  # [E], the sentinel row index for experts not listed
        for e, slot in pairs:
            slot_of[e] = slot
        return torch.tensor(slot_of, device=device)


def _offloaded_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The ``specfit_offload`` experts implementation: hands the layer to its offload engine."""
    layer = getattr(self, "_specfit_layer", None)
    if layer is None:
        raise RuntimeError(f"{type(self).__name__} uses {EXPERTS_IMPLEMENTATION!r} but was not offloaded")
    return layer.forward(hidden_states, top_k_index, top_k_weights)


ExpertsInterface.register(EXPERTS_IMPLEMENTATION, _offloaded_experts_forward)


def compute_device(model: nn.Module, modules: list[nn.Module], family: MoEFamily) -> torch.device:
    expert_params = {id(getattr(m, n)) for m in modules for n in family.weights}
    for param in model.parameters():
        if id(param) not in expert_params:
            return param.device
    return torch.device("cpu")


def to_host(module: nn.Module, family: MoEFamily, pin: bool) -> dict[str, torch.Tensor]:
    """Move one experts module's fused weights to host memory (they stay its parameters); the host rows."""
    host = {}
    for name in family.weights:
        param = getattr(module, name)
        data = param.data if param.device.type == "cpu" else param.data.to("cpu")
        if pin and not data.is_pinned():
            data = data.pin_memory()
        param.data = data
        host[name] = param.detach()  # [E, ...]
    return host


def move_all_but_experts(model: nn.Module, modules: list[nn.Module], family: MoEFamily, device: torch.device) -> None:
    """``model.to(device)`` leaving the experts' host storage where it is."""
    held = [(getattr(m, n), getattr(m, n).data) for m in modules for n in family.weights]
    for param, _ in held:
        param.data = torch.empty(0, dtype=param.dtype)
    model.to(device)
    for param, data in held:
        param.data = data


def slot_buffers(host: dict[str, torch.Tensor], capacity: int, device: torch.device) -> dict[str, torch.Tensor]:
    # At least two rows: transformers' grouped_mm counts tokens per row with histc, which takes min == max == 0
    # (a single row) to mean "use the data's range" and would then count the sentinel entries.
    # Zeros, not empty: batched_mm multiplies the rows it reads for sentinel entries by a zero weight, and an
    # uninitialized row may hold NaN.
    rows = max(capacity, 2)
    return {n: torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=device) for n, t in host.items()}
