"""StepBatch: the handle one decode step works on, the same whichever scheduler built it.

A scheduler (EQSPEC's static batch, EXSPEC's pool) hands the decode loop a StepBatch each step; drafters see only
this handle, so they never know which scheduler runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .ragged import RaggedKV


@dataclass
class StepBatch:
    seqs: list[int]  # the sequence (prompt index) each row decodes
    target: RaggedKV  # the target's keys and values for these rows, right-aligned
    last: torch.Tensor  # int64 [B]: each row's newest token, not yet in the target's cache
    draft: RaggedKV | None = None  # the draft model's keys and values for these rows, if the drafter keeps them
    history: Callable[[int], Sequence[int]] | None = None  # seq -> its prompt and emitted tokens (host ints)
    prompt_length: Callable[[int], int] | None = None

    @property
    def size(self) -> int:
        return len(self.seqs)
