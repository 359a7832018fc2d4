"""EQSPEC: one static batch of up to batch_size rows, realigned after every step.

After a verification the rows have accepted different numbers of drafts, so every row of the target's lane (and
the draft model's) drops its rejected tail and the rows are shifted back into right alignment (the realign
phase: sk.shift_rows_, holes in the mask, or the paper's row loop; see specdec.kv.ragged). A finished row is
refilled with the next waiting prompt in place (its prefill is placed right-aligned into the row), and once
nothing waits, finished rows are evicted so the batch shrinks.

The draft model's lane opens empty for every new sequence: the drafter catches up on the prompt when it next
drafts (specdec.drafting.model).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..kv.batch import StepBatch
from ..kv.ragged import RaggedKV, initial_room


class EqspecSource:
    commit_phase = "realign"

    def __init__(self, target, draft_model, batch_size: int, max_new: int, k: int, backend: str | None,
                 realign: str, compact_threshold: float | None):
        self.target_model, self.draft_model = target, draft_model
        self.batch_size, self.max_new, self.k = batch_size, max_new, k
        self.backend, self.realign, self.compact_threshold = backend, realign, compact_threshold
        self.target: RaggedKV | None = None
        self.draft: RaggedKV | None = None
        self.rows: list[int | None] = []  # batch row -> sequence, None: free (to refill or evict)
        self.last: torch.Tensor | None = None
        self.opened = False

    def _lane_kwargs(self) -> dict:
        return {"backend": self.backend, "realign": self.realign, "compact_threshold": self.compact_threshold}

    def room(self) -> int:
        if not self.opened:
            return self.batch_size
        return sum(r is None for r in self.rows)

    def admit(self, seqs: list[int], prompts: list[list[int]], pick) -> torch.Tensor:
        extra = initial_room(self.max_new, self.k)  # bounded: the slabs grow as rows do
        if not self.opened:
            self.opened = True
            self.target, logits = RaggedKV.prefill(self.target_model, prompts, extra, **self._lane_kwargs())
            first = pick(logits, seqs)
            self.rows = list(seqs)
            self.last = first.clone()
            if self.draft_model is not None:
                width = max(len(p) for p in prompts)
                self.draft = RaggedKV.empty(self.draft_model, len(seqs), width + extra, **self._lane_kwargs())
            return first
        free = [r for r, s in enumerate(self.rows) if s is None][:len(seqs)]
        src, logits = RaggedKV.prefill(self.target_model, prompts, 0, **self._lane_kwargs())
        first = pick(logits, seqs)
        self.target.place(free, src)
        index = torch.tensor(free, dtype=torch.int64).to(self.last.device, non_blocking=True)
        self.last[index] = first
        if self.draft is not None:
            self.draft.clear_rows(free)
        for r, s in zip(free, seqs):
            self.rows[r] = s
        return first

    def next_batch(self, waiting: int = 0) -> StepBatch:
        if any(s is None for s in self.rows):  # nothing waits for these rows: evict them
            keep = [r for r, s in enumerate(self.rows) if s is not None]
            self.target.select_rows(keep)
            if self.draft is not None:
                self.draft.select_rows(keep)
            index = torch.tensor(keep, dtype=torch.int64).to(self.last.device, non_blocking=True)
            self.last = self.last.index_select(0, index)
            self.rows = [self.rows[r] for r in keep]
        return StepBatch(list(self.rows), self.target, self.last, self.draft)

    def commit(self, batch: StepBatch, target_drop: list[int], draft_drop: list[int] | None,
               last: torch.Tensor) -> None:
        self.target.drop_and_align(target_drop)
        if draft_drop is not None:
            self.draft.drop_and_align(draft_drop)
        self.last = last

    def retire(self, seqs: Sequence[int]) -> None:
        gone = set(seqs)
        self.rows = [None if s in gone else s for s in self.rows]

    def stats(self) -> dict:
        lanes = [lane for lane in (self.target, self.draft) if lane is not None]
        # realign="mask" (and catch-up holes): compactions of the target's and the draft model's lanes, together
        return {"compactions": sum(lane.compactions for lane in lanes)}
