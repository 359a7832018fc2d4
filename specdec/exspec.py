"""EXSPEC: a sliding pool of sequences, stepped in groups of equal cached length.

EQSPEC steps one static batch: after every verification its rows have accepted different numbers of drafts, so
every row of the target's and the draft's KV cache is shifted back into right alignment (the realign phase), and
rows of very different lengths share a batch, so the shorter ones drag padding through every attention.

EXSPEC keeps up to `window` unfinished sequences in a pool (`SlotPool`: each sequence left-aligned in its own
slot, so it grows without moving anything) and, each step, copies a group of `batch_size` of them into a step
batch (`gather`):

    pick     batch_size slots of one cached length if there are that many (a full group); else the first slot
             by priority, the other slots of its length, and the closest lengths (see "Policy" below)
    gather   index_select those slots' live columns into a reused step buffer (schedule phase)
    align    only for a group of unequal lengths: RaggedKV.drop_and_align right-aligns it the way the realign
             mode says (sk.shift_rows_, holes in the mask, or the paper's row loop) (realign phase)
    draft, verify, sample   exactly as EQSPEC (engine._Run.speculate)
    scatter  each row's a_b + 1 kept columns go back to the end of its slot; nothing is shifted (schedule)

What this buys on a CPU: an equal-length group has no padding (no attention over empty columns) and needs no
realignment at all, neither before nor after the step, since kept columns are written straight to where they
belong in the pool. A mixed group is aligned once, before the step, over lengths chosen to be close. What it
costs: the gather copies every live column of the group's rows, for the target and the draft model, every step
(a memory copy of the same size as one realignment shift of the whole batch, but paid even when nothing needs
aligning); the scatter is small (K + 1 columns a row). So EXSPEC wins when realignment and padding are
expensive (long, ragged batches; the Python-loop realignment) and loses a copy's worth when they are cheap.

Policy. Priority is "oldest prompt first" while prompts wait (finishing sequences frees slots, so the window
keeps sliding) and "fewest tokens emitted first" once none wait (the remaining work stays balanced, so the
last groups stay full instead of a few stragglers stepping alone). Always taking the largest equal-length set
instead, as a first version did, keeps stepping whichever rows happen to collide and starves the others. On
the demo pair (batch 8, K=4, 64 new tokens, window 32) the steps taken were:
    24 shipped prompts (lengths 68..153):   largest-set-first 70, this policy 64, EQSPEC 67
    24 prompts of one length (100):         largest-set-first 77 (group rate 0.16), this policy 67 (0.45), EQSPEC 74
"""

from __future__ import annotations

import torch

import specdec_kernels as sk

from .batch import RaggedKV, initial_room
from .cache import SlabCache
from .engine import _Run


