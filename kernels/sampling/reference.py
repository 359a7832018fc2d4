"""Vectorised PyTorch reference of the sampling family: the specification of accept_lengths, verify_greedy and
rejection_sample, and the "torch" backend.

Vectorised over rows (no Python loop over the batch), so it doubles as the honest no-custom-kernel baseline;
naive.py is the same rule as a readable per-row loop, and the tests hold the two equal. Signatures equal the
public ones in specdec_kernels; arguments are assumed validated (ops.py does that once for every backend).
Shapes: B rows, K draft slots, V vocabulary.
"""

from __future__ import annotations

import torch

from ..noise import draw_noise


def accept_lengths(matches: torch.Tensor, num_draft: torch.Tensor | None = None) -> torch.Tensor:
    """Leading True count of each row of matches bool[B, K], capped at num_draft int64[B] -> int64[B]."""
    ok = matches.bool()
    if num_draft is not None:
        slots = torch.arange(ok.shape[1], device=ok.device)
        ok = ok & (slots[None, :] < num_draft[:, None])
    return ok.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _layout(drafts: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """tokens int64[B, K+1]: the accepted drafts, then `last`, then -1."""
    batch, k = drafts.shape
    slots = torch.arange(k + 1, device=drafts.device)[None, :]
    a = num_accepted[:, None]
    padded = torch.cat([drafts.to(torch.int64), drafts.new_full((batch, 1), -1, dtype=torch.int64)], dim=1)
    return torch.where(slots < a, padded, torch.where(slots == a, last[:, None], torch.full_like(padded, -1)))


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                  num_draft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification. draft_tokens int64[B, K], target_logits float[B, K+1, V], num_draft int64[B]
    -> (tokens int64[B, K+1], num_accepted int64[B]). Ties in argmax go to the lowest index."""
    k = draft_tokens.shape[1]
    predicted = target_logits.argmax(dim=-1)  # torch.argmax returns the first maximal index
    num_accepted = accept_lengths(draft_tokens == predicted[:, :k], num_draft)
    last = predicted.gather(1, num_accepted[:, None]).squeeze(1)
    return _layout(draft_tokens, num_accepted, last), num_accepted


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     num_draft: torch.Tensor | None = None, *, uniform: torch.Tensor | None = None,
                     exponential: torch.Tensor | None = None,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling. draft_tokens int64[B, K], draft_probs float[B, K, V] or None
    (deterministic drafter), target_probs float[B, K+1, V], num_draft int64[B], uniform float32[B, K],
    exponential float32[B, V] -> (tokens int64[B, K+1], num_accepted int64[B]). See DESIGN.md for the rule."""
    batch, k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    if uniform is None or exponential is None:
        drawn_u, drawn_e = draw_noise(batch, k, vocab, target_probs.device, generator)
        uniform = drawn_u if uniform is None else uniform
        exponential = drawn_e if exponential is None else exponential
    p = target_probs.float()
    q = draft_probs.float() if draft_probs is not None else None

    # An id outside [0, V) (possible only with checks off) is never accepted and never read out of bounds.
    valid = (draft_tokens >= 0) & (draft_tokens < vocab)
    ids = draft_tokens.clamp(0, vocab - 1)
    p_draft = p[:, :k].gather(2, ids[:, :, None]).squeeze(2)
    q_draft = q.gather(2, ids[:, :, None]).squeeze(2) if q is not None else torch.ones_like(p_draft)
    num_accepted = accept_lengths(valid & (uniform.float() * q_draft < p_draft), num_draft)

    n = num_draft if num_draft is not None else torch.full_like(num_accepted, k)
    bonus = num_accepted == n
    p_row = p.gather(1, num_accepted[:, None, None].expand(batch, 1, vocab)).squeeze(1)  # [B, V]
    j = num_accepted.clamp(max=max(k - 1, 0))  # bonus rows read any valid draft slot; the result is unused
    if k == 0:
        q_row = torch.zeros_like(p_row)
    elif q is not None:
        q_row = q.gather(1, j[:, None, None].expand(batch, 1, vocab)).squeeze(1)
    else:
        d = draft_tokens.gather(1, j[:, None])  # one-hot of the draft; an invalid id matches nothing
        q_row = (torch.arange(vocab, device=p.device)[None, :] == d).float()
    residual = (p_row - q_row).clamp_min(0.0)
    use_residual = ~bonus & (residual > 0).any(dim=1)
    dist = torch.where(use_residual[:, None], residual, p_row)
    last = (dist / exponential.float()).argmax(dim=1)
    return _layout(draft_tokens, num_accepted, last), num_accepted
