"""A right-aligned ragged batch of sequences for one model: its slab KV cache, a 2-D mask, positions.

Every row ends at the same column `length` (right-aligned); row b holds seq_len[b] tokens in the columns
[length - seq_len[b], length), left padding before that (mask 0). Padding is known from the mask and the
lengths only, never from token values, so a pad id equal to EOS is harmless. Positions are explicit:
the token in column c of row b has position c - (length - seq_len[b]).

After a step in which row b keeps only some of the columns it just wrote, `drop_and_align` discards each
row's rejected tail and shifts the row right so that all rows end at the same column again: one
`sk.shift_rows_` call for the whole KV slab, one for the mask.

With realign="mask" nothing moves after a step: rejected columns stay where they are as holes (mask 0), and
positions stay right because they count real tokens (seq_len), not columns. A row then holds seq_len[b] real
tokens somewhere in [length - seq_len[b] - holes, length), still ending at `length`, so new tokens are still
written at one common column. Holes cost attention work (every query reads every column of the window), so
they are squeezed out with `sk.compact_rows_` (see `compact`) when they make up compact_threshold of the
window, or when the buffer would otherwise have to grow.
"""

from __future__ import annotations

from typing import Sequence

import torch

import specdec_kernels as sk

from .cache import SlabCache
from .models import max_positions


# How drop_and_align restores a common end column:
#   "shift": one sk.shift_rows_ call for the slab and one for the mask (the design);
#   "paper": a Python loop over rows and layers that builds each shifted row anew with torch.cat, as the
#            reference paper's implementation does (the ablation's baseline);
#   "mask":  no data moves: dropped columns become holes in the mask (positions stay right because they
#            count real tokens), compacted with sk.compact_rows_ now and then (COMPACT_THRESHOLD).
REALIGN_MODES = ("shift", "mask", "paper")

# realign="mask" compacts once the columns compaction would cut (the window minus its longest row) reach this
# share f of the window. One compaction moves each row once, as one shift step does, but holes pile up at only
# a column or two per step, so it comes about every f * window / 1.5 steps and the moving cost per step stops
# growing with the length. The price is attention over hole columns, up to f of the window. 0.1 is the measured
# balance. `OMP_NUM_THREADS=1 python bench/realign_mask.py --thresholds 0.05 0.1 0.25 --repeat 3 --clock cpu`
# (demo pair, 24 shipped prompts, batch 8, K=4, 256 new tokens, greedy, 1 thread, CPU-time clock, best of 3):
#                       shift   f=0.05   f=0.1   f=0.25
#   compactions             0       58      30       11    target and draft caches together
#   columns attended    297.2    303.7   311.0    346.2
#   realign s, cpp      0.402    0.123   0.097    0.081
#   total s, cpp        10.49    10.46   10.39    10.73
#   realign s, torch    7.866    1.032   0.593    0.332
#   total s, torch      18.08    11.40   10.87    10.81
# 0.05 and 0.1 tie on cpp; torch's dearer compactions (15 ms each against 0.9 ms) tip it to 0.1. Above 0.1
# the hole columns cost more attention (about 0.03 ms per column per verify forward) than compaction saves:
# at 0.25 mask is slower than shift on cpp. ("columns attended": mean window of a target forward.)
COMPACT_THRESHOLD = 0.1


def check_compact_threshold(value) -> float:
    """None -> COMPACT_THRESHOLD; else a number > 0 (a share of the window; 1 or more: compact only where the
    buffer would otherwise grow)."""
    if value is None:
        return COMPACT_THRESHOLD
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"compact_threshold must be a number > 0, got {value!r}")
    return float(value)


def _round_up_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# The room a slab reserves past the prompt when a batch or pool opens: max_new_tokens up to this many columns,
# plus two steps' writes. Beyond it the slabs grow by doubling as rows really grow (RaggedKV.reserve,
# SlotPool.scatter), so memory follows the real lengths: max_new_tokens=2**20 with an early EOS costs no more
# than max_new_tokens=256.
RESERVE_COLUMNS = 256


