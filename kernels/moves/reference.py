"""Vectorised PyTorch reference of the row-move family: the specification of shift_rows_ and compact_rows_, and
the "torch" backend.

Vectorised over rows (a gather per tensor, no Python loop over the batch), so it doubles as the honest
no-custom-kernel baseline; naive.py is the same rule as a readable per-row loop. Arguments are assumed
validated (ops.py does that once for every backend). Shapes: B rows, T positions along `dim`.
"""

from __future__ import annotations

from typing import Sequence

import torch


def _expand_index(index: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """Broadcast a per-row index [B, T] to x's shape along `dim`."""
    shape = [1] * x.ndim
    shape[0], shape[dim] = index.shape
    return index.view(shape).expand(*x.shape[:dim], index.shape[1], *x.shape[dim + 1:])


def _gather_rows_(x: torch.Tensor, dim: int, src: torch.Tensor, valid: torch.Tensor, fill) -> None:
    """x[b, ..., t, ...] = x[b, ..., src[b, t], ...] where valid[b, t], else fill (in place)."""
    out = x.gather(dim, _expand_index(src.clamp(0, max(x.shape[dim] - 1, 0)), x, dim))
    out.masked_fill_(~_expand_index(valid, x, dim), fill)
    x.copy_(out)


def _tensor_list(tensors: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def shift_rows_(tensors: torch.Tensor | Sequence[torch.Tensor], shifts: torch.Tensor, *, dim: int = -2,
                fill: float = 0) -> None:
    """Move row b of every tensor by shifts[b] along `dim` (positive: toward the end), in place;
    vacated positions get `fill`. Each tensor has batch at dim 0; shifts int64[B]."""
    for x in _tensor_list(tensors):
        d = dim % x.ndim
        positions = torch.arange(x.shape[d], device=x.device)
        src = positions[None, :] - shifts[:, None].to(x.device)
        _gather_rows_(x, d, src, (src >= 0) & (src < x.shape[d]), fill)


def compact_rows_(tensors: torch.Tensor | Sequence[torch.Tensor], keep: torch.Tensor, *, dim: int = -2,
                  fill: float = 0) -> torch.Tensor:
    """Move the kept positions of each row (keep bool[B, T]), in order, to the end of the row along `dim`;
    the freed front gets `fill`. In place; returns the kept count int64[B]."""
    keep = keep.bool()
    length = keep.shape[1]
    kept = keep.sum(dim=1)
    # Destination column u holds the (u - (T - kept))-th kept position: find it in the running count.
    running = keep.to(torch.int64).cumsum(dim=1).contiguous()
    rank = torch.arange(length, device=keep.device)[None, :] - (length - kept[:, None])
    src = torch.searchsorted(running, (rank + 1).contiguous(), side="left")
    valid = rank >= 0
    for x in _tensor_list(tensors):
        _gather_rows_(x, dim % x.ndim, src.to(x.device), valid.to(x.device), fill)
    return kept
