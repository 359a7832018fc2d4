"""RaggedKV: a right-aligned ragged batch of sequences for one model: its slab KV cache, a 2-D mask, positions.

Every row ends at the same column `length` (right-aligned); row b holds lengths[b] real tokens, the last of
them in column length - 1, with left padding (mask 0) before its first one. Padding is known from the mask
and the lengths only, never from token values, so a pad id equal to EOS is harmless. Positions are explicit
and count real tokens, so a hole (a masked column inside a row) never shifts a position.

After a step in which row b keeps only some of the columns it just wrote, `drop_and_align` discards each
row's rejected tail and restores the common end column, the way the realign mode says:
    "shift": one sk.shift_rows_ call for the whole slab and one for the mask (the design);
    "paper": a Python loop over rows and layers that rebuilds each shifted row with torch.cat, as the reference
             paper's implementation does (the ablation's baseline);
    "mask":  nothing moves: dropped columns become holes in the mask, squeezed out with sk.compact_rows_
             (`compact`) when they reach compact_threshold of the window or the buffer would have to grow.

Host bookkeeping. The per-row counts (`lengths`, and `span`: columns from a row's first real column to
`length`) are kept on the host as well as on the device, and drop counts arrive as host ints, so realigning
needs no device-to-host sync; the device copy `seq_len` feeds the positions.

Holes also come from ragged writes: a forward whose `new_lengths` leave some rows' first columns empty (a
prefill, or a draft model catching up on several tokens per row) leaves holes before those rows' new tokens.
They are masked like any other padding and count as waste for compaction.
"""

from __future__ import annotations

from typing import Sequence

import torch

import specdec_kernels as sk

from .geometry import attention_windows, max_positions, model_device, model_dtype
from .slab import SlabCache, round_up_pow2

REALIGN_MODES = ("shift", "mask", "paper")

# realign="mask" compacts once the columns compaction would cut (the window minus its longest row) reach this
# share of the window: holes pile up a column or two per step, so compaction comes every threshold * window / 1.5
# steps and moves each row once, while holes cost attention over at most threshold of the window. The sweep that
# chose 0.1 is `python bench/realign_mask.py --thresholds 0.05 0.1 0.25` (docs/realign_mask.json, README).
COMPACT_THRESHOLD = 0.1

# Columns a slab reserves past the prompt when it opens: max_new_tokens up to this many, plus two steps' writes.
# Beyond it the slabs grow by doubling as rows really grow, so memory follows the real lengths:
# max_new_tokens=2**20 with an early EOS costs no more than max_new_tokens=256.
RESERVE_COLUMNS = 256


def initial_room(max_new: int, k: int) -> int:
    """Columns to reserve past the prompt for a run of max_new tokens with k drafts a step (bounded)."""
    return min(max_new, RESERVE_COLUMNS) + 2 * (k + 1)


def check_compact_threshold(value) -> float:
    """None -> COMPACT_THRESHOLD; else a number > 0 (a share of the window; 1 or more: compact only where the
    buffer would otherwise grow)."""
    if value is None:
        return COMPACT_THRESHOLD
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"compact_threshold must be a number > 0, got {value!r}")
    return float(value)