def _round_up_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class SlotPool:
    """One model's KV for the pool's sequences: slab[S, 2 * layers, kv_heads, capacity, head_dim]; slot s holds
    its sequence's keys and values left-aligned in columns [0, lengths[s]), so appending never moves a row."""

    def __init__(self, model, size: int, extra: int, room: int, backend: str | None = None, realign: str = "shift"):
        self.model, self.backend, self.realign = model, backend, realign
        self.extra = extra  # columns reserved past an admitted prompt (more are added as rows grow)
        self.room = room  # columns one step appends to the step batch
        self.slab = SlabCache.for_model(model, size, 1).slab
        self.lengths = [0] * size
        self._buf: torch.Tensor | None = None

    def _grow(self, capacity: int) -> None:
        if capacity <= self.slab.shape[-2]:
            return
        slab = self.slab.new_zeros(*self.slab.shape[:3], _round_up_pow2(capacity), self.slab.shape[-1])
        slab[..., :self.slab.shape[-2], :] = self.slab
        self.slab = slab

    def admit(self, slots: torch.Tensor, src: RaggedKV) -> None:
        """Slots `slots` now hold the rows of src, a freshly prefilled right-aligned batch (src is consumed)."""
        lengths = src.seq_len
        width = src.length - src.start
        self._grow(int(lengths.max()) + self.extra)
        live = src.cache.live()
        sk.shift_rows_(live, lengths - width, dim=-2, backend=self.backend)  # negative: left-align each row
        self.slab[slots, :, :, :width] = live
        for s, n in zip(slots.tolist(), lengths.tolist()):
            self.lengths[s] = n

    def _buffer(self, rows: int, columns: int) -> torch.Tensor:
        # Reused across steps: a fresh multi-megabyte tensor every step costs page faults worth another copy.
        buf = self._buf
        if buf is None or buf.shape[0] < rows or buf.shape[-2] < columns:
            shape = self.slab.shape
            have_rows, have_columns = (buf.shape[0], buf.shape[-2]) if buf is not None else (0, 0)
            buf = self._buf = self.slab.new_zeros(max(rows, have_rows), *shape[1:3],
                                                  max(_round_up_pow2(columns), have_columns), shape[-1])
        return buf[:rows, :, :, :columns]

    def gather(self, slots: torch.Tensor) -> tuple[RaggedKV, list[int]]:
        """A step batch holding `slots` in this order, each row left-aligned, with room for one step; and each
        row's padding (0 for all rows of an equal-length group). align() right-aligns a mixed group."""
        lengths = [self.lengths[s] for s in slots.tolist()]
        top = max(lengths)
        slab = self._buffer(len(lengths), top + self.room)
        torch.index_select(self.slab[:, :, :, :top], 0, slots, out=slab[:, :, :, :top])
        return step_batch(self.model, slab, top, self.backend, self.realign), [top - n for n in lengths]

    @staticmethod
    def align(state: RaggedKV, pad: list[int]) -> None:
        """Right-align a gathered step batch: row b's last pad[b] columns are not its own (the longest row's
        pad is 0, so the end column stays) and drop_and_align discards them per the realign mode."""
        if any(pad):
            state.drop_and_align(torch.tensor(pad, dtype=torch.int64, device=state.device))

    def scatter(self, slots: torch.Tensor, state: RaggedKV, base: int, keep: torch.Tensor,
                width: int | None = None) -> None:
        """The step wrote `width` (default and at most `room`) columns per row from column `base` of `state`; row b keeps its first
        keep[b]: they become the end of its slot. All `width` are copied (one indexed write, no per-row
        lengths); the ones past the kept count lie beyond the slot's length and are overwritten later. Never
        more than `width`: columns the step did not write hold stale buffer memory, which could be NaN, and a
        NaN key in a masked hole still poisons attention (0 * NaN)."""
        width = self.room if width is None else width
        slot_list = slots.tolist()
        starts = [self.lengths[s] for s in slot_list]
        self._grow(max(starts) + width)  # doubling (capacities are powers of two)
        start = torch.tensor(starts, dtype=torch.int64, device=slots.device)
        cols = start[:, None] + torch.arange(width, device=slots.device)[None, :]
        new = state.cache.slab[:, :, :, base:base + width]
        self.slab[slots[:, None], :, :, cols] = new.permute(0, 3, 1, 2, 4)
        for s, k in zip(slot_list, keep.tolist()):
            self.lengths[s] += k


def step_batch(model, slab: torch.Tensor, length: int, backend, realign) -> RaggedKV:
    """A RaggedKV over a gathered slab whose rows all hold `length` tokens in columns [0, length)."""
    rows = slab.shape[0]
    state = RaggedKV(model, rows, 1, backend, realign)
    state.cache.slab = slab
    state.cache.start, state.cache.length = 0, length
    state.mask = torch.zeros(rows, slab.shape[-2], dtype=torch.bool, device=slab.device)
    state.mask[:, :length] = True
    state.seq_len = torch.full((rows,), length, dtype=torch.int64, device=slab.device)
    return state


