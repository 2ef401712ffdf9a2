"""The LRU expert cache of one MoE layer's device slots: which experts are resident, which slot each occupies, and
the plan of copies and computes a layer forward runs (`ExpertCache.admit`). Pure bookkeeping, no tensors.

Touch order (what decides later evictions; an LRU simulation over the recorded routes reproduces every counter):

1. The layer's demand is the union of the experts that the forward's tokens route to, in increasing expert id.
2. Hits (experts already resident) are touched first, in increasing expert id: each becomes most recently used.
3. Misses follow in increasing expert id: each takes a free slot, else evicts the least recently used expert.

Hits are computed while the misses' copies are in flight. When the union exceeds the slots, an admission whose
victim has not been computed yet first computes the group waiting for it, so the forward runs in groups and every
expert is still loaded at most once per layer forward.
"""

from __future__ import annotations

from collections import OrderedDict

# A plan step: ("load", [(expert, slot), ...]) issues copies; ("compute", [(expert, slot), ...], wait) runs the
# target's experts implementation on that group, first waiting for the copies in flight when ``wait``.
Step = tuple


class ExpertCache:
    """The LRU of one layer's device slots (expert id -> slot, least recently used first)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.clear()

    def clear(self) -> None:
        self.slot_of: OrderedDict[int, int] = OrderedDict()
        self.free = list(range(self.capacity - 1, -1, -1))  # popped from the end: slot 0 first

    def fill(self) -> None:
        """Every expert resident, expert e in slot e (a resident device: capacity = the layer's experts)."""
        self.slot_of = OrderedDict((e, e) for e in range(self.capacity))
        self.free = []

    def admit(self, union: list[int]) -> tuple[list[int], list[int], list[Step]]:
        """Touch ``union`` (increasing expert ids) in the documented order; return hits, misses and the plan."""
        slot_of = self.slot_of
        hits = [e for e in union if e in slot_of]
        misses = [e for e in union if e not in slot_of]
        for e in hits:
            slot_of.move_to_end(e)
        hit_group = [(e, slot_of[e]) for e in hits]
        uncomputed_hits = set(hits)
        steps: list[Step] = []
        loads: list[tuple[int, int]] = []
        pending: list[tuple[int, int]] = []  # loaded (or loading) in this forward, not computed yet
        pending_ids: set[int] = set()

        def flush_loads() -> None:
            if loads:
                steps.append(("load", loads.copy()))
                loads.clear()

        for e in misses:
            if self.free:
                slot, victim = self.free.pop(), None
            else:
                victim, slot = slot_of.popitem(last=False)
            if victim in uncomputed_hits:
                flush_loads()  # the copies issued so far overlap the hits' compute
                steps.append(("compute", hit_group, False))
                uncomputed_hits.clear()
            elif victim in pending_ids:
                flush_loads()
                steps.append(("compute", pending.copy(), True))
                pending.clear()
                pending_ids.clear()
            slot_of[e] = slot
            loads.append((e, slot))
            pending.append((e, slot))
            pending_ids.add(e)
        flush_loads()
        if uncomputed_hits:
            steps.append(("compute", hit_group, False))
        if pending:
            steps.append(("compute", pending, True))
        return hits, misses, steps


    def prefetch(self, expert: int, protect) -> tuple[int, int | None] | None:
        """Make ``expert`` (not resident) resident ahead of a forward, as that forward would admit it: a free slot,
        else the slot of the least recently used expert outside ``protect`` (a set of expert ids, never evicted).
        It lands most recently used. Returns (slot, victim or None), or None when every resident expert is protected.
        """
        slot_of = self.slot_of
        if self.free:
            slot, victim = self.free.pop(), None
        else:
            victim = next((e for e in slot_of if e not in protect), None)  # least recently used first
            if victim is None:
                return None
            slot = slot_of.pop(victim)
        slot_of[expert] = slot
        return slot, victim
