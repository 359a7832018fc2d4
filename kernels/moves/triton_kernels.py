"""Triton kernel of the row-move family: the in-place row moves of shift_rows_ and compact_rows_.

Every tensor is seen as lines: one line is (b, outer index) and holds T positions x `inner` elements along
`dim`, addressed through strides, so non-contiguous views work. Destination position u of a line takes source
position src(u), or `fill` where there is none: shift: src(u) = u - s_b; compaction: a per-row map shared by
all tensors. One program owns one whole line, so programs never share memory. Inside a line source and
destination overlap; blocks go in the safe direction (backward when src(u) <= u, forward when src(u) >= u),
so a block never reads what an earlier block wrote, and a barrier separates a block's loads from its stores.

Bytes are moved as the signed integer of the element width, so one launch serves every dtype of that width.
The tensors of a launch are addressed as element offsets from one base tensor, with a small int64 table per
line kind (offset, sizes, strides, T, fill bits) and cumulative line counts; both are cached per layout.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch
import triton
import triton.language as tl

from .. import triton_utils as tu
from . import reference

_MOVABLE_WIDTHS = (1, 2, 4, 8)  # wider elements (complex128) go through the reference
_FIELDS = 16  # int64 slots per table row: OFF, N1, N2, N3, SB, S1, S2, S3, T, ST, NI, SI, FILL, (pad)


@triton.jit
def _move_rows_kernel(base_ptr, meta_ptr, starts_ptr, shifts_ptr, src_ptr, kept_ptr, s_shift, s_src, s_src_t,
                      NTP: tl.constexpr, COMPACT: tl.constexpr, FAST: tl.constexpr, VEC: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    # Which table row this program's line belongs to: count the row starts at or below pid.
    starts = tl.load(starts_ptr + tl.arange(0, NTP))
    t = tl.sum((starts <= pid).to(tl.int32), axis=0) - 1
    m = meta_ptr + t * 16
    local = pid - tl.load(starts_ptr + t)
    n3 = tl.load(m + 3)
    i3 = local % n3
    local = local // n3
    n2 = tl.load(m + 2)
    i2 = local % n2
    local = local // n2
    n1 = tl.load(m + 1)
    i1 = local % n1
    b = local // n1
    line = (tl.load(m + 0) + b * tl.load(m + 4) + i1 * tl.load(m + 5) + i2 * tl.load(m + 6)
            + i3 * tl.load(m + 7))
    T = tl.load(m + 8)
    st = tl.load(m + 9)
    ni = tl.load(m + 10)
    si = tl.load(m + 11)
    fill = tl.load(m + 12).to(base_ptr.dtype.element_ty)

    nblk = tl.cdiv(T, BLOCK_T)
    if COMPACT:
        kept = tl.load(kept_ptr + b)
        lo = T - kept  # destinations u >= lo hold kept positions; src(u) <= u
        nblk = tl.where(kept == T, 0, nblk)  # nothing to squeeze out: no work
        backward = kept >= 0
    else:
        s = tl.load(shifts_ptr + b * s_shift)
        nblk = tl.where(s == 0, 0, nblk)
        backward = s > 0
    for k in range(0, nblk):
        blk = tl.where(backward, nblk - 1 - k, k)
        u = blk * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
        in_t = u < T
        if COMPACT:
            has = in_t & (u >= lo)
            src = tl.load(src_ptr + b * s_src + u * s_src_t, mask=has, other=0)
            move = has & (src != u)  # positions that stay put are neither read nor written
            write = in_t & ((u < lo) | (src != u))
        else:
            src = u - s
            move = in_t & (src >= 0) & (src < T)
            write = in_t
        src_row = line + src * st
        dst_row = line + u * st
        for i0 in range(0, ni, BLOCK_I):
            cols = i0 + tl.arange(0, BLOCK_I).to(tl.int64)
            if FAST:
                # Every line of this launch: unit inner stride, inner % BLOCK_I == 0, rows 16-byte aligned.
                src_off = tl.max_contiguous(tl.multiple_of(src_row[:, None] + cols[None, :], [1, VEC]),
                                            [1, BLOCK_I])
                dst_off = tl.max_contiguous(tl.multiple_of(dst_row[:, None] + cols[None, :], [1, VEC]),
                                            [1, BLOCK_I])
                load_mask = move[:, None]
                store_mask = write[:, None]
            else:
                src_off = src_row[:, None] + cols[None, :] * si
                dst_off = dst_row[:, None] + cols[None, :] * si
                load_mask = move[:, None] & (cols[None, :] < ni)
                store_mask = write[:, None] & (cols[None, :] < ni)
            x = tl.load(base_ptr + src_off, mask=load_mask)
            tl.debug_barrier()  # all loads of the block before any store: source and destination rows overlap
            tl.store(base_ptr + dst_off, tl.where(move[:, None], x, fill), mask=store_mask)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """x reinterpreted as the signed integer of its element width (a view, same strides)."""
    return x if x.dtype == tu.INT_OF_WIDTH[x.element_size()] else x.view(tu.INT_OF_WIDTH[x.element_size()])


def _fill_bits(dtype: torch.dtype, fill) -> int:
    """fill converted to dtype exactly as the reference's masked_fill_ does, as an integer bit pattern."""
    one = torch.zeros(1, dtype=dtype).masked_fill_(torch.ones(1, dtype=torch.bool), fill)
    return int(_bits(one)[0].item())