class RaggedKV:
    def __init__(self, model, batch: int, capacity: int, backend: str | None = None, realign: str = "shift",
                 compact_threshold: float | None = None):
        if realign not in REALIGN_MODES:
            raise ValueError(f"realign must be one of {REALIGN_MODES}, got {realign!r}")
        self.compact_threshold = check_compact_threshold(compact_threshold)
        self.compactions = 0  # how many times compact() ran
        self.model = model
        self.backend = backend
        self.realign = realign
        self.device = model_device(model)
        self.dtype = model_dtype(model)
        self.cache = SlabCache.for_model(model, batch, capacity)
        self.mask = torch.zeros(batch, self.cache.capacity, dtype=torch.bool, device=self.device)
        self.seq_len = torch.zeros(batch, dtype=torch.int64, device=self.device)
        self.lengths = [0] * batch  # host copy of seq_len
        self.span = [0] * batch  # columns from each row's first real column to `length`
        self.written = 0  # columns written by forwards since the last drop_and_align
        # per row, the real columns it gained since then, and where the first of them is, relative to the
        # first of those written columns (negative for tokens `place` put before them)
        self.new_real = [0] * batch
        self.first_new = [0] * batch
        self.max_position = max_positions(model)
        self.additive_mask = getattr(model.config, "_attn_implementation", "sdpa") not in ("sdpa", "flex_attention")
        self._arange = torch.arange(0, device=self.device)
        # Sliding-window layers need each key's position: pos[b, c] is the position of the token in column c,
        # moved with the mask by every realignment (garbage where the mask is 0).
        self.window_mode, self.window = attention_windows(model)
        self.pos = torch.zeros(batch, self.cache.capacity, dtype=torch.int64, device=self.device) \
            if self.window is not None else None

    # ------------------------------------------------------------------------------------------ geometry
    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def start(self) -> int:
        return self.cache.start

    def _columns(self, n: int) -> torch.Tensor:
        if self._arange.shape[0] < n:
            self._arange = torch.arange(max(n, 64), device=self.device)
        return self._arange[:n]

    def _relocate(self, capacity: int, new_start: int) -> None:
        live = self.length - self.start
        mask = self.mask.new_zeros(self.batch, capacity)
        mask[:, new_start:new_start + live] = self.mask[:, self.start:self.length]
        if self.pos is not None:
            pos = self.pos.new_zeros(self.batch, capacity)
            pos[:, new_start:new_start + live] = self.pos[:, self.start:self.length]
            self.pos = pos
        self.cache.relocate(capacity, new_start)
        self.mask = mask

    def reserve(self, n: int, left_room: int = 0) -> None:
        """Make columns [length, length + n) writable and length >= left_room (room for a row of left_room
        tokens ending at `length`). Live columns move to the front of a buffer grown by doubling when needed."""
        live = self.length - self.start
        need_start = max(0, left_room - live)  # a prompt longer than the live window pushes everyone right
        if self.start >= need_start and self.length + n <= self.cache.capacity:
            return
        if need_start + live + n > self.cache.capacity and self._waste() > 0:
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
        self.cache.start = max(self.cache.start, self.length - max(self.span, default=0))

    def _waste(self) -> int:
        """Columns of the window that compaction would cut: the window minus its longest row."""
        if not self.batch or self.length <= self.start:
            return 0
        return self.length - self.start - max(self.lengths)

    # ------------------------------------------------------------------------------------------ forward
    def _attention(self, q0: int, n: int, positions: torch.Tensor):
        """[B, 1, n, W] mask over key columns [start, q0 + n): key j is visible to query i iff it is a real
        token and j <= q0 + i. Each query also sees itself, so a padding query (prefill) never has an empty
        row: SDPA would return NaN there, and a NaN value vector poisons later rows even at weight 0.
        Sliding-window layers also drop keys whose position is `window` or more behind the query's (their own
        column stays: it is 0 behind); the model gets a mapping from layer type to mask, or the windowed mask
        alone when every layer slides (see specdec.kv.geometry.attention_windows)."""
        kv = torch.arange(self.start, q0 + n, device=self.device)
        q = torch.arange(q0, q0 + n, device=self.device)
        visible = self.mask[:, None, self.start:q0 + n] & (kv[None, :] <= q[:, None])[None]
        diagonal = (kv[None, :] == q[:, None])[None]
        if self.window is None:
            return self._as_mask((visible | diagonal)[:, None])
        behind = positions[:, :, None] - self.pos[:, None, self.start:q0 + n]
        sliding = self._as_mask(((visible & (behind < self.window)) | diagonal)[:, None])
        if self.window_mode == "all":
            return sliding
        return {"full_attention": self._as_mask((visible | diagonal)[:, None]), "sliding_attention": sliding}

    def _as_mask(self, visible: torch.Tensor) -> torch.Tensor:
        if self.additive_mask:
            zero = torch.zeros((), dtype=self.dtype, device=self.device)
            return torch.where(visible, zero, torch.finfo(self.dtype).min)
        return visible

    def forward(self, input_ids: torch.Tensor, new_lengths: Sequence[int] | None = None,
                logits_to_keep: int = 0, model=None) -> torch.Tensor:
        """Run the model on n new columns per row (input_ids [B, n]), appending their keys and values.

        new_lengths: optional host ints: row b's real tokens are its last new_lengths[b] columns, the ones
        before them padding (default: all n are real), so a row's real columns stay contiguous.
        model: run this model instead of the lane's own, over the lane's cache: an early-exit view of it
        (specdec.drafting.early_exit), which writes only its first layers' columns.
        Returns logits [B, n or logits_to_keep, V]."""
        n = input_ids.shape[1]
        if new_lengths is None:
            real = [n] * self.batch
        else:
            real = [int(r) for r in new_lengths]
        lead = [n - r for r in real]
        ragged = any(lead)
        self.reserve(n)
        self.cache.reserve(n)  # within capacity now: only records n for the layers' update()
        q0 = self.length
        if not ragged:
            self.mask[:, q0:q0 + n] = True
            counts = self._columns(n + 1)[None, 1:]
        else:
            device_mask = self._columns(n)[None, :] >= self._tensor(lead)[:, None]
            self.mask[:, q0:q0 + n] = device_mask
            counts = device_mask.to(torch.int64).cumsum(dim=1)
        positions = (self.seq_len[:, None] + counts - 1).clamp_(min=0)
        if self.max_position is not None:
            # Speculative columns past the position limit can only produce tokens that are cut anyway.
            positions.clamp_(max=self.max_position - 1)
        if self.pos is not None:
            self.pos[:, q0:q0 + n] = positions
        # A window without padding or holes in any row (batch 1, or rows of one length) needs no mask of ours:
        # transformers' own causal mask over the cache (from get_mask_sizes) is the same one, and at one new
        # column it passes none to SDPA at all. Building ours costs about 0.5 ms a step and a masked SDPA is
        # slower still: SmolLM2 at batch 1 decodes 5% faster without them. Sliding windows keep ours.
        full = not ragged and self.window is None and all(r == q0 - self.start for r in self.lengths)
        run = self.model if model is None else model
        try:
            out = run(input_ids=input_ids, attention_mask=None if full else self._attention(q0, n, positions),
                      position_ids=positions, cache=self.cache, use_cache=True, logits_to_keep=logits_to_keep)
        finally:
            self.cache.pending = 0
        self.cache.length += n
        self.seq_len += counts[:, -1]
        for b in range(self.batch):
            if real[b] and not self.new_real[b]:
                self.first_new[b] = self.written + lead[b]
            self.new_real[b] += real[b]
            self.lengths[b] += real[b]
            if self.span[b]:
                self.span[b] += n
            elif real[b]:
                self.span[b] = real[b]
        self.written += n
        return out.logits

    # ------------------------------------------------------------------------------------------ realign
    def _tensor(self, values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).to(self.device, non_blocking=True)

    def drop_and_align(self, drop: Sequence[int]) -> list[int]:
        """Row b discards its last drop[b] columns (host ints; they must be real tokens it wrote); rows shift
        right by drop[b] - min(drop) so they end at the same column again. Returns those shifts
        (realign="mask" leaves that many holes at the end of each row instead, and moves nothing until it
        compacts)."""
        drop = [int(d) for d in drop]
        written, self.written = self.written, 0
        self.new_real = [0] * self.batch
        if not drop:
            return []
        dmin, dmax = min(drop), max(drop)
        shifts = [d - dmin for d in drop]
        if dmax:
            self.seq_len -= self._tensor(drop)
        for b, d in enumerate(drop):
            self.lengths[b] -= d
        if self.realign == "mask":
            self._drop_as_holes(drop, dmin, dmax, written)
            return shifts
        if dmax > dmin:
            if self.realign == "paper":
                self._shift_rows_loop(shifts)
            else:
                device_shifts = self._tensor(shifts)
                sk.shift_rows_(self.cache.live(), device_shifts, dim=-2, backend=self.backend, check_values=False)
                sk.shift_rows_(self._row_tables(), device_shifts, dim=-1, backend=self.backend, check_values=False)
        self.cache.length -= dmin
        for b, d in enumerate(drop):
            self.span[b] = max(0, self.span[b] - d)
        self._tighten()
        # Shifting keeps rows free of holes, except those a ragged write left (a draft model catching up on a
        # refilled row's prompt): squeeze them out once they are worth it, as realign="mask" does.
        waste = self._waste()
        if waste > 0 and waste >= self.compact_threshold * (self.length - self.start):
            self.compact()
        return shifts

    def _drop_as_holes(self, drop: list[int], dmin: int, dmax: int, written: int) -> None:
        end = self.length - dmin
        if dmax > dmin:
            # tail column j is column end - (dmax - dmin) + j; row b keeps it iff it is before length - drop[b]
            tail = self.mask[:, self.length - dmax:end]
            tail &= self._columns(dmax - dmin)[None, :] < (dmax - self._tensor(drop))[:, None]
        self.cache.length = end
        for b in range(self.batch):
            self.span[b] = max(0, self.span[b] - dmin)
        waste = self._waste()
        # Compact at the threshold, or now (in the realign phase) when the next step's columns would not fit
        # even with the window moved to the front of the buffer, so that holes never make it grow.
        if waste > 0 and (waste >= self.compact_threshold * (self.length - self.start)
                          or self.length - self.start + written > self.cache.capacity):
            self.compact()

    def compact(self) -> None:
        """Squeeze out the holes: each row's real columns move, in order, to the end of the window (one
        sk.compact_rows_ call for the whole slab), leaving every row right-aligned with no holes, exactly as
        realign="shift" would have it; the window then starts at the longest row."""
        if not self.batch or self.length <= self.start:
            return
        live = self.length - self.start
        window = self.mask[:, self.start:self.length]
        sk.compact_rows_(self.cache.live(), window, dim=-2, backend=self.backend, check_values=False)
        if self.pos is not None:
            sk.compact_rows_(self.pos[:, self.start:self.length], window, dim=-1, backend=self.backend,
                             check_values=False)
        # The mask compacts to right-aligned runs of seq_len[b]: write that instead of moving it.
        window.copy_(self._columns(live)[None, :] >= (live - self.seq_len)[:, None])
        self.span = list(self.lengths)
        self.cache.start = self.length - max(self.lengths)
        self.compactions += 1

    def _shift_rows_loop(self, shifts: list[int]) -> None:
        slab, lo, hi = self.cache.slab, self.start, self.length
        for b, s in enumerate(shifts):
            if s == 0:
                continue
            for i in range(slab.shape[1]):
                row = slab[b, i, :, lo:hi]
                slab[b, i, :, lo:hi] = torch.cat([row.new_zeros(row.shape[0], s, row.shape[2]), row[:, :hi - lo - s]],
                                                 dim=1)
            for table in self._row_tables():
                row = table[b]
                table[b] = torch.cat([row.new_zeros(s), row[:hi - lo - s]])

    def _row_tables(self) -> list[torch.Tensor]:
        """The per-column tables that move with the keys and values: the mask, and positions where kept."""
        tables = [self.mask[:, self.start:self.length]]
        if self.pos is not None:
            tables.append(self.pos[:, self.start:self.length])
        return tables

    def mark(self) -> tuple:
        """The lane's state now, for rewind(): what a self-speculative draft appends is taken back before the
        target verifies (specdec.drafting.early_exit)."""
        return (self.written, self.seq_len.clone(), list(self.lengths), list(self.span), list(self.new_real),
                list(self.first_new))

    def rewind(self, mark: tuple) -> None:
        """Forget every column written since mark() (they must all be whole columns: forwards without
        new_lengths). A growth in between moved the window, not its end relative to the written columns, so
        the end is found from `written`. The columns' keys, values and mask entries stay as garbage past
        `length`: every forward writes all of its columns' entries."""
        written, seq_len, lengths, span, new_real, first_new = mark
        self.cache.length -= self.written - written
        self.written, self.seq_len = written, seq_len
        self.lengths, self.span, self.new_real, self.first_new = lengths, span, new_real, first_new

    def crop(self, n: int) -> None:
        """Discard the last n columns of every row (all rows hold real tokens there)."""
        self.cache.length -= n
        self.seq_len -= n
        self.lengths = [x - n for x in self.lengths]
        self.span = [max(0, x - n) for x in self.span]
        self.written = max(0, self.written - n)

    # ------------------------------------------------------------------------------------------ rows
    def select_rows(self, index: Sequence[int]) -> None:
        """Keep rows `index` (host ints), in that order."""
        index = list(index)
        device_index = self._tensor(index)
        self.cache.select_rows(device_index)
        self.mask = self.mask.index_select(0, device_index)
        if self.pos is not None:
            self.pos = self.pos.index_select(0, device_index)
        self.seq_len = self.seq_len.index_select(0, device_index)
        for name in ("lengths", "span", "first_new", "new_real"):
            values = getattr(self, name)
            setattr(self, name, [values[i] for i in index])
        self._tighten()

    def place(self, rows: Sequence[int], src: "RaggedKV") -> None:
        """Overwrite `rows` with the rows of src (a freshly prefilled batch of the same model), right-aligned
        to this batch's end column; every row is first pushed right if src is longer than the live window."""
        rows = list(rows)
        width = src.length - src.start
        self.reserve(0, left_room=width)
        end = self.length
        index = self._tensor(rows)
        self.cache.slab[index, :, :, end - width:end] = src.cache.slab[:, :, :, src.start:src.length]
        self.mask[index, :end] = False
        self.mask[index, end - width:end] = src.mask[:, src.start:src.length]
        if self.pos is not None:
            self.pos[index, end - width:end] = src.pos[:, src.start:src.length]
        self.seq_len[index] = src.seq_len
        base = end - self.written
        for j, b in enumerate(rows):
            self.lengths[b], self.span[b] = src.lengths[j], src.span[j]
            # the placed tokens count as this step's writes (EXSPEC's pool copies them back to the slot)
            self.new_real[b], self.first_new[b] = src.lengths[j], end - src.span[j] - base
        self.cache.start = min(self.cache.start, end - max(src.span, default=0))

    def fill_rows(self, rows: Sequence[int], tokens: Sequence[Sequence[int]]) -> None:
        """Rows `rows`, which hold nothing yet, now hold `tokens` (one list per row): prefilled on their own, so
        the other rows pay nothing for them, and placed right-aligned (no holes)."""
        src, _ = RaggedKV.prefill(self.model, tokens, 0, self.backend, realign=self.realign)
        self.place(rows, src)

    def clear_rows(self, rows: Sequence[int]) -> None:
        """Rows `rows` now hold no tokens (a sequence whose cache will be filled later)."""
        rows = list(rows)
        if not rows:
            return
        index = self._tensor(rows)
        self.mask[index] = False
        self.seq_len[index] = 0
        for b in rows:
            self.lengths[b] = self.span[b] = 0
        self._tighten()

    @classmethod
    def empty(cls, model, batch: int, capacity: int, backend: str | None = None, realign: str = "shift",
              compact_threshold: float | None = None) -> "RaggedKV":
        """A batch of `batch` rows that hold nothing yet (room for `capacity` columns before it grows)."""
        return cls(model, batch, round_up_pow2(max(1, capacity)), backend, realign, compact_threshold)

    @classmethod
    def prefill(cls, model, prompts: Sequence[Sequence[int]], extra: int, backend: str | None = None,
                logits_to_keep: int = 1, realign: str = "shift",
                compact_threshold: float | None = None) -> tuple["RaggedKV", torch.Tensor]:
        """A new right-aligned batch holding `prompts`, with room for `extra` more columns; also returns the
        logits of the last column(s)."""
        width = max(len(p) for p in prompts)
        ids = right_aligned(prompts, width)
        state = cls(model, len(prompts), round_up_pow2(width + extra), backend, realign, compact_threshold)
        logits = state.forward(ids.to(state.device), [len(p) for p in prompts], logits_to_keep=logits_to_keep)
        state.written = 0  # the prompt is not what a step writes
        state.new_real = [0] * state.batch
        return state, logits


def right_aligned(rows: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """CPU ids int64 [B, width] with each row's tokens at the end (padding id 0 first)."""
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    for b, row in enumerate(rows):
        if len(row):
            ids[b, width - len(row):] = torch.as_tensor(list(row), dtype=torch.int64)
    return ids
