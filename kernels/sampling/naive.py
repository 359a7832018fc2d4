"""The sampling family's rules as naive per-row Python loops: the readable specification.

Slow on purpose (a Python loop over rows and slots, one scalar at a time), written straight from the contract
in DESIGN.md; reference.py is the vectorised form and the tests hold the two equal. Same signatures and results
as the public ops (no validation: pass valid arguments).
"""

from __future__ import annotations

import torch


def accept_lengths(matches: torch.Tensor, num_draft: torch.Tensor | None = None) -> torch.Tensor:
    """Leading True count of each row of matches bool[B, K], capped at num_draft[b]."""
    batch, k = matches.shape
    out = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        n = k if num_draft is None else int(num_draft[b])
        a = 0
        while a < n and bool(matches[b, a]):
            a += 1
        out[b] = a
    return out


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                  num_draft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b accepts drafts while they equal the target's argmax (ties: lowest index), then emits the argmax
    at the first mismatch (or the bonus slot); -1 after."""
    batch, k = draft_tokens.shape
    tokens = torch.full((batch, k + 1), -1, dtype=torch.int64)
    accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        n = k if num_draft is None else int(num_draft[b])
        a = 0
        while a < n and int(draft_tokens[b, a]) == int(target_logits[b, a].float().argmax()):
            a += 1
        tokens[b, :a] = draft_tokens[b, :a]
        tokens[b, a] = int(target_logits[b, a].float().argmax())
        accepted[b] = a
    return tokens, accepted


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     num_draft: torch.Tensor | None = None, *, uniform: torch.Tensor,
                     exponential: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft i (token d) is accepted iff uniform[b, i] * q < p in float32 (q = 1 without draft_probs); at the
    first rejection emit argmax r / exponential[b] with r = max(p - q, 0) (q one-hot(d) without draft_probs;
    p itself when r is all zero); after all n_b drafts emit the bonus argmax p / exponential[b]."""
    drafts, q, p = draft_tokens, draft_probs, target_probs.float()
    batch, k = drafts.shape
    vocab = p.shape[-1]
    tokens = torch.full((batch, k + 1), -1, dtype=torch.int64)
    accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        n = k if num_draft is None else int(num_draft[b])
        a = 0
        while a < n:
            d = int(drafts[b, a])
            qd = float(q[b, a, d].float()) if q is not None else 1.0
            if not uniform[b, a] * qd < p[b, a, d]:  # float32 tensor times an exact float32 value
                break
            a += 1
        if a < n:
            qrow = q[b, a].float() if q is not None else torch.nn.functional.one_hot(drafts[b, a], vocab).float()
            r = (p[b, a] - qrow).clamp_min(0)
            dist = r if bool((r > 0).any()) else p[b, a]
        else:
            dist = p[b, a]
        tokens[b, :a] = drafts[b, :a]
        tokens[b, a] = int((dist / exponential[b]).argmax())
        accepted[b] = a
    return tokens, accepted
