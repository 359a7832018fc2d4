"""Logits processing shared by the draft and the target.

Speculative sampling is exact only if the drafts are sampled from the same distribution q that the rejection
rule divides by, and the target side uses the distribution p the user asked for. So every distribution the engine
decodes from goes through ONE object, its scoring: SamplingConfig (temperature, top-k, top-p) here, or a
transformers LogitsProcessorList (specdec.processing, which specdec.generate builds). A scoring has

    do_sample                      sample, or take the argmax
    process(logits, prefixes)      processed scores [..., V] (float32); the argmax is the greedy token
    probs(logits, prefixes)        softmax(process(...)): the distribution sampled from

and `prefixes` (Prefixes) tells processors that read the tokens so far (repetition penalty, n-gram bans,
minimum lengths) what each distribution of a block is conditioned on: for a verified block, position j of row b
follows that row's history and its first j drafts, exactly what plain decoding would have seen there.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

# The smallest temperature accepted when sampling: float32's smallest normal number, 2**-126 (about 1.18e-38).
# Logits are float32 and processed_probs divides them by the temperature in float32, so a smaller temperature
# (1e-300, say) is 0 or a subnormal there: logits / temperature is then inf or NaN (and 1 / temperature is not
# even finite). From MIN_TEMPERATURE up the quotient is computed so that it cannot overflow to +inf (see
# processed_probs), so every accepted temperature gives a distribution, approaching greedy as it shrinks.
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_integer(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass
class Prefixes:
    """What each distribution of a [B, w, V] block is conditioned on: row b's position j follows
    history(seqs[b]) (its prompt, then the tokens emitted so far; host ints) and then extra[b, :offset + j]
    (drafts, on the device). prompt_length(seq) separates prompt from new tokens (minimum-length rules)."""

    seqs: list[int]
    history: Callable[[int], Sequence[int]] | None = None
    prompt_length: Callable[[int], int] | None = None
    extra: torch.Tensor | None = None
    offset: int = 0


@dataclass(frozen=True)
class SamplingConfig:
    """Checked on construction, whatever do_sample says: a value of the wrong type is a ValueError naming the
    argument; the ranges of temperature, top_k and top_p matter (and are checked) only when sampling."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample must be True or False, got {self.do_sample!r}")
        if not _is_real(self.temperature):
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if not _is_integer(self.top_k):
            raise ValueError(f"top_k must be an int >= 0 (0: off), got {self.top_k!r}")
        if not _is_real(self.top_p):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        # plain Python numbers from here on (numpy scalars and the like are accepted above)
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "top_p", float(self.top_p))
        if self.do_sample:
            t = self.temperature
            if not (math.isfinite(t) and t >= MIN_TEMPERATURE):
                raise ValueError(
                    f"temperature must be a finite number >= {MIN_TEMPERATURE:.8g} when sampling, got {t!r}: "
                    f"logits are float32 and are divided by the temperature in float32, where a temperature "
                    f"below {MIN_TEMPERATURE:.8g} (float32's smallest normal number, 2**-126) is 0 or a subnormal "
                    f"and logits / temperature overflows to inf or NaN; for the greedy limit use do_sample=False")
            if self.top_k < 0:
                raise ValueError(f"top_k must be an int >= 0 (0: off), got {self.top_k!r}")
            if not 0 < self.top_p <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    def process(self, logits: torch.Tensor, prefixes: Prefixes | None = None) -> torch.Tensor:
        """Greedy: the logits themselves (warpers never move the argmax). Sampling: the warped scores."""
        if not self.do_sample:
            return logits
        return processed_scores(logits, self.temperature, self.top_k, self.top_p)

    def probs(self, logits: torch.Tensor, prefixes: Prefixes | None = None) -> torch.Tensor:
        return processed_probs(logits, self.temperature, self.top_k, self.top_p)


def check_scoring(scoring) -> None:
    """ValueError unless `scoring` has the interface above (do_sample a bool, process and probs callable)."""
    if not isinstance(getattr(scoring, "do_sample", None), bool) or not all(
            callable(getattr(scoring, name, None)) for name in ("process", "probs")):
        raise ValueError(f"scoring must have do_sample (True or False), process(logits, prefixes) and "
                         f"probs(logits, prefixes) (see specdec.sampling), got {type(scoring).__name__}")


def processed_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0) -> torch.Tensor:
    """float32 probabilities over the last dim after temperature, then top-k, then top-p (nucleus): the softmax
    of processed_scores."""
    return processed_scores(logits, temperature, top_k, top_p).softmax(dim=-1)


def processed_scores(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                     top_p: float = 1.0) -> torch.Tensor:
    """float32 scores over the last dim after temperature, then top-k, then top-p (nucleus); removed tokens -inf.

    top-k keeps the k largest logits (ties at the k-th value all stay). top-p keeps the smallest set of most
    likely tokens whose mass reaches top_p (always at least the most likely one), as transformers does.

    A temperature below 1 can push logits / temperature past float32's range (+-inf, then NaN out of the
    softmax). Rows where that happens are computed as (logits - row max) / temperature instead: the same
    distribution (softmax does not see a shift), the row's maximum exactly 0 and nothing above it, so only
    tokens of negligible probability can overflow (to -inf, probability 0). Other rows are exactly
    logits / temperature, as transformers' TemperatureLogitsWarper computes them.
    """
    scores = logits.float()
    if temperature != 1.0:
        quotient = scores / temperature
        if temperature < 1.0:  # only a temperature below 1 can overflow; chosen per row on the device, no sync
            overflow = (~torch.isfinite(quotient) & torch.isfinite(scores)).any(dim=-1, keepdim=True)
            broken = (torch.isnan(scores) | torch.isposinf(scores)).any(dim=-1, keepdim=True)  # left as they are
            shifted = (scores - scores.amax(dim=-1, keepdim=True)) / temperature
            quotient = torch.where(overflow & ~broken, shifted, quotient)
        scores = quotient
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
    return scores


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per distribution over the last dim, by the exponential race argmax(p / E), E ~ Exp(1): the
    same rule the rejection sampler uses for its resampled and bonus tokens. Zero-probability tokens never win."""
    noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(torch.float32).tiny)
    return (probs.float() / noise).argmax(dim=-1)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim; ties go to the lowest index, like sk.verify_greedy and transformers."""
    return logits.argmax(dim=-1)
