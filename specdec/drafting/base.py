"""The drafter protocol: whatever proposes the tokens per row that the target verifies.

The decode loop talks to a drafter through five calls, each given the step's StepBatch (specdec.kv.batch), so a
drafter never knows which scheduler runs it:

    start(seq, prompt, first)           a new sequence: its prompt and the target's first token
    offer(batch, k) -> keys             before the step: per row, the features of the up to k drafts it could
                                        propose (the controller prices them; see specdec.scheduling.control)
    propose(batch, k, sampling, generator, stop) -> Proposal
                                        up to k drafts per row; stop(i, keys) may end a draft model early
    commit(batch, proposal, emitted) -> drop | None
                                        the step's outcome: row b emitted `emitted[b]` (its accepted drafts,
                                        then the target's token; proposal is None after a plain step); returns,
                                        per row, how many of the columns it wrote to batch.draft to discard
    finish(seq)                         the sequence is done

Optional: a deterministic drafter may judge its own unverified offers in hindsight (`hindsight`, set by the loop
when its controller is adaptive, and `judged()` -> [(seq, keys, matched)]; see NgramDrafter), so the controller
learns what they are worth during plain steps. A draft model whose first draft a plain step's target forward
computes anyway (EarlyExitDrafter) also has `watch_plain(batch, sampling)`, called before such a step's verify.

Optional attributes the decoder reads: `first_columns` (columns per row of a draft model's first forward in a
step, for the controller's pricing: 2 by default), `cost_model` (a module whose parameter count prices a drafter
without a lane of its own), and `writes_target` with `target` (a drafter that drafts in the target's own lane,
EarlyExitDrafter: it must be built on the decoder's target, and EXSPEC leaves room for its columns).

A drafter that keeps keys and values (a draft model) names its model in `kv_model`; the scheduler then keeps a
KV lane for it (batch.draft) beside the target's, realigns it after every step with the drops commit returns,
and opens it empty for every new sequence: the drafter fills it lazily, when it next drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch

from ..kv.batch import StepBatch
from ..sampling import SamplingConfig

Keys = list[list[tuple]]
# (drafts so far, their keys per row) -> stop drafting now? Within a step the drafter may pass the same lists each
# time, grown by one key per row: a rule that keeps them past the call copies them.
StopRule = Callable[[int, Keys], bool]


@dataclass
class Proposal:
    """tokens int64 [B, k] (slots past num_draft[b] hold -1); probs float [B, k, V], the distribution each draft
    was sampled from (None: deterministic drafts, which the rejection rule treats as q = one-hot); num_draft per
    row (host ints, <= k); keys: per row, the features of its drafts (for the controller's tables) or None when
    they are only known once `bins` comes to the host (then `resolve_keys` builds them)."""

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    num_draft: list[int] | None = None
    keys: Keys | None = None
    bins: torch.Tensor | None = None  # int64 [B, k] on the device: a draft model's confidence bins

    def resolve_keys(self, bins: list[list[int]]) -> Keys:
        """Keys ("model", position, confidence bin) from the bins read back to the host with the step's tokens."""
        if self.keys is None:
            self.keys = [[("model", i + 1, b) for i, b in enumerate(row[:n])] for row, n in zip(bins, self.counts())]
        return self.keys

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def counts(self) -> list[int]:
        return self.num_draft if self.num_draft is not None else [self.width] * self.tokens.shape[0]

    def narrowed(self, counts: Sequence[int]) -> "Proposal":
        """Only the first counts[b] drafts of row b, and no wider than the longest row needs."""
        counts = [min(c, n) for c, n in zip(counts, self.counts())]
        width = max(counts, default=0)
        tokens = self.tokens[:, :width]
        if any(c < width for c in counts):
            limit = torch.tensor(counts, dtype=torch.int64).to(tokens.device, non_blocking=True)
            tokens = tokens.masked_fill(torch.arange(width, device=tokens.device)[None, :] >= limit[:, None], -1)
        probs = self.probs[:, :width] if self.probs is not None else None
        keys = [k[:c] for k, c in zip(self.keys, counts)] if self.keys is not None else None
        bins = self.bins[:, :width] if self.bins is not None else None
        return Proposal(tokens, probs, list(counts), keys, bins)


@runtime_checkable
class Drafter(Protocol):
    kv_model: torch.nn.Module | None

    def start(self, seq: int, prompt: Sequence[int], first: int) -> None:
        ...

    def offer(self, batch: StepBatch, k: int) -> Keys:
        ...

    def propose(self, batch: StepBatch, k: int, sampling: SamplingConfig, generator: torch.Generator | None,
                stop: StopRule | None = None) -> Proposal:
        ...

    def commit(self, batch: StepBatch, proposal: Proposal | None, emitted: list[list[int]]) -> list[int] | None:
        ...

    def finish(self, seq: int) -> None:
        ...
