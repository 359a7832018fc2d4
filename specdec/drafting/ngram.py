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

Hindsight. A proposal the controller did not verify (a plain step, or a row narrowed to fewer drafts than it
offered) is judged by the tokens that follow it: draft i "would have been accepted" iff the tokens after the
verified ones match drafts 1..i. For greedy decoding that is the verdict verification would have given. When
sampling it has the same law: a deterministic draft d is accepted with probability p(d), and the token the
target emits there is d with probability p(d), given the same prefix. So the controller learns what matches are
worth during plain spells, for free, instead of paying exploration steps for it (`judged()`). It only ever
learns from tokens already emitted, so it cannot bias a later step's verdict.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..kv.batch import StepBatch
from .base import Keys, Proposal

_KEY_LISTS: dict[tuple[int, int, int], list[tuple]] = {}


def ngram_keys(n: int, count: int, base: int = 0) -> list[tuple]:
    """[("ngram", n, base + 1), ..., ("ngram", n, base + count)]: one shared list per (n, count, base), which no
    caller mutates. Offers repeat the same few every step; shared, the controller prices a list once per step
    (it memoises by list identity) and a standing plain step recognises an unchanged offer by identity."""
    keys = _KEY_LISTS.get((n, count, base))
    if keys is None:
        keys = _KEY_LISTS[(n, count, base)] = [("ngram", n, base + i + 1) for i in range(count)]
    return keys


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
        # hindsight (the decode loop turns it on when its controller is adaptive): this step's offers, the
        # unverified drafts of past offers still waiting for tokens to judge them, and the judged ones
        self.hindsight = False
        self._step_offer: dict[int, tuple[list[int], int]] = {}
        self._open: dict[int, list[list]] = {}  # seq -> [[drafts, n, position of drafts[0] - 1, matched]]
        self._judged: list[tuple[int, list[tuple], int]] = []

    def start(self, seq: int, prompt: Sequence[int], first: int) -> None:
        self.seqs[seq] = NgramIndex(list(prompt) + [int(first)], self.max_n, self.min_n)

    def finish(self, seq: int) -> None:
        self.seqs.pop(seq, None)
        self._offered.pop(seq, None)
        self._step_offer.pop(seq, None)
        self._open.pop(seq, None)

    def lag(self, batch: StepBatch) -> int:
        return 0

    def offer(self, batch: StepBatch, k: int) -> Keys:
        keys, seqs, offered = [], self.seqs, self._offered
        step = self._step_offer if self.hindsight else None
        for s in batch.seqs:
            found = offered[s] = seqs[s].match(k)
            if step is not None:
                step[s] = found
            keys.append(ngram_keys(found[1], len(found[0])))
        return keys

    def propose(self, batch: StepBatch, k: int, sampling=None, generator=None, stop=None) -> Proposal:
        found = [self._offered.pop(s, None) or self.seqs[s].match(k) for s in batch.seqs]
        width = max((len(t[:k]) for t, _ in found), default=0)
        tokens = torch.full((len(found), width), -1, dtype=torch.int64)
        for b, (proposal, _) in enumerate(found):
            if proposal:
                tokens[b, :len(proposal[:k])] = torch.tensor(proposal[:k], dtype=torch.int64)
        counts = [len(t[:k]) for t, _ in found]
        keys = [ngram_keys(n, c) for (_, n), c in zip(found, counts)]
        return Proposal(tokens.to(batch.last.device, non_blocking=True), None, counts, keys)

    def commit(self, batch: StepBatch, proposal: Proposal | None, emitted: list[list[int]]) -> list[int] | None:
        for s, out in zip(batch.seqs, emitted):
            self.seqs[s].extend(out)
        if self.hindsight:
            self._judge(batch.seqs, [0] * len(emitted) if proposal is None else proposal.counts(), emitted)
        return None

    def _judge(self, seqs: list[int], verified: list[int], emitted: list[list[int]]) -> None:
        opened, step = self._open, self._step_offer
        for s, c, out in zip(seqs, verified, emitted):
            pending = opened.get(s)
            closed = False
            if pending is not None:
                for shadow in pending:
                    self._match(s, shadow, out)
                    closed |= shadow[3] is None
            offered = step.pop(s, None)
            # every verified draft accepted (always so after a plain step): out[c] is the target's token where
            # the first unverified draft stood
            if offered is not None and len(offered[0]) > c and len(out) == c + 1:
                shadow = [offered[0][c:], offered[1], c, 0]
                self._match(s, shadow, out[c:])
                if shadow[3] is not None:
                    if pending is None:
                        pending = opened[s] = []
                    pending.append(shadow)
            if closed:
                pending = [sh for sh in pending if sh[3] is not None]
                if pending:
                    opened[s] = pending
                else:
                    del opened[s]

    def _match(self, seq: int, shadow: list, tokens: list[int]) -> None:
        """Advance an open judgement over the tokens that followed; once decided, queue it and mark it closed."""
        drafts, n, base, matched = shadow
        if matched is None:
            return
        for t in tokens:
            hit = t == drafts[matched]
            matched += hit
            if not hit or matched == len(drafts):  # decided: a miss (its draft was reached too), or all matched
                reached = matched + (not hit)
                self._judged.append((seq, ngram_keys(n, reached, base), matched))
                shadow[3] = None
                return
        shadow[3] = matched

    def judged(self) -> list[tuple[int, list[tuple], int]]:
        """The unverified drafts judged since the last call: (seq, their keys up to the first miss, how many of
        them matched), in the order they were decided."""
        out, self._judged = self._judged, []
        return out
