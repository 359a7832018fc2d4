"""Output allocation shared by the custom-kernel backends.

Tests poison outputs (`set_poison(-7)`): every output then starts filled with a value no kernel writes on purpose,
so an element a kernel forgets to write fails the comparison instead of passing by luck on zeroed memory.
The Triton launchers allocate here (`new_int64`); the C++ ops allocate their own outputs (functional schemas) and
read the same poison value, which `set_poison` hands to the extension.
"""

from __future__ import annotations

import torch

from .backend import unavailable_reason

POISON: int | None = None  # None means plain torch.empty


def set_poison(value: int | None) -> None:
    """Poison every output the Triton and C++ kernels allocate from now on (None: stop)."""
    global POISON
    POISON = value
    if unavailable_reason("cpp") is None:
        from . import _C
        _C._set_output_poison(value)


def new_int64(*shape: int, device: torch.device) -> torch.Tensor:
    if POISON is None:
        return torch.empty(shape, dtype=torch.int64, device=device)
    return torch.full(shape, POISON, dtype=torch.int64, device=device)
