"""EXSPEC: a sliding pool of sequences, stepped in groups of equal cached length.

EQSPEC steps one static batch: after every verification its rows have accepted different numbers of drafts, so
every row of every lane is shifted back into right alignment, and rows of very different lengths share a batch,
so the shorter ones drag padding through every attention.

EXSPEC keeps up to `window` unfinished sequences in a pool (specdec.kv.pool.SlotPool: each sequence left-aligned
in its own slot, so it grows without moving anything) and, each step, copies a group of `batch_size` of them
into a step batch:

    pick     batch_size slots of one cached length if there are that many (a full group); else the first slot
             by priority, the other slots of its length, and the closest lengths (see "Policy" below)
    gather   index_select those slots' live columns into a reused step buffer (schedule phase)
    align    only for a group of unequal lengths: right-align it the way the realign mode says (realign phase)
    draft, verify, sample   exactly as EQSPEC (the same decode loop)
    scatter  each row's kept columns go back to the end of its slot; nothing is shifted (schedule phase)

What this buys: an equal-length group has no padding and needs no realignment at all, since kept columns are
written straight to where they belong in the pool. What it costs: the gather copies every live column of the
group's rows, for the target and the draft model, every step (the size of one realignment shift of the whole
batch, paid even when nothing needs aligning); the scatter is small. So EXSPEC wins when realignment and padding
are expensive (long, ragged batches; the Python-loop realignment) and loses a copy's worth when they are cheap.

Policy. Priority is "oldest prompt first" while prompts wait (finishing sequences frees slots, so the window
keeps sliding) and "fewest tokens emitted first" once none wait (the remaining work stays balanced, so the last
groups stay full instead of a few stragglers stepping alone). Always taking the largest equal-length set
instead keeps stepping whichever rows happen to collide and starves the others (measured in the README's
EXSPEC section: more steps, lower group rate).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..kv.batch import StepBatch
from ..kv.pool import SlotPool
from ..kv.ragged import RaggedKV, initial_room


class ExspecSource:
    commit_phase = "schedule"

    def __init__(self, target, draft_model, batch_size: int, max_new: int, k: int, backend: str | None,
                 realign: str, window: int, prompts: Sequence[Sequence[int]], out: list[list[int]], timer,
                 draft_room: int = 0):
        self.batch_size, self.backend, self.realign, self.timer = batch_size, backend, realign, timer
        self.prompts, self.out = prompts, out
        self.window = max(1, min(window, len(prompts)))
        room = k + 1 + draft_room  # the step's columns, and a self-speculative draft's in the target's lane
        extra = initial_room(max_new, k)  # bounded: the pools grow in scatter as rows do
        self.target_model = target
        self.pool = SlotPool(target, self.window, extra, room, backend, realign)
        # a draft step writes its catch-up columns too: the step buffer grows to fit them
        self.draft_pool = SlotPool(draft_model, self.window, extra, room, backend, realign) \
            if draft_model is not None else None
        self.slots: list[int | None] = [None] * self.window  # slot -> sequence
        self.order: dict[int, int] = {}  # sequence -> slot
        device = self.pool.slab.device
        self.slot_last = torch.zeros(self.window, dtype=torch.int64, device=device)
        self._step: list[int] | None = None  # the slots of the step in flight
        self.groups = self.equal_groups = self.group_rows = 0
        self.padded_columns = self.gathered_columns = 0

    def room(self) -> int:
        return sum(s is None for s in self.slots)

    def _index(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(slots), dtype=torch.int64).to(self.slot_last.device, non_blocking=True)

    def admit(self, seqs: list[int], prompts: list[list[int]], pick) -> torch.Tensor:
        """Prefill into free slots, at most batch_size prompts at once and the closest lengths together (less
        padding); first tokens come back in the order of `seqs`."""
        free = [s for s, q in enumerate(self.slots) if q is None][:len(seqs)]
        order = sorted(range(len(seqs)), key=lambda i: len(prompts[i]))
        first = torch.empty(len(seqs), dtype=torch.int64, device=self.slot_last.device)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            slots = [free[i] for i in chunk]
            src, logits = RaggedKV.prefill(self.target_model, [prompts[i] for i in chunk], 0, self.backend,
                                           realign=self.realign)
            tokens = pick(logits, [seqs[i] for i in chunk])
            self.pool.admit(slots, src)
            if self.draft_pool is not None:
                self.draft_pool.admit_empty(slots)
            index = self._index(slots)
            self.slot_last[index] = tokens
            first[self._index(chunk)] = tokens
            for i, slot in zip(chunk, slots):
                self.slots[slot] = seqs[i]
                self.order[seqs[i]] = slot
        return first

    def next_batch(self, waiting: int = 0) -> StepBatch:
        slots = self.pick(waiting > 0)
        index = self._index(slots)
        target, pad = self.pool.gather(slots)
        draft, draft_pad = self.draft_pool.gather(slots) if self.draft_pool is not None else (None, None)
        if any(pad) or (draft_pad and any(draft_pad)):
            with self.timer.phase("realign"):
                self.pool.align(target, pad)
                if draft is not None:
                    self.draft_pool.align(draft, draft_pad)
        self._step = slots
        return StepBatch([self.slots[s] for s in slots], target, self.slot_last.index_select(0, index), draft)

    def commit(self, batch: StepBatch, target_drop: list[int], draft_drop: list[int] | None,
               last: torch.Tensor) -> None:
        slots = self._step
        self.pool.scatter(slots, batch.target, target_drop)
        if draft_drop is not None:
            self.draft_pool.scatter(slots, batch.draft, draft_drop)
        self.slot_last[self._index(slots)] = last
        self._step = None

    def retire(self, seqs: Sequence[int]) -> None:
        for seq in seqs:
            self.slots[self.order.pop(seq)] = None

    def pick(self, waiting: bool) -> list[int]:
        """The step's group of live slots: a full group of equal length if there is one, else the first slot
        by priority with its equal-length peers, filled up with the closest lengths. See the module docstring."""
        lengths, owner = self.pool.lengths, self.slots
        if waiting:
            def priority(s):  # the oldest first: finished sequences free slots for the waiting prompts
                return owner[s]
        else:
            def priority(s):  # the least progressed first: the last groups stay full
                return len(self.out[owner[s]]), owner[s]
        live = sorted((s for s, q in enumerate(owner) if q is not None), key=priority)
        by_length: dict[int, list[int]] = {}
        for s in live:
            by_length.setdefault(lengths[s], []).append(s)
        size = min(self.batch_size, len(live))
        full = next((group for group in (by_length[lengths[s]] for s in live) if len(group) >= size), None)
        if full is not None:
            chosen = full[:size]
        else:
            anchor = lengths[live[0]]
            chosen = by_length[anchor][:size]
            rest = sorted((s for s in live if lengths[s] != anchor),
                          key=lambda s: (abs(lengths[s] - anchor), priority(s)))
            chosen += rest[:size - len(chosen)]
        picked = [lengths[s] for s in chosen]
        top = max(picked)
        self.groups += 1
        self.equal_groups += min(picked) == top
        self.group_rows += len(chosen)
        self.padded_columns += top * len(picked) - sum(picked)
        self.gathered_columns += top * len(picked)
        return chosen

    def stats(self) -> dict:
        return {
            "window": self.window,
            "groups": self.groups,
            "group_rate": self.equal_groups / self.groups if self.groups else 0.0,  # groups needing no alignment
            "mean_group_rows": self.group_rows / self.groups if self.groups else 0.0,
            "padding_fraction": self.padded_columns / self.gathered_columns if self.gathered_columns else 0.0,
            "compactions": 0,
        }
