"""Argument validation, done once in the dispatch layer for every backend, before anything is modified.

Structural checks (shape, dtype, device) are free and always on. Checks that read tensor values (NaN,
id and count ranges) cost one host sync on a GPU; they are on unless SPECDEC_CHECKS=0. All value checks
of one call are gathered into a single tensor and read back once.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def value_checks_enabled() -> bool:
    return os.environ.get("SPECDEC_CHECKS", "1") != "0"


def describe(x: torch.Tensor) -> str:
    return f"shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}"


def expect_tensor(name: str, x, *, ndim: int | None = None, dtypes=None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got {describe(x)}")
    if dtypes is not None and x.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"{name} must have dtype in ({names}), got {describe(x)}")
    return x


def expect_shape(name: str, x: torch.Tensor, shape: Sequence[int], meaning: str) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({meaning}), got {describe(x)}")


def expect_device(name: str, x: torch.Tensor, device: torch.device, other: str) -> None:
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but {other} is on {device}; all tensors must share a device")


def check_num_draft(num_draft, batch: int, k: int, device: torch.device, other: str):
    if num_draft is None:
        return None
    expect_tensor("num_draft", num_draft, ndim=1, dtypes=(torch.int64,))
    expect_shape("num_draft", num_draft, (batch,), "one count per row")
    expect_device("num_draft", num_draft, device, other)
    return num_draft


class ValueChecks:
    """Collects named boolean 'is bad' scalars and raises for the first true one after a single readback."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._flags: list[torch.Tensor] = []

    def add(self, bad: torch.Tensor, message: str) -> None:
        self._names.append(message)
        self._flags.append(bad.reshape(()))

    def add_num_draft(self, num_draft, k: int) -> None:
        if num_draft is not None and num_draft.numel():
            self.add((num_draft < 0).any() | (num_draft > k).any(),
                     f"num_draft entries must lie in 0..K={k}")

    def add_draft_ids(self, draft_tokens: torch.Tensor, num_draft, vocab: int) -> None:
        if draft_tokens.numel() == 0:
            return
        bad = (draft_tokens < 0) | (draft_tokens >= vocab)
        if num_draft is not None:
            slots = torch.arange(draft_tokens.shape[1], device=draft_tokens.device)
            bad = bad & (slots[None, :] < num_draft[:, None])
        self.add(bad.any(), f"draft_tokens has an id outside [0, V={vocab}) among the first num_draft slots")

    def add_probs(self, name: str, probs: torch.Tensor) -> None:
        if probs.numel():
            low = probs.min()  # min propagates NaN, so one reduction finds NaN and negative entries
            self.add(low.isnan() | (low < 0), f"{name} contains NaN or negative probabilities")

    def add_no_nan(self, name: str, x: torch.Tensor) -> None:
        if x.numel():
            self.add(x.max().isnan(), f"{name} contains NaN")

    def raise_first(self) -> None:
        if not self._flags:
            return
        flags = torch.stack(self._flags).tolist()  # the one host sync of the call
        for bad, message in zip(flags, self._names):
            if bad:
                raise ValueError(message)


def tensor_list(name: str, tensors) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{name} must be a tensor or a non-empty list/tuple of tensors, got {tensors!r:.80}")
    for i, x in enumerate(tensors):
        expect_tensor(f"{name}[{i}]", x)
    return list(tensors)


def check_rows(name: str, tensors: list[torch.Tensor], batch: int, dim: int, device: torch.device,
               other: str, length: int | None = None) -> None:
    """Every tensor has batch `batch` at dim 0, a distinct non-batch `dim`, and lives on `device`."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ValueError(f"dim must be an int, got {dim!r}")
    for i, x in enumerate(tensors):
        label = f"{name}[{i}]"
        if x.ndim < 2:
            raise ValueError(f"{label} needs batch at dim 0 and at least one more dimension, got {describe(x)}")
        if not -x.ndim <= dim < x.ndim or dim % x.ndim == 0:
            raise ValueError(f"dim={dim} is not a non-batch dimension of {label} ({describe(x)})")
        if x.shape[0] != batch:
            raise ValueError(f"{label} has batch {x.shape[0]} but {other} has {batch} rows ({describe(x)})")
        expect_device(label, x, device, other)
        if length is not None and x.shape[dim] != length:
            raise ValueError(f"{label} has length {x.shape[dim]} along dim={dim} but {other} has T={length}")