def initial_room(max_new: int, k: int) -> int:
    """Columns to reserve past the prompt for a run of max_new tokens with k drafts a step (bounded)."""
    return min(max_new, RESERVE_COLUMNS) + 2 * (k + 1)


class RaggedKV:
    def __init__(self, model, batch: int, capacity: int, backend: str | None = None, realign: str = "shift",
                 compact_threshold: float | None = None):
        if realign not in REALIGN_MODES:
            raise ValueError(f"realign must be one of {REALIGN_MODES}, got {realign!r}")
        self.compact_threshold = check_compact_threshold(compact_threshold)
        self.compactions = 0  # realign="mask": how many times compact() ran
        self._written = 0  # columns written since the last drop_and_align: what the next step will need
        self._arange = torch.arange(0)
        self.model = model
        self.backend = backend
        self.realign = realign
        self.device = next(model.parameters()).device
        self.cache = SlabCache.for_model(model, batch, capacity)
        self.mask = torch.zeros(batch, self.cache.capacity, dtype=torch.bool, device=self.device)
        self.seq_len = torch.zeros(batch, dtype=torch.int64, device=self.device)
        self.max_position = max_positions(model)
        self.additive_mask = getattr(model.config, "_attn_implementation", "sdpa") not in ("sdpa", "flex_attention")
        self.dtype = next(model.parameters()).dtype

    # ------------------------------------------------------------------------------------------ geometry
    @property
    def batch(self) -> int:
        return self.seq_len.shape[0]

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def start(self) -> int:
        return self.cache.start

    def _relocate(self, capacity: int, new_start: int) -> None:
        live = self.length - self.start
        mask = self.mask.new_zeros(self.batch, capacity)
        mask[:, new_start:new_start + live] = self.mask[:, self.start:self.length]
        self.cache.relocate(capacity, new_start)
        self.mask = mask

    def reserve(self, n: int, left_room: int = 0) -> None:
        """Make columns [length, length + n) writable and length >= left_room (room for a row of left_room
        tokens ending at `length`). Live columns move to the front of a buffer grown by doubling when needed."""
        live = self.length - self.start
        need_start = max(0, left_room - live)  # a prompt longer than the live window pushes everyone right
        if self.start >= need_start and self.length + n <= self.cache.capacity:
            return
        if self.realign == "mask" and need_start + live + n > self.cache.capacity and self._waste() > 0:
            # Holes must not make the buffer grow. drop_and_align usually compacts before it comes to this
            # (within the realign phase); here for what it cannot foresee, such as a long prompt refilled.
            self.compact()
            live = self.length - self.start
            need_start = max(0, left_room - live)
            if self.start >= need_start and self.length + n <= self.cache.capacity:
                return
        capacity = self.cache.capacity
        while need_start + live + n > capacity:
            capacity *= 2
        self._relocate(capacity, need_start)

    def _tighten(self) -> None:
        """Drop the columns that are padding in every row from the live window."""
        if self.batch and self.length > self.start:
            live = self.mask[:, self.start:self.length]
            first = torch.where(live.any(dim=1), live.to(torch.uint8).argmax(dim=1), live.shape[1])
            self.cache.start += int(first.min())

    # ------------------------------------------------------------------------------------------ forward
    def _attention(self, q0: int, n: int) -> torch.Tensor:
        """[B, 1, n, W] mask over key columns [start, q0 + n): key j is visible to query i iff it is a real
        token and j <= q0 + i. Each query also sees itself, so a padding query (prefill) never has an empty
        row: SDPA would return NaN there, and a NaN value vector poisons later rows even at weight 0."""
        kv = torch.arange(self.start, q0 + n, device=self.device)
        q = torch.arange(q0, q0 + n, device=self.device)
        visible = self.mask[:, None, self.start:q0 + n] & (kv[None, :] <= q[:, None])[None]
        visible |= (kv[None, :] == q[:, None])[None]
        visible = visible[:, None]
        if self.additive_mask:
            zero = torch.zeros((), dtype=self.dtype, device=self.device)
            return torch.where(visible, zero, torch.finfo(self.dtype).min)
        return visible

    def forward(self, input_ids: torch.Tensor, new_mask: torch.Tensor | None = None,
                logits_to_keep: int = 0) -> torch.Tensor:
        """Run the model on n new columns per row (input_ids [B, n]), appending their keys and values.
        new_mask [B, n] marks real tokens (default: all); returns logits [B, n or logits_to_keep, V]."""
        n = input_ids.shape[1]
        self.reserve(n)
        self.cache.reserve(n)  # within capacity now: only records n for the layers' update()
        q0 = self.length
        if new_mask is None:
            self.mask[:, q0:q0 + n] = True
            counts = torch.arange(1, n + 1, device=self.device)[None, :]
        else:
            self.mask[:, q0:q0 + n] = new_mask
            counts = new_mask.to(torch.int64).cumsum(dim=1)
        positions = (self.seq_len[:, None] + counts - 1).clamp_(min=0)
        if self.max_position is not None:
            # Speculative columns past the position limit can only produce tokens that are cut anyway.
            positions.clamp_(max=self.max_position - 1)
        try:
            out = self.model(input_ids=input_ids, attention_mask=self._attention(q0, n), position_ids=positions,
                             cache=self.cache, use_cache=True, logits_to_keep=logits_to_keep)
        finally:
            self.cache.pending = 0
        self.cache.length += n
        self.seq_len += counts[:, -1]
        self._written += n
        return out.logits

    # ------------------------------------------------------------------------------------------ realign
    def drop_and_align(self, drop: torch.Tensor) -> torch.Tensor:
        """Row b discards its last drop[b] columns; rows shift right by drop[b] - min(drop) so they end at
        the same column again. Returns drop - min(drop): the shifts (realign="mask" leaves that many holes
        at the end of each row instead, and moves nothing until it compacts)."""
        if self.realign == "mask":
            return self._drop_as_holes(drop)
        self._written = 0
        dmin = int(drop.min()) if self.batch else 0
        shifts = drop - dmin
        if self.batch and bool((shifts != 0).any()):
            if self.realign == "paper":
                self._shift_rows_loop(shifts)
            else:
                sk.shift_rows_(self.cache.live(), shifts, dim=-2, backend=self.backend)
                sk.shift_rows_(self.mask[:, self.start:self.length], shifts, dim=-1, backend=self.backend)
        self.cache.length -= dmin
        self.seq_len -= drop
        self._tighten()
        return shifts

    def _drop_as_holes(self, drop: torch.Tensor) -> torch.Tensor:
        # This runs every step, so it is kept to a handful of small tensor ops: the drops come to the host
        # once (B ints), and there is no _tighten: in a decoding step every row keeps at least one column it
        # wrote, so the first column cannot change (and should a caller drop more, the all-padding columns
        # left at the front only count as waste until the next compaction).
        d = drop.tolist()
        dmin, dmax = (min(d), max(d)) if d else (0, 0)
        end = self.length - dmin
        if dmax > dmin:
            # tail column j is column end - (dmax - dmin) + j; row b keeps it iff it is before length - drop[b]
            tail = self.mask[:, self.length - dmax:end]
            tail &= self._columns(dmax - dmin)[None, :] < (dmax - drop)[:, None]
        self.cache.length = end
        self.seq_len -= drop
        written, self._written = self._written, 0
        waste = self._waste()
        # Compact at the threshold, or now (in the realign phase) when the next step's columns would not fit
        # even with the window moved to the front of the buffer, so that holes never make it grow.
        if waste > 0 and (waste >= self.compact_threshold * (self.length - self.start)
                          or self.length - self.start + written > self.cache.capacity):
            self.compact()
        return drop - dmin

    def _columns(self, n: int) -> torch.Tensor:
        if self._arange.shape[0] < n:
            self._arange = torch.arange(max(n, 64), device=self.device)
        return self._arange[:n]

    def _waste(self) -> int:
        """Columns of the window that compaction would cut: the window minus its longest row."""
        if not self.batch or self.length <= self.start:
            return 0
        return self.length - self.start - int(self.seq_len.max())

    def compact(self) -> None:
        """Squeeze out the holes: each row's real columns move, in order, to the end of the window (one
        sk.compact_rows_ call for the whole slab), leaving every row right-aligned with no holes, exactly as
        realign="shift" would have it; the window then starts at the longest row."""
        if not self.batch or self.length <= self.start:
            return
        live = self.length - self.start
        window = self.mask[:, self.start:self.length]
        sk.compact_rows_(self.cache.live(), window, dim=-2, backend=self.backend)
        # The mask compacts to right-aligned runs of seq_len[b]: write that instead of moving it.
        window.copy_(self._columns(live)[None, :] >= (live - self.seq_len)[:, None])
        self.cache.start = self.length - int(self.seq_len.max())
        self.compactions += 1

    def _shift_rows_loop(self, shifts: torch.Tensor) -> None:
        slab, lo, hi = self.cache.slab, self.start, self.length
        for b, s in enumerate(shifts.tolist()):
            if s == 0:
                continue
            for i in range(slab.shape[1]):
                row = slab[b, i, :, lo:hi]
                slab[b, i, :, lo:hi] = torch.cat([row.new_zeros(row.shape[0], s, row.shape[2]), row[:, :hi - lo - s]],
                                                 dim=1)
            row = self.mask[b, lo:hi]
            self.mask[b, lo:hi] = torch.cat([row.new_zeros(s), row[:hi - lo - s]])

    def crop(self, n: int) -> None:
        """Discard the last n columns of every row (all rows hold real tokens there)."""
        self.cache.length -= n
        self.seq_len -= n

    # ------------------------------------------------------------------------------------------ rows
    def select_rows(self, index: torch.Tensor) -> None:
        self.cache.select_rows(index)
        self.mask = self.mask.index_select(0, index)
        self.seq_len = self.seq_len.index_select(0, index)
        self._tighten()

    def place(self, rows: torch.Tensor, src: "RaggedKV") -> None:
        """Overwrite `rows` with the rows of src (a freshly prefilled batch of the same model), right-aligned
        to this batch's end column; every row is first pushed right if src is longer than the live window."""
        width = src.length - src.start
        self.reserve(0, left_room=width)
        end = self.length
        self.cache.slab[rows, :, :, end - width:end] = src.cache.slab[:, :, :, src.start:src.length]
        self.mask[rows, :end] = False
        self.mask[rows, end - width:end] = src.mask[:, src.start:src.length]
        self.seq_len[rows] = src.seq_len
        self.cache.start = min(self.cache.start, end - int(src.seq_len.max()))

    @classmethod
    def prefill(cls, model, prompts: Sequence[Sequence[int]], extra: int, backend: str | None = None,
                logits_to_keep: int = 1, realign: str = "shift",
                compact_threshold: float | None = None) -> tuple["RaggedKV", torch.Tensor]:
        """A new right-aligned batch holding `prompts`, with room for `extra` more columns; also returns the
        logits of the last column(s)."""
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.int64)
        new_mask = torch.zeros(len(prompts), width, dtype=torch.bool)
        for b, p in enumerate(prompts):
            if len(p):
                ids[b, width - len(p):] = torch.as_tensor(list(p), dtype=torch.int64)
                new_mask[b, width - len(p):] = True
        state = cls(model, len(prompts), _round_up_pow2(width + extra), backend, realign, compact_threshold)
        logits = state.forward(ids.to(device), new_mask.to(device), logits_to_keep=logits_to_keep)
        state._written = 0  # the prompt is not what a step writes
        return state, logits
