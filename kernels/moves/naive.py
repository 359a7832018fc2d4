"""The row-move family's rules as naive per-row Python loops: the readable specification.

Slow on purpose (a Python loop over rows and positions), written straight from the contract in DESIGN.md;
reference.py is the vectorised in-place form and the tests hold the two equal. These return new tensors and
leave their input alone.
"""

from __future__ import annotations

import torch


def shift_rows(x: torch.Tensor, shifts: torch.Tensor, dim: int, fill) -> torch.Tensor:
    """y[b, ..., t, ...] = x[b, ..., t - shifts[b], ...] along `dim` where that index is in range, else fill."""
    y = x.clone()
    d = dim % x.ndim
    length = x.shape[d]
    for b in range(x.shape[0]):
        row_in, row_out = x[b], y[b]
        for t in range(length):
            src = t - int(shifts[b])
            dst = row_out.select(d - 1, t)
            dst.copy_(row_in.select(d - 1, src) if 0 <= src < length else torch.full_like(dst, fill))
    return y


def compact_rows(x: torch.Tensor, keep: torch.Tensor, dim: int, fill) -> torch.Tensor:
    """The kept positions of each row (keep bool[B, T]), in order, at the end of the row; fill before them."""
    y = torch.full_like(x, fill)
    d = dim % x.ndim
    length = x.shape[d]
    for b in range(x.shape[0]):
        kept = [t for t in range(length) if keep[b, t]]
        for rank, t in enumerate(kept):
            y[b].select(d - 1, length - len(kept) + rank).copy_(x[b].select(d - 1, t))
    return y
