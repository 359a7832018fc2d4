"""ModelDrafter: a Hugging Face causal LM as drafter, over the KV lane the scheduler keeps for it (batch.draft).

Invariant between steps, per sequence: the lane holds every token of the sequence except `pending` (tokens it has
not caught up on: its prompt before the first draft, and one token per step it sat out) and the two newest,
`prev` and `last`. A drafting step feeds [pending..., prev, last] in one forward (right-aligned: rows with less
to catch up get padding first, masked), then k - 1 of its own drafts one at a time: k drafts. A row whose lane
is still empty (a new sequence) is prefilled on its own first (all but the tokens that fit the block), so the
batch never pads a whole prompt.

When row b accepts a_b of its k drafts it emitted d_1..d_{a_b}, t; its new (prev, last) is (d_{a_b} or the old
last, t), so the lane keeps pending, prev, last, d_1..d_{a_b - 1}: it drops its last k - a_b columns, the same
count the target drops of its own k + 1 (last, d_1..d_k). With a_b = k the lane already holds d_{k-1}, computed
while drafting d_k, which is why a step starts with two tokens rather than one.

A step that does not draft (the controller chose plain decoding) costs the draft model nothing: the row's old
prev joins `pending`, and the next drafting step catches up in the same forward that starts it. The tokens fed
are the sequence's own, in order, at their own positions, so the keys and values it ends with are the ones it
would have had drafting every step: skipping changes timing, never what is drafted.
"""

from __future__ import annotations

import bisect
import contextlib
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..kv.batch import StepBatch
from ..kv.geometry import model_device, output_vocab
from ..kv.ragged import right_aligned
from ..sampling import Prefixes, SamplingConfig, greedy, sample
from .base import Keys, Proposal, StopRule

# Confidence bins: the draft's own probability of its token, the feature the controller's acceptance table keys
# on. Finer near 1, where agreement with the target concentrates.
CONFIDENCE_EDGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
# The edges as the float32 numbers torch.bucketize compares with: bisect_left over them gives a float32
# confidence the bin bucketize gives it (the count of edges below it), on the host.
EDGES_FLOAT32 = tuple(torch.tensor(CONFIDENCE_EDGES, dtype=torch.float32).tolist())


def confidence_bin(x: float) -> int:
    """The bin of one confidence (a float32 value read back to the host): torch.bucketize's, without a tensor."""
    return bisect.bisect_left(EDGES_FLOAT32, x)


@dataclass
class _Sequence:
    prev: int
    last: int
    pending: list[int] = field(default_factory=list)
    skipped: int = 0  # how many of the pending tokens are from steps it sat out (the rest: its prompt)