def _merge(sizes, strides) -> list[tuple[int, int]]:
    """Drop size-1 dims and merge neighbours whose strides allow it (outer stride == inner stride * size)."""
    out: list[tuple[int, int]] = []
    for n, s in zip(sizes, strides):
        if n == 1:
            continue
        if out and out[-1][1] == s * n:
            out[-1] = (out[-1][0] * n, s)
        else:
            out.append((n, s))
    return out


def _lines(x: torch.Tensor, d: int) -> list[tuple[torch.Tensor, int, list[tuple[int, int]], tuple[int, int]]]:
    """Split x into views with at most 3 line dims besides batch: [(view, dim, line dims, (inner, stride))]."""
    shape, stride = x.shape, x.stride()
    post = _merge(shape[d + 1:], stride[d + 1:])
    inner = post.pop() if post else (1, 1)
    dims = _merge(shape[1:d], stride[1:d]) + post
    if len(dims) <= 3:
        return [(x, d, dims, inner)]
    p = next(i for i in range(1, x.ndim) if i != d and shape[i] > 1)  # more lines: one view per index
    return [part for j in range(shape[p]) for part in _lines(x.select(p, j), d - (p < d))]


class _Plan:
    """The launches of one call layout: per element width, a base tensor index and the cached tables."""

    def __init__(self, tensors: Sequence[torch.Tensor], dim: int, fill):
        groups: dict[tuple[int, int], list] = {}
        for i, x in enumerate(tensors):
            if x.numel() == 0:
                continue
            bx = _bits(x)
            fill_bits = _fill_bits(x.dtype, fill)
            for view, d, dims, inner in _lines(bx, dim % x.ndim):
                w = view.element_size()
                groups.setdefault((w, view.data_ptr() % w), []).append((i, view, d, dims, inner, fill_bits))
        self.launches = []
        for (w, _), rows in groups.items():
            # The lowest address is the base, so every offset is >= 0.
            base_index = min({r[0] for r in rows}, key=lambda i: tensors[i].data_ptr())
            base_view = _bits(tensors[base_index])
            vec = 16 // w
            block_t, block_i, warps = tu.move_blocks(max(r[1].shape[r[2]] for r in rows),
                                                     max(r[4][0] for r in rows), w)
            meta, starts, total, fast = [], [], 0, base_view.data_ptr() % 16 == 0
            for _, view, d, dims, (ni, si), fill_bits in rows:
                dims = [(1, 0)] * (3 - len(dims)) + dims
                off = (view.data_ptr() - base_view.data_ptr()) // w
                strides = [view.stride(0)] + [s for _, s in dims] + [view.stride(d)]
                fast &= (ni % block_i == 0 and si == 1 and view.data_ptr() % 16 == 0
                         and all(s % vec == 0 for s in strides))
                meta.append([off, *(n for n, _ in dims), *strides[:4], view.shape[d], strides[4], ni, si,
                             fill_bits] + [0] * (_FIELDS - 13))
                starts.append(total)
                total += view.shape[0] * dims[0][0] * dims[1][0] * dims[2][0]
            ntp = tu.next_pow2(len(starts))
            starts += [2**63 - 1] * (ntp - len(starts))
            table = torch.tensor([v for row in meta for v in row] + starts, dtype=torch.int64)
            table = table.to(base_view.device)
            self.launches.append((base_index, table, table[len(meta) * _FIELDS:], total, ntp, fast, vec,
                                  block_t, block_i, warps))


