"""The "cpp" backend: thin wrappers over torch.ops.specdec.* from the C++ extension specdec_kernels._C (csrc/).

Arguments arrive validated by ops.py. Outputs are allocated here (outputs.new_int64, so tests can poison them)
and filled by one C++ call per op; the list ops hand the whole tensor list to that one call.
"""

from __future__ import annotations

import torch

from . import _C  # noqa: F401  (importing registers torch.ops.specdec.*)
from .outputs import new_int64

_ops = torch.ops.specdec


def accept_lengths(matches: torch.Tensor, num_draft: torch.Tensor | None = None) -> torch.Tensor:
    out = new_int64(matches.shape[0], device=matches.device)
    _ops.accept_lengths(matches, num_draft, out)
    return out


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                  num_draft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    batch, k = draft_tokens.shape
    tokens = new_int64(batch, k + 1, device=draft_tokens.device)
    num_accepted = new_int64(batch, device=draft_tokens.device)
    _ops.verify_greedy(draft_tokens, target_logits, num_draft, tokens, num_accepted)
    return tokens, num_accepted


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     num_draft: torch.Tensor | None = None, *, uniform: torch.Tensor,
                     exponential: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch, k = draft_tokens.shape
    tokens = new_int64(batch, k + 1, device=draft_tokens.device)
    num_accepted = new_int64(batch, device=draft_tokens.device)
    _ops.rejection_sample(draft_tokens, draft_probs, target_probs, num_draft, uniform, exponential,
                          tokens, num_accepted)
    return tokens, num_accepted


def shift_rows_(tensors, shifts: torch.Tensor, *, dim: int = -2, fill: float = 0) -> None:
    _ops.shift_rows_([tensors] if isinstance(tensors, torch.Tensor) else tensors, shifts, dim, fill)


def compact_rows_(tensors, keep: torch.Tensor, *, dim: int = -2, fill: float = 0) -> torch.Tensor:
    kept = new_int64(keep.shape[0], device=keep.device)
    _ops.compact_rows_([tensors] if isinstance(tensors, torch.Tensor) else tensors, keep, dim, fill, kept)
    return kept
