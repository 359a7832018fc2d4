"""Logits processing shared by the draft and the target.

Speculative sampling is exact only if the drafts are sampled from the same distribution q that the rejection
rule divides by, and the target side uses the distribution p the user asked for. So temperature, top-k and
top-p go through ONE function for both models; the engine never processes logits anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if self.do_sample:
            if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
                raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature!r}")
            if not (isinstance(self.top_k, int) and self.top_k >= 0):
                raise ValueError(f"top_k must be an int >= 0 (0: off), got {self.top_k!r}")
            if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
                raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return processed_probs(logits, self.temperature, self.top_k, self.top_p)


def processed_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0) -> torch.Tensor:
    """float32 probabilities over the last dim after temperature, then top-k, then top-p (nucleus).

    top-k keeps the k largest logits (ties at the k-th value all stay). top-p keeps the smallest set of most
    likely tokens whose mass reaches top_p (always at least the most likely one), as transformers does.
    """
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False, stable=True)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per distribution over the last dim, by the exponential race argmax(p / E), E ~ Exp(1): the
    same rule the rejection sampler uses for its resampled and bonus tokens. Zero-probability tokens never win."""
    noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(torch.float32).tiny)
    return (probs.float() / noise).argmax(dim=-1)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim; ties go to the lowest index, like sk.verify_greedy and transformers."""
    return logits.argmax(dim=-1)