_CACHE: "OrderedDict[tuple, _Plan]" = OrderedDict()
_CACHE_SIZE = 64


def _plan(tensors: Sequence[torch.Tensor], dim: int, fill) -> _Plan:
    # The key costs Python work per tensor (docs/ops_overhead.json, `python bench/op_overhead.py`): pass one slab
    # tensor instead of many same-shape views where possible.
    key = (dim, repr(fill), type(fill), tu.MAX_TILE, tensors[0].device if tensors else None,
           tuple([(x.data_ptr(), x.shape, x.stride(), x.dtype) for x in tensors]))
    plan = _CACHE.get(key)
    if plan is None:
        plan = _CACHE[key] = _Plan(tensors, dim, fill)
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return plan


def _launch(tensors, dim, fill, shifts, src, kept) -> None:
    compact = src is not None
    per_row = src if compact else shifts
    for base_index, table, starts, total, ntp, fast, vec, block_t, block_i, warps in \
            _plan(tensors, dim, fill).launches:
        _move_rows_kernel[(total,)](
            _bits(tensors[base_index]), table, starts, per_row, per_row, kept if compact else per_row,
            0 if compact else shifts.stride(0), src.stride(0) if compact else 0, src.stride(1) if compact else 0, NTP=ntp, COMPACT=compact, FAST=fast, VEC=vec,
            BLOCK_T=block_t, BLOCK_I=block_i, num_warps=warps)


def _split(tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(tensors the kernel moves, tensors of an element width it does not, e.g. complex128)."""
    odd = [x for x in tensors if x.element_size() not in _MOVABLE_WIDTHS]
    return ([x for x in tensors if x.element_size() in _MOVABLE_WIDTHS], odd) if odd else (list(tensors), odd)


def shift_rows_(tensors: Sequence[torch.Tensor], shifts: torch.Tensor, *, dim: int, fill) -> None:
    """In place: tensors[i][b, ..., t, ...] = old[b, ..., t - shifts[b], ...] along `dim` where in range,
    else fill. Each tensor has batch B at dim 0 and any length T_i along dim; shifts int64[B]."""
    tensors, odd = _split(tensors)
    _launch(tensors, dim, fill, shifts, None, None)
    if odd:
        reference.shift_rows_(odd, shifts, dim=dim, fill=fill)


def compact_rows_(tensors: Sequence[torch.Tensor], keep: torch.Tensor, *, dim: int, fill) -> torch.Tensor:
    """In place: the kept positions (keep bool[B, T]) of each row move, in order, to the end of the row along
    `dim`; the freed front gets fill. Each tensor has batch B at dim 0 and length T along dim. -> kept int64[B]."""
    tensors, odd = _split(tensors)
    kept = keep.sum(dim=1)
    # A stable sort puts the dropped positions first, then the kept ones in order: destination
    # u >= T - kept[b] takes position order[b, u].
    order = torch.sort(keep.view(torch.uint8), dim=1, stable=True).indices
    _launch(tensors, dim, fill, None, order, kept)
    if odd:
        reference.compact_rows_(odd, keep, dim=dim, fill=fill)
    return kept
