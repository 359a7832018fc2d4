"""The random noise of rejection sampling, drawn in one place so that every backend sees the same numbers."""

from __future__ import annotations

import torch

# torch's exponential_ can return 0 in float32 on rare draws; r / 0 would be inf or NaN. The smallest normal
# float keeps every score finite and changes the distribution by less than float32 can resolve.
_TINY = torch.finfo(torch.float32).tiny


def draw_noise(batch: int, num_slots: int, vocab: int, device: torch.device,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """uniform float32[B, K] in [0, 1) and exponential float32[B, V] in (0, inf), from `generator`."""
    uniform = torch.rand(batch, num_slots, generator=generator, device=device, dtype=torch.float32)
    exponential = torch.empty(batch, vocab, device=device, dtype=torch.float32)
    exponential.exponential_(generator=generator).clamp_(min=_TINY)
    return uniform, exponential
