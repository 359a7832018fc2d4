"""The "triton" backend: the five ops on Triton kernels (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1).

Arguments arrive validated by ops.py; the kernels live in triton_sampling.py and triton_shift.py.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import reference, triton_sampling, triton_shift

_MOVABLE_WIDTHS = (1, 2, 4, 8)


def accept_lengths(matches: torch.Tensor, num_draft: torch.Tensor | None = None) -> torch.Tensor:
    """matches bool[B, K], num_draft int64[B] or None -> int64[B]."""
    return triton_sampling.accept_lengths(matches, num_draft)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                  num_draft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens int64[B, K], target_logits float[B, K+1, V], num_draft int64[B] or None
    -> (tokens int64[B, K+1], num_accepted int64[B])."""
    return triton_sampling.verify_greedy(draft_tokens, target_logits, num_draft)


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     num_draft: torch.Tensor | None = None, *, uniform: torch.Tensor,
                     exponential: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens int64[B, K], draft_probs float[B, K, V] or None, target_probs float[B, K+1, V],
    num_draft int64[B] or None, uniform float32[B, K], exponential float32[B, V]
    -> (tokens int64[B, K+1], num_accepted int64[B])."""
    return triton_sampling.rejection_sample(draft_tokens, draft_probs, target_probs, num_draft, uniform,
                                            exponential)


def _split(tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(tensors the kernel moves, tensors of an element width it does not, e.g. complex128)."""
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    odd = [x for x in tensors if x.element_size() not in _MOVABLE_WIDTHS]
    return ([x for x in tensors if x.element_size() in _MOVABLE_WIDTHS], odd) if odd else (tensors, odd)


def shift_rows_(tensors: Sequence[torch.Tensor], shifts: torch.Tensor, *, dim: int, fill) -> None:
    """In place, along `dim` of every tensor (batch B at dim 0, any length T_i): row b moves by
    shifts int64[B] (positive: toward the end); vacated positions get fill."""
    tensors, odd = _split(tensors)
    triton_shift.shift_rows_(tensors, shifts, dim=dim, fill=fill)
    if odd:
        reference.shift_rows_(odd, shifts, dim=dim, fill=fill)


def compact_rows_(tensors: Sequence[torch.Tensor], keep: torch.Tensor, *, dim: int, fill) -> torch.Tensor:
    """In place, along `dim` of every tensor (batch B at dim 0, length T): the kept positions of each row
    (keep bool[B, T]) move, in order, to the end; the freed front gets fill. -> kept int64[B]."""
    tensors, odd = _split(tensors)
    kept = triton_shift.compact_rows_(tensors, keep, dim=dim, fill=fill)
    if odd:
        reference.compact_rows_(odd, keep, dim=dim, fill=fill)
    return kept
