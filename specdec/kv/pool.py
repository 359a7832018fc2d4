"""SlotPool: one model's KV for EXSPEC's pool of sequences, one slot each, left-aligned so appending never moves.

    slab[S, 2 * layers, kv_heads, capacity, head_dim]     slot s holds its sequence in columns [0, lengths[s])

A step copies a group of slots into a right-aligned step batch (`gather`, then `align` for unequal lengths),
runs on it, and copies each row's kept new columns back to the end of its slot (`scatter`). A slot may hold
nothing yet (`admit_empty`): a draft model that has not caught up on its prompt.
"""

from __future__ import annotations

from typing import Sequence

import torch

import specdec_kernels as sk

from .ragged import RaggedKV
from .slab import SlabCache, round_up_pow2


class SlotPool:
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
        slab = self.slab.new_zeros(*self.slab.shape[:3], round_up_pow2(capacity), self.slab.shape[-1])
        slab[..., :self.slab.shape[-2], :] = self.slab
        self.slab = slab

    def _index(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(slots), dtype=torch.int64).to(self.slab.device, non_blocking=True)

    def admit(self, slots: Sequence[int], src: RaggedKV) -> None:
        """Slots `slots` now hold the rows of src, a freshly prefilled right-aligned batch (src is consumed)."""
        slots = list(slots)
        width = src.length - src.start
        self._grow(max(src.lengths) + self.extra)
        live = src.cache.live()
        # left-align each row: shift by its length minus the window (negative)
        shifts = torch.tensor([n - width for n in src.lengths], dtype=torch.int64, device=live.device)
        sk.shift_rows_(live, shifts, dim=-2, backend=self.backend)
        self.slab[self._index(slots), :, :, :width] = live
        for s, n in zip(slots, src.lengths):
            self.lengths[s] = n

    def admit_empty(self, slots: Sequence[int]) -> None:
        """Slots `slots` now belong to new sequences whose keys and values come later."""
        for s in slots:
            self.lengths[s] = 0

    def _buffer(self, rows: int, columns: int) -> torch.Tensor:
        # Reused across steps: a fresh multi-megabyte tensor every step costs page faults worth another copy.
        buf = self._buf
        if buf is None or buf.shape[0] < rows or buf.shape[-2] < columns:
            shape = self.slab.shape
            have_rows, have_columns = (buf.shape[0], buf.shape[-2]) if buf is not None else (0, 0)
            buf = self._buf = self.slab.new_zeros(max(rows, have_rows), *shape[1:3],
                                                  max(round_up_pow2(columns), have_columns), shape[-1])
        return buf[:rows, :, :, :columns]

    def gather(self, slots: Sequence[int]) -> tuple[RaggedKV, list[int]]:
        """A step batch holding `slots` in this order, each row left-aligned, with room for one step; and each
        row's padding (0 for all rows of an equal-length group). align() right-aligns a mixed group."""
        slots = list(slots)
        lengths = [self.lengths[s] for s in slots]
        top = max(lengths)
        slab = self._buffer(len(lengths), top + self.room)
        torch.index_select(self.slab[:, :, :, :top], 0, self._index(slots), out=slab[:, :, :, :top])
        return step_batch(self.model, slab, top, self.backend, self.realign), [top - n for n in lengths]

    @staticmethod
    def align(state: RaggedKV, pad: list[int]) -> None:
        """Right-align a gathered step batch: row b's last pad[b] columns are not its own (the longest row's
        pad is 0, so the end column stays) and drop_and_align discards them per the realign mode."""
        if any(pad):
            state.drop_and_align(pad)

    def scatter(self, slots: Sequence[int], state: RaggedKV, drop: Sequence[int]) -> None:
        """The step wrote the last state.written columns of `state` (the buffer may have moved them when it
        grew); row b keeps all but the last drop[b] of its real ones, which are contiguous from its first new
        one (state.first_new[b]), and they become the end of its slot.
        Every row copies the same number of columns (one indexed write); those past its kept count lie beyond
        the slot's length and are overwritten later. Only columns the step wrote are read: unwritten buffer
        memory could hold NaN, and a NaN key in a masked hole still poisons attention (0 * NaN)."""
        slots = list(slots)
        keep = [r - d for r, d in zip(state.new_real, drop)]
        width = max(keep, default=0)
        if width <= 0:
            return
        starts = [self.lengths[s] for s in slots]
        self._grow(max(starts) + width)
        device = self.slab.device
        base = state.length - state.written
        offsets = torch.arange(width, device=device)[None, :]
        first = torch.tensor([base + f for f in state.first_new], dtype=torch.int64, device=device)
        src_cols = (first[:, None] + offsets).clamp_(max=state.length - 1)
        dst_cols = torch.tensor(starts, dtype=torch.int64, device=device)[:, None] + offsets
        rows = torch.arange(len(slots), device=device)[:, None]
        new = state.cache.slab[rows, :, :, src_cols]  # [B, width, 2L, H, D]
        self.slab[self._index(slots)[:, None], :, :, dst_cols] = new
        for s, k in zip(slots, keep):
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
    if state.pos is not None:  # slots are dense: column c holds position c
        state.pos = torch.arange(slab.shape[-2], device=slab.device).expand(rows, -1).clone()
    state.lengths = [length] * rows
    state.span = [length] * rows
    return state
