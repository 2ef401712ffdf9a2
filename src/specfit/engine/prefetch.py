"""Copies issued ahead of a forward (`OffloadEngine.prefetch`): specfit-prefetch and eagle3-prefetch copy the
experts the subtree about to be verified is predicted to need while the drafter still drafts
(`specfit.speculative.prefetching`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specfit.engine.offload import OffloadEngine


def prefetch(engine: OffloadEngine, wanted, protect) -> int:
    """Copy experts into their layers' caches ahead of the next forward; returns how many copies were issued.

    ``wanted``: (layer, expert) pairs, most valuable first; ``protect[l]``: the experts layer l must keep (those
    the subtree about to be verified is predicted to need). Each expert not resident takes its slot as that
    forward would admit it (`ExpertCache.prefetch`): a free slot, else the least recently used expert that is
    neither protected nor prefetched since the layer's last forward; an expert with no such victim is skipped.
    The copies go through the forward's own copier (the same ``max_inflight`` streams or lanes) and, on an
    emulated device, onto the one modelled link from now on, so a forward that begins before they land waits
    only for what is left of them and queues its own misses behind them. They are left to complete: the next
    forward of the layer waits for them before it reads or overwrites a slot. Outputs and logits are those of
    any other cache state. Without an expert cache (slots 0, cleared before every forward) nothing is copied.
    """
    if engine.config.slots == 0:
        return 0
    if engine.priced:
        raise RuntimeError("a prefetch reads the cache it copies into: no other slot count is priced beside it")
    loads: dict[int, list[tuple[int, int]]] = {}  # layer -> (expert, slot), in the order given
    keep: dict[int, set[int]] = {}  # layer -> what it must not evict: protected, or prefetched since its forward
    for index, e in wanted:
        layer = engine.layers[index]
        if e in layer.cache.slot_of:
            continue
        if index not in keep:
            keep[index] = set(protect[index]) | layer.prefetched.keys()
        placed = layer.cache.prefetch(e, keep[index])
        if placed is None:
            continue
        layer.slot_table = None
        layer.prefetched[e] = engine.timeline.copy_ahead() if engine.timeline is not None else (0.0, 0.0)
        keep[index].add(e)
        loads.setdefault(index, []).append((e, placed[0]))
    for index, pairs in loads.items():
        layer = engine.layers[index]
        layer.prefetch_handles += engine.copier.submit(layer.copy_jobs(pairs), ahead=True)
        engine._total.transfers[index] += len(pairs)
    issued = sum(map(len, loads.values()))
    engine._prefetch.issued += issued
    return issued
