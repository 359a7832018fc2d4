"""The torch reference of every op (the specification and the "torch" backend), gathered from the op families:
sampling/reference.py (accept_lengths, verify_greedy, rejection_sample) and moves/reference.py (shift_rows_,
compact_rows_). The naive per-row loops the references are tested against live next to them (*/naive.py)."""

from .moves.reference import compact_rows_, shift_rows_
from .sampling.reference import accept_lengths, rejection_sample, verify_greedy

__all__ = ["accept_lengths", "compact_rows_", "rejection_sample", "shift_rows_", "verify_greedy"]
