"""Output allocation shared by the custom-kernel backends.

Tests set POISON so that every output starts filled with a value no kernel writes on purpose: an element a
kernel forgets to write then fails the comparison instead of passing by luck on zeroed memory.
"""

from __future__ import annotations

import torch

POISON: int | None = None  # tests set e.g. -7; None means plain torch.empty


def new_int64(*shape: int, device: torch.device) -> torch.Tensor:
    if POISON is None:
        return torch.empty(shape, dtype=torch.int64, device=device)
    return torch.full(shape, POISON, dtype=torch.int64, device=device)
