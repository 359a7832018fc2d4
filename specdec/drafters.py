"""Drafters: whatever proposes the K tokens per row that the target verifies.

The engine talks to a drafter through a small protocol, so a model-free drafter (specdec.ngram.NgramDrafter: prompt
lookup) plugs in beside the draft model:

    begin(prompts, first_tokens, ...)   a new batch: row b holds prompts[b] + [first_tokens[b]]
    propose(k, sampling, generator)     -> Proposal(tokens [B, K], probs [B, K, V] | None, num_draft [B] | None)
    accept(tokens, num_accepted)        row b emitted tokens[b, :a_b + 1] (a_b accepted drafts, then the
                                        target's token); realign internal state
    evict(keep)                         keep only rows `keep` (int64 index, in that order)
    refill(rows, prompts, first_tokens) rows `rows` now hold new sequences

probs is the distribution the drafts were sampled from (None: deterministic drafts, which the rejection rule
treats as q = one-hot). num_draft lets a drafter propose fewer than K tokens for some rows; unused slots may
hold any id. A drafter sees every emitted token through begin/accept/refill, so it can keep its own history.

EXSPEC (specdec.exspec) keeps its sequences in a pool of slots and steps a different group of them each time;
a drafter for it (PoolDrafter) has three more hooks, and then refill's rows are pool slots (evict is unused):

    begin_pool(size, k, *, extra_capacity)   an empty pool of `size` slots (k: drafts per step)
    gather(slots)                         the next propose/accept act on these slots (int64 index, in order);
                                          accept then writes each row's outcome back to its slot
    align()                               after gather: line up the group's rows if their lengths differ
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch

from .batch import RaggedKV
from .sampling import SamplingConfig, greedy, sample


@dataclass
class Proposal:
    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    num_draft: torch.Tensor | None = None


@runtime_checkable
class Drafter(Protocol):
    def begin(self, prompts: Sequence[Sequence[int]], first_tokens: torch.Tensor, *, extra_capacity: int) -> None:
        ...

    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        ...

    def accept(self, tokens: torch.Tensor, num_accepted: torch.Tensor) -> None:
        ...

    def evict(self, keep: torch.Tensor) -> None:
        ...

    def refill(self, rows: torch.Tensor, prompts: Sequence[Sequence[int]], first_tokens: torch.Tensor) -> None:
        ...


@runtime_checkable
class PoolDrafter(Drafter, Protocol):
    def begin_pool(self, size: int, k: int, *, extra_capacity: int) -> None:
        ...

    def gather(self, slots: torch.Tensor) -> None:
        ...

    def align(self) -> None:
        ...


class ModelDrafter:
    """A Hugging Face causal LM as drafter, with its own ragged batch and slab KV cache that persist across
    steps (no re-prefill).

    Invariant between steps: the cache holds every token of a row except the two newest, `prev` and `last`.
    A step feeds [prev, last] (2 columns) and then K-1 of its own drafts one at a time: K+1 new columns,
    giving K drafts. When row b accepts a_b drafts it emitted last, d_1..d_{a_b}, t; its new (prev, last) is
    (d_{a_b} or the old last, t), so the cache must keep prev, last, d_1..d_{a_b - 1}: a_b + 1 of its K+1 new
    columns, the same count the target keeps of ITS K+1 (last, d_1..d_K). With a_b = K the cache already holds
    d_{K-1}, computed while drafting d_K, which is why the step starts with two tokens rather than one.
    """

    def __init__(self, model, backend: str | None = None, realign: str = "shift",
                 compact_threshold: float | None = None):
        self.model = model
        self.backend = backend
        self.realign = realign
        self.compact_threshold = compact_threshold
        self.device = next(model.parameters()).device
        self.state: RaggedKV | None = None
        self.prev: torch.Tensor | None = None
        self.last: torch.Tensor | None = None
        self._k = 0
        # EXSPEC pool mode: a SlotPool, each slot's prev/last, and the slots of the gathered step batch
        self.pool = None
        self.slots: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def _prefill(self, prompts, extra: int) -> tuple[RaggedKV, torch.Tensor]:
        # Logits are not needed: the draft only has to hold the prompt minus its final token, which is
        # every row's last column (right-aligned), so one common crop establishes the invariant.
        state, _ = RaggedKV.prefill(self.model, prompts, extra, self.backend, logits_to_keep=1, realign=self.realign,
                                    compact_threshold=self.compact_threshold)
        state.crop(1)
        prev = torch.tensor([p[-1] for p in prompts], dtype=torch.int64, device=self.device)
        return state, prev

    def begin(self, prompts, first_tokens, *, extra_capacity: int) -> None:
        self.pool = self.slots = None
        self.state, self.prev = self._prefill(prompts, extra_capacity)
        self.last = first_tokens.to(self.device, torch.int64).clone()

    def propose(self, k: int, sampling: SamplingConfig, generator) -> Proposal:
        self._k = k
        logits = self.state.forward(torch.stack([self.prev, self.last], dim=1), logits_to_keep=1)[:, -1]
        drafts, probs = [], []
        for i in range(k):
            if sampling.do_sample:
                q = sampling.probs(logits)
                d = sample(q, generator)
                probs.append(q)
            else:
                d = greedy(logits)
            drafts.append(d)
            if i + 1 < k:
                logits = self.state.forward(d[:, None])[:, -1]
        return Proposal(torch.stack(drafts, dim=1), torch.stack(probs, dim=1) if probs else None, None)

    def accept(self, tokens: torch.Tensor, num_accepted: torch.Tensor) -> None:
        a = num_accepted.to(self.device)
        if self.slots is None:
            self.state.drop_and_align(self._k - a)
        else:  # the K+1 columns propose wrote from _base: each row's a_b + 1 kept ones go to the end of its slot
            self.pool.scatter(self.slots, self.state, self._base, a + 1)
        before = tokens.gather(1, (a - 1).clamp(min=0)[:, None]).squeeze(1)
        self.prev = torch.where(a > 0, before, self.last)
        self.last = tokens.gather(1, a[:, None]).squeeze(1)
        if self.slots is not None:
            self._slot_prev[self.slots] = self.prev
            self._slot_last[self.slots] = self.last

    def evict(self, keep: torch.Tensor) -> None:
        keep = keep.to(self.device)
        self.state.select_rows(keep)
        self.prev = self.prev.index_select(0, keep)
        self.last = self.last.index_select(0, keep)

    def refill(self, rows, prompts, first_tokens) -> None:
        rows = rows.to(self.device)
        src, prev = self._prefill(prompts, 0)
        if self.pool is not None:
            self.pool.admit(rows, src)
            self._slot_prev[rows] = prev
            self._slot_last[rows] = first_tokens.to(self.device, torch.int64)
            return
        self.state.place(rows, src)
        self.prev[rows] = prev
        self.last[rows] = first_tokens.to(self.device, torch.int64)

    # ------------------------------------------------------------------------------- EXSPEC pool mode
    def begin_pool(self, size: int, k: int, *, extra_capacity: int) -> None:
        from .exspec import SlotPool  # exspec imports the engine, which imports this module
        # propose writes k + 1 columns a step: [prev, last], then k - 1 drafts
        self.pool = SlotPool(self.model, size, extra_capacity, k + 1, self.backend, self.realign)
        self._slot_prev = torch.zeros(size, dtype=torch.int64, device=self.device)
        self._slot_last = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.slots = None

    def gather(self, slots: torch.Tensor) -> None:
        self.slots = slots.to(self.device)
        self.state, self._pad = self.pool.gather(self.slots)
        self._base = self.state.length
        self.prev = self._slot_prev.index_select(0, self.slots)
        self.last = self._slot_last.index_select(0, self.slots)

    def align(self) -> None:
        self.pool.align(self.state, self._pad)
        self._base = self.state.length

