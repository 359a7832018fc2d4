"""Prompt-lookup n-gram drafting: no model, just the text so far.

For each row, look for the latest earlier occurrence of its last n tokens (n from max_n down to min_n) and
propose the up to K tokens that followed it. Code, quotes, lists and summaries repeat their context a lot,
so this drafter is free and often right. It is deterministic, so rejection sampling treats its proposals as
q = one-hot (draft_probs=None); rows with no match propose nothing (num_draft 0).

Each proposed token carries the key ("ngram", n, position): the controller learns how often matches of each
length land at each position (a run's stats["acceptance_table"]; `python bench/speculation.py --target DIR`
keeps it per cell in its JSON) and verifies a proposal only when that pays for its width. So short matches
are proposed too (min_n=1) and priced, not filtered out by a threshold: on SmolLM2 a 1-gram match's first
token lands far less often than a 4-gram's, and the table says by how much on the text at hand.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..kv.batch import StepBatch
from .base import Keys, Proposal


class NgramIndex:
    """The token history of one sequence with, for every n-gram size, where the latest occurrence of each
    n-gram was followed. Updated per appended token, so a lookup costs O(max_n) whatever the length."""

    def __init__(self, tokens: Sequence[int], max_n: int, min_n: int):
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        self.follow: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            j = len(self.tokens)  # the new token's index: every n-gram ending just before it is followed by it
            for n in range(self.min_n, self.max_n + 1):
                if j >= n:
                    self.follow[tuple(self.tokens[j - n:j])] = j
            self.tokens.append(int(token))

    def match(self, k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix, and the
        length n of that suffix (0: no match)."""
        length = len(self.tokens)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            start = self.follow.get(tuple(self.tokens[length - n:]))
            if start is not None:
                return self.tokens[start:start + k], n
        return [], 0

    def propose(self, k: int) -> list[int]:
        return self.match(k)[0]


class NgramDrafter:
    """The drafter protocol (specdec.drafting.base) over one NgramIndex per sequence."""

    kv_model = None

    def __init__(self, max_n: int = 4, min_n: int = 1):
        if isinstance(max_n, bool) or isinstance(min_n, bool) or not isinstance(max_n, int) \
                or not isinstance(min_n, int) or not 1 <= min_n <= max_n:
            raise ValueError(f"need ints 1 <= min_n <= max_n, got min_n={min_n!r}, max_n={max_n!r}")
        self.max_n, self.min_n = max_n, min_n
        self.seqs: dict[int, NgramIndex] = {}
        self._offered: dict[int, tuple[list[int], int]] = {}

    def start(self, seq: int, prompt: Sequence[int], first: int) -> None:
        self.seqs[seq] = NgramIndex(list(prompt) + [int(first)], self.max_n, self.min_n)

    def finish(self, seq: int) -> None:
        self.seqs.pop(seq, None)
        self._offered.pop(seq, None)

    def lag(self, batch: StepBatch) -> int:
        return 0

    def offer(self, batch: StepBatch, k: int) -> Keys:
        keys = []
        for s in batch.seqs:
            tokens, n = self._offered[s] = self.seqs[s].match(k)
            keys.append([("ngram", n, i + 1) for i in range(len(tokens))])
        return keys

    def propose(self, batch: StepBatch, k: int, sampling=None, generator=None, stop=None) -> Proposal:
        found = [self._offered.pop(s, None) or self.seqs[s].match(k) for s in batch.seqs]
        width = max((len(t[:k]) for t, _ in found), default=0)
        tokens = torch.full((len(found), width), -1, dtype=torch.int64)
        for b, (proposal, _) in enumerate(found):
            if proposal:
                tokens[b, :len(proposal[:k])] = torch.tensor(proposal[:k], dtype=torch.int64)
        counts = [len(t[:k]) for t, _ in found]
        keys = [[("ngram", n, i + 1) for i in range(c)] for (_, n), c in zip(found, counts)]
        return Proposal(tokens.to(batch.last.device, non_blocking=True), None, counts, keys)

    def commit(self, batch: StepBatch, proposal: Proposal | None, emitted: list[list[int]]) -> list[int] | None:
        for s, out in zip(batch.seqs, emitted):
            self.seqs[s].extend(out)
        return None