class ModelDrafter:
    """Args:
        model: the draft model (same vocabulary as the target).
        early_stop: let the controller stop drafting a step early from the draft's own confidence. Each check
            reads the confidences back to the host (a device sync per draft on a GPU), so the default is on for
            CPU models only; without it the step drafts the width the controller planned before it began.
    """

    first_columns = 2  # a step's first forward feeds prev and last (besides any catch-up): the controller prices it

    def __init__(self, model, early_stop: bool | None = None):
        self.model = model
        self.kv_model = model
        self.device = model_device(model)
        self.early_stop = (self.device.type == "cpu") if early_stop is None else bool(early_stop)
        self.seqs: dict[int, _Sequence] = {}
        self.timed = None  # timed(query_tokens) -> context manager, set by the decode loop for the controller
        # prefill_timer() -> context manager around filling new prompts into the draft lane (the decode loop's
        # stats: draft_prefill_seconds, the part of a catch-up that no plain step would have paid)
        self.prefill_timer = None
        # the drafts' own probabilities, binned: the controller's features. The decode loop turns them off for
        # fixed K, where nothing prices drafts (four small ops per draft saved; keys are then positions only)
        self.confidence = True
        self.catch_up_columns = 0  # columns fed to catch up (prompts and skipped steps), for the stats
        self.resumed_columns = 0  # of those, the tokens of steps it sat out
        self._edges = torch.tensor(CONFIDENCE_EDGES, device=self.device)

    @property
    def vocab_size(self) -> int:
        return output_vocab(self.model)

    def start(self, seq: int, prompt: Sequence[int], first: int) -> None:
        self.seqs[seq] = _Sequence(prev=int(prompt[-1]), last=int(first), pending=[int(t) for t in prompt[:-1]])

    def finish(self, seq: int) -> None:
        self.seqs.pop(seq, None)

    def lag(self, batch: StepBatch) -> int:
        """Columns the next drafting step must feed before its own: the longest row's pending tokens."""
        return max((len(self.seqs[s].pending) for s in batch.seqs), default=0)

    def offer(self, batch: StepBatch, k: int) -> Keys:
        position = [("model", i) for i in range(1, k + 1)]
        return [position] * batch.size

    def _forward(self, lane, ids: torch.Tensor, lengths: list[int] | None) -> torch.Tensor:
        with self.timed(ids.numel()) if self.timed is not None else contextlib.nullcontext():
            return lane.forward(ids.to(self.device, non_blocking=True), lengths, logits_to_keep=1,
                                model=self.model)[:, -1]

    def propose(self, batch: StepBatch, k: int, sampling: SamplingConfig, generator: torch.Generator | None,
                stop: StopRule | None = None) -> Proposal:
        return self._draft(batch, batch.draft, self._catch_up(batch), k, sampling, generator, stop)

    def _catch_up(self, batch: StepBatch) -> torch.Tensor:
        """Feed every row its pending tokens, then prev and last, in one forward; the logits of its last column."""
        lane = batch.draft
        states = [self.seqs[s] for s in batch.seqs]
        # Rows whose lane is empty (new sequences) are prefilled on their own, so the batch never pads a whole
        # prompt; they keep their last `lag` tokens for the block, where the others catch up on skipped steps,
        # so that their real columns stay contiguous (EXSPEC's pool copies them back as one run).
        lag = max((len(st.pending) for b, st in enumerate(states) if lane.lengths[b]), default=0)
        fresh = [b for b, st in enumerate(states) if not lane.lengths[b] and len(st.pending) > lag]
        if fresh:
            head = [states[b].pending[:len(states[b].pending) - lag] for b in fresh]
            with self.timed(sum(map(len, head))) if self.timed is not None else contextlib.nullcontext(), \
                    self.prefill_timer() if self.prefill_timer is not None else contextlib.nullcontext():
                lane.fill_rows(fresh, head)
            for b, done in zip(fresh, head):
                self.catch_up_columns += len(done)
                states[b].pending = states[b].pending[len(done):]
                states[b].skipped = min(states[b].skipped, len(states[b].pending))
        lag = max(len(st.pending) for st in states)
        rows = [st.pending + [st.prev, st.last] for st in states]
        ids = right_aligned(rows, lag + 2)
        logits = self._forward(lane, ids, [len(r) for r in rows])
        for st in states:
            self.catch_up_columns += len(st.pending)
            self.resumed_columns += st.skipped
            st.pending, st.skipped = [], 0
        return logits

    def _draft(self, batch: StepBatch, lane, logits: torch.Tensor, k: int, sampling: SamplingConfig,
               generator: torch.Generator | None, stop: StopRule | None) -> Proposal:
        """Up to k drafts per row from `logits` (the draft's scores after the row's newest token), each fed
        back through `lane` to score the next."""
        drafts, probs, confidence = [], [], []
        asked = None  # per row, the keys of its drafts so far, grown by one each time the stop rule is asked
        for i in range(k):
            # the same scoring as the target's at this position: the row's history, then its drafts so far
            prefixes = Prefixes(batch.seqs, batch.history, batch.prompt_length,
                                torch.stack(drafts, dim=1) if drafts else None, i)
            if sampling.do_sample:
                q = sampling.probs(logits, prefixes)
                d = sample(q, generator)
                probs.append(q)
            else:
                scores = sampling.process(logits, prefixes)
                q = scores.float().softmax(dim=-1) if self.confidence else None
                d = greedy(scores)
            drafts.append(d)
            if self.confidence:
                confidence.append(q.gather(1, d[:, None]))
            if i + 1 == k:
                break
            if stop is not None and self.early_stop and self.confidence:
                # only the newest draft's confidence comes to the host: one readback, binned there (the earlier
                # drafts' keys were built on earlier asks)
                if asked is None:
                    asked = [[] for _ in range(batch.size)]
                for row, x in zip(asked, confidence[-1].view(-1).tolist()):
                    row.append(("model", i + 1, confidence_bin(x)))
                if stop(i + 1, asked):
                    break
            logits = self._forward(lane, d[:, None], None)
        tokens = torch.stack(drafts, dim=1)
        probs = torch.stack(probs, dim=1) if probs else None
        rows = batch.size
        if not self.confidence:
            return Proposal(tokens, probs, [len(drafts)] * rows, self.offer(batch, len(drafts)))
        return Proposal(tokens, probs, [len(drafts)] * rows, None, self._bins(confidence))

    def _bins(self, confidence: list[torch.Tensor]) -> torch.Tensor:
        return torch.bucketize(torch.cat(confidence, dim=1).float(), self._edges)

    def commit(self, batch: StepBatch, proposal: Proposal | None, emitted: list[list[int]]) -> list[int] | None:
        states = [self.seqs[s] for s in batch.seqs]
        if proposal is None:  # a plain step: the lane was not touched; prev waits to be caught up on
            for st, out in zip(states, emitted):
                st.pending.append(st.prev)
                st.skipped += 1
                st.prev, st.last = st.last, out[-1]
            return None
        k = proposal.width
        drop = []
        for st, out in zip(states, emitted):
            a = len(out) - 1
            st.prev, st.last = (out[a - 1] if a > 0 else st.last), out[a]
            drop.append(k - a)
        return drop
