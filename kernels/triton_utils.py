"""Shared helpers of the Triton kernels: block sizes, warps, dtype maps.

Block sizes only change speed, never results: every kernel loops over blocks and handles the tails with masks.
`MAX_TILE` caps the elements of one register tile; tests lower it to run the multi-block paths on tiny inputs.
"""

from __future__ import annotations

import torch
import triton

# Elements in one program's register tile: 4096 x 4 bytes is 32 registers per thread at 4 warps.
MAX_TILE = 4096

# The kernels that only move bytes treat every dtype as the signed integer of its width.
INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))


def prev_pow2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def _warps(tile: int) -> int:
    return 8 if tile >= 8192 else 4 if tile >= 1024 else 2 if tile >= 256 else 1


def row_blocks(rows: int, length: int, *, arrays: int = 1) -> tuple[int, int]:
    """(BLOCK, num_warps) for a program that sweeps `rows` rows of `length` elements at once with `arrays`
    live arrays per element: BLOCK is a power of two, rows * BLOCK * arrays <= MAX_TILE where possible."""
    rows = next_pow2(rows)
    block = min(next_pow2(length), prev_pow2(max(16, MAX_TILE // (rows * arrays))))
    return block, _warps(rows * block * arrays)


def move_blocks(max_length: int, max_inner: int, itemsize: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_I, num_warps) for the row-move kernel: a [BLOCK_T, BLOCK_I] tile of positions x inner
    elements, about 16 KiB (MAX_TILE 4-byte elements) of data per step."""
    budget = prev_pow2(MAX_TILE * 4 // itemsize)
    block_i = min(next_pow2(max_inner), 256, budget)
    block_t = max(1, min(next_pow2(max_length), budget // block_i))
    return block_t, block_i, _warps(block_t * block_i * itemsize // 4)