class ExspecRun(_Run):
    """One generate() call under EXSPEC. self.rows and self.finished are indexed by pool slot (a free slot
    holds None); the target's `last` token of each slot lives in slot_last."""

    def __init__(self, dec, prompts, max_new, batch_size, eos, sampling, seed, progress=None, window: int = 32):
        super().__init__(dec, prompts, max_new, batch_size, eos, sampling, seed, progress)
        self.window = max(1, min(window, len(prompts)))
        self.pool: SlotPool | None = None
        self.slot_last = torch.zeros(self.window, dtype=torch.int64, device=self.device)
        self.groups = self.equal_groups = self.group_rows = 0
        self.padded_columns = self.gathered_columns = 0

    def has_work(self) -> bool:
        return any(p is not None for p in self.rows)

    def open(self) -> None:
        """The pool replaces EQSPEC's first batch: every sequence gets a slot of its own."""
        room = self.k + 1
        extra = initial_room(self.max_new, self.k)  # bounded: the pools grow in scatter as rows do
        self.pool = SlotPool(self.dec.target, self.window, extra, room, self.backend, self.dec.realign)
        self.dec.drafter.begin_pool(self.window, self.k, extra_capacity=extra)
        self.rows = [None] * self.window
        self.finished = [False] * self.window

    def step(self) -> None:
        self.steps += 1
        drafter = self.dec.drafter
        with self.timer.phase("schedule"):
            slots = self.pick()
            index = torch.tensor(slots, dtype=torch.int64, device=self.device)
            self.target, pad = self.pool.gather(index)
            drafter.gather(index)
            self.last = self.slot_last.index_select(0, index)
        if any(pad):
            with self.timer.phase("realign"):
                self.pool.align(self.target, pad)
                drafter.align()
        base = self.target.length
        proposal, tokens, accepted = self.speculate()
        with self.timer.phase("schedule"):
            self.pool.scatter(index, self.target, base, accepted + 1, width=tokens.shape[1])
            drafter.accept(tokens, accepted)
            self.slot_last[index] = tokens.gather(1, accepted[:, None]).squeeze(1)
            self.target = None  # the step batch is a copy: the pool is the state
            self.record(tokens, accepted, proposal.num_draft, rows=slots)
            self.settle()

    def pick(self) -> list[int]:
        """The step's group of live slots: a full group of equal length if there is one, else the first slot
        by priority with its equal-length peers, filled up with the closest lengths. See the module docstring."""
        lengths, order = self.pool.lengths, self.rows
        if self.waiting:
            def priority(s):  # the oldest first: finished sequences free slots for the waiting prompts
                return order[s]
        else:
            def priority(s):  # the least progressed first: the last groups stay full
                return len(self.out[order[s]]), order[s]
        live = sorted((s for s, p in enumerate(order) if p is not None), key=priority)
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

    def settle(self) -> None:
        """Free the finished slots and admit waiting prompts into free slots, in input order (a prompt whose
        first token finishes it frees its slot again: repeat)."""
        while True:
            for s, p in enumerate(self.rows):
                if p is not None and self.finished[s]:
                    self.rows[s] = None
            free = [s for s, p in enumerate(self.rows) if p is None][:len(self.waiting)]
            if not free:
                return
            # Prefill at most batch_size prompts at once, the closest lengths together: less padding.
            pairs = sorted(zip(free, [self.waiting.pop() for _ in free]), key=lambda sp: len(self.prompts[sp[1]]))
            for i in range(0, len(pairs), self.batch_size):
                self.admit(pairs[i:i + self.batch_size])

    def admit(self, pairs: list[tuple[int, int]]) -> None:
        """Prefill prompts pairs[i][1] into free slots pairs[i][0] and emit their first tokens."""
        slots, take = [s for s, _ in pairs], [p for _, p in pairs]
        prompts = [self.prompts[i] for i in take]
        src, first = self.prefill_new(prompts)
        index = torch.tensor(slots, dtype=torch.int64, device=self.device)
        self.pool.admit(index, src)
        self.slot_last[index] = first
        self.start_rows(slots, take, first, prompts)

    def stats(self) -> dict:
        out = super().stats()
        out.update({
            "window": self.window,
            "groups": self.groups,
            "group_rate": self.equal_groups / self.groups if self.groups else 0.0,  # groups needing no alignment
            "mean_group_rows": self.group_rows / self.groups if self.groups else 0.0,
            "padding_fraction": self.padded_columns / self.gathered_columns if self.gathered_columns else 0.0,
        })
        return out
