"""The previous Triton sampling kernels, one program per row: kept so bench/gpu_check can time them against the
GPU-shaped kernels of triton_kernels.py (which the "triton" backend runs). Not used by the ops.

One program per row b, sweeping (K+1) x V serially. Results must equal reference.py bit for bit, so:
- argmax follows torch: the first NaN wins, else the first maximal value (-0.0 == 0.0; all -inf gives 0);
- probabilities are compared in float32 and divided with correctly rounded `div_rn` (`/` is approximate on GPU);
- verify_greedy compares float64 logits in float64 (float16/bfloat16 -> float32 is exact, float64 -> float32
  is not and could create ties the reference does not see).
Arguments are validated by ops.py; with value checks off, invalid draft ids are masked, never read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..outputs import new_int64
from ..triton_utils import next_pow2, row_blocks

_BIG = tl.constexpr(2147483647)  # index sentinel, above any vocabulary index


@triton.jit
def _argmax_step(x, idx, best, best_idx, nan_idx, AXIS: tl.constexpr):
    """Fold one block into a running torch-style argmax along AXIS. Lanes outside the row must hold -inf in x
    and an index above every real one in idx; first NaN is tracked apart and wins at the end."""
    isnan = x != x
    xm = tl.where(isnan, float("-inf"), x)
    bm = tl.max(xm, axis=AXIS)
    bi = tl.min(tl.where(xm == tl.expand_dims(bm, AXIS), idx, _BIG), axis=AXIS)
    upd = bm > best  # strict: an equal later block keeps the earlier index
    best = tl.where(upd, bm, best)
    best_idx = tl.where(upd, bi, best_idx)
    nan_idx = tl.minimum(nan_idx, tl.min(tl.where(isnan, idx, _BIG), axis=AXIS))
    return best, best_idx, nan_idx


@triton.jit
def _accept_lengths_kernel(matches_ptr, num_draft_ptr, out_ptr, K, s_mb, s_mk, s_n,
                           HAS_NUM_DRAFT: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    first_false = K + 0 * b  # int64 like b
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        m = tl.load(matches_ptr + b * s_mb + ks * s_mk, mask=ks < K, other=1)
        first_false = tl.minimum(first_false, tl.min(tl.where(m == 0, ks, _BIG), axis=0))
    if HAS_NUM_DRAFT:
        first_false = tl.minimum(first_false, tl.maximum(tl.load(num_draft_ptr + b * s_n), 0))
    tl.store(out_ptr + b, first_false.to(tl.int64))


def accept_lengths(matches: torch.Tensor, num_draft: torch.Tensor | None = None) -> torch.Tensor:
    """matches bool[B, K], num_draft int64[B] or None -> int64[B]: leading True count, capped at num_draft."""
    batch, k = matches.shape
    out = new_int64(batch, device=matches.device)
    if batch == 0:
        return out
    m = matches.view(torch.int8)
    block, warps = row_blocks(1, k)
    _accept_lengths_kernel[(batch,)](
        m, num_draft if num_draft is not None else out, out, k, m.stride(0), m.stride(1),
        num_draft.stride(0) if num_draft is not None else 0, HAS_NUM_DRAFT=num_draft is not None, BLOCK_K=block, num_warps=warps)
    return out


@triton.jit
def _write_tokens(tokens_ptr, b, slots, K, drafts, a, last):
    """tokens[b, :a] = drafts, tokens[b, a] = last, tokens[b, a+1:K+1] = -1."""
    out = tl.where(slots < a, drafts, tl.where(slots == a, last.to(tl.int64), -1))
    tl.store(tokens_ptr + b * (K + 1) + slots, out, mask=slots < K + 1)


@triton.jit
def _verify_greedy_kernel(draft_ptr, logits_ptr, num_draft_ptr, tokens_ptr, accepted_ptr, K, V,
                          s_db, s_dk, s_lb, s_lk, s_lv, s_n, HAS_NUM_DRAFT: tl.constexpr, CDT: tl.constexpr,
                          KP: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, KP).to(tl.int64)
    row = logits_ptr + b * s_lb + slots[:, None] * s_lk  # [KP, 1]: the K+1 target rows of b
    in_rows = slots[:, None] < K + 1
    best = tl.full([KP], float("-inf"), CDT)
    best_idx = tl.zeros([KP], tl.int32)
    nan_idx = tl.full([KP], _BIG, tl.int32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = in_rows & (cols[None, :] < V)
        x = tl.load(row + cols[None, :] * s_lv, mask=mask, other=float("-inf")).to(CDT)
        best, best_idx, nan_idx = _argmax_step(x, tl.where(mask, cols[None, :], _BIG), best, best_idx,
                                               nan_idx, 1)
    pred = tl.where(nan_idx < _BIG, nan_idx, best_idx)
    pred = tl.minimum(tl.maximum(pred, 0), V - 1).to(tl.int64)
    drafts = tl.load(draft_ptr + b * s_db + slots * s_dk, mask=slots < K, other=-1)
    match = (drafts == pred) & (slots < K)
    if HAS_NUM_DRAFT:
        match = match & (slots < tl.load(num_draft_ptr + b * s_n))
    a = tl.min(tl.where(match, KP, slots), axis=0)  # slot K never matches, so a <= K
    last = tl.sum(tl.where(slots == a, pred, 0), axis=0)
    _write_tokens(tokens_ptr, b, slots, K, drafts, a, last)
    tl.store(accepted_ptr + b, a.to(tl.int64))


def _row_outputs(draft_tokens: torch.Tensor, scores: torch.Tensor):
    """B, K, V and the two outputs every sampling launcher fills: tokens int64[B, K+1], num_accepted int64[B]."""
    batch, k = draft_tokens.shape
    dev = scores.device
    return batch, k, scores.shape[2], new_int64(batch, k + 1, device=dev), new_int64(batch, device=dev)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                  num_draft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens int64[B, K], target_logits float[B, K+1, V], num_draft int64[B] or None
    -> (tokens int64[B, K+1], num_accepted int64[B])."""
    batch, k, vocab, tokens, accepted = _row_outputs(draft_tokens, target_logits)
    if batch == 0:
        return tokens, accepted
    kp = next_pow2(k + 1)
    block, warps = row_blocks(kp, vocab)
    cdt = tl.float64 if target_logits.dtype == torch.float64 else tl.float32
    _verify_greedy_kernel[(batch,)](
        draft_tokens, target_logits, num_draft if num_draft is not None else accepted, tokens, accepted,
        k, vocab, draft_tokens.stride(0), draft_tokens.stride(1), *target_logits.stride(),
        num_draft.stride(0) if num_draft is not None else 0, HAS_NUM_DRAFT=num_draft is not None, CDT=cdt, KP=kp, BLOCK_V=block, num_warps=warps)
    return tokens, accepted


@triton.jit
def _rejection_sample_kernel(draft_ptr, q_ptr, p_ptr, num_draft_ptr, u_ptr, e_ptr, tokens_ptr, accepted_ptr,
                             K, V, s_db, s_dk, s_qb, s_qk, s_qv, s_pb, s_pk, s_pv, s_ub, s_uk, s_eb, s_ev, s_n,
                             HAS_Q: tl.constexpr, HAS_NUM_DRAFT: tl.constexpr, KP: tl.constexpr,
                             BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, KP).to(tl.int64)
    in_k = slots < K
    drafts = tl.load(draft_ptr + b * s_db + slots * s_dk, mask=in_k, other=-1)
    valid = in_k & (drafts >= 0) & (drafts < V)  # an invalid id is never accepted, never read
    ids = tl.minimum(tl.maximum(drafts, 0), V - 1)

    # Acceptance of every slot in float32: u * q < p (strict); q = 1 for a deterministic drafter.
    p_d = tl.load(p_ptr + b * s_pb + slots * s_pk + ids * s_pv, mask=valid, other=0).to(tl.float32)
    u = tl.load(u_ptr + b * s_ub + slots * s_uk, mask=in_k, other=0).to(tl.float32)
    if HAS_Q:
        q_d = tl.load(q_ptr + b * s_qb + slots * s_qk + ids * s_qv, mask=valid, other=0).to(tl.float32)
        ok = valid & (u * q_d < p_d)
    else:
        ok = valid & (u < p_d)
    if HAS_NUM_DRAFT:
        n = tl.load(num_draft_ptr + b * s_n)
    else:
        n = K + 0 * b
    ok = ok & (slots < n)
    a = tl.min(tl.where(ok, KP, slots), axis=0)  # first rejection; slot K is never ok, so a <= K
    bonus = a == n
    j = tl.minimum(a, tl.maximum(K - 1, 0))  # the draft slot whose q forms the residual (unused if bonus)
    d_j = tl.sum(tl.where(slots == j, drafts, 0), axis=0)  # -1 when K == 0: the one-hot matches nothing

    # One sweep over row a of p (and row j of q): argmax of r / e and of p / e, and whether any r > 0.
    p_row = p_ptr + b * s_pb + a * s_pk
    q_row = q_ptr + b * s_qb + j * s_qk
    e_row = e_ptr + b * s_eb
    # q is read only for a rejected row with K > 0 (not for a bonus row); a limit on cols, not a scalar & vector
    q_lim = tl.where((a != n) & (j < K), V, 0)
    best_r = tl.full([1], float("-inf"), tl.float32)
    best_p = tl.full([1], float("-inf"), tl.float32)
    idx_r = tl.zeros([1], tl.int32)
    idx_p = tl.zeros([1], tl.int32)
    nan_r = tl.full([1], _BIG, tl.int32)
    nan_p = tl.full([1], _BIG, tl.int32)
    any_pos = tl.zeros([1], tl.int32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        vmask = cols < V
        p = tl.load(p_row + cols * s_pv, mask=vmask, other=0).to(tl.float32)
        e = tl.load(e_row + cols * s_ev, mask=vmask, other=1).to(tl.float32)
        if HAS_Q:
            q = tl.load(q_row + cols * s_qv, mask=cols < q_lim, other=0).to(tl.float32)
        else:
            q = tl.where((cols == d_j) & (cols < q_lim), 1.0, 0.0)
        diff = p - q
        r = tl.where(diff < 0, 0.0, diff)  # clamp_min(0) keeping NaN, like torch
        any_pos = tl.maximum(any_pos, tl.max(tl.where(vmask & (r > 0), 1, 0), axis=0))
        idx = tl.where(vmask, cols, _BIG)[None, :]
        score_r = tl.where(vmask, tl.div_rn(r, e), float("-inf"))[None, :]
        score_p = tl.where(vmask, tl.div_rn(p, e), float("-inf"))[None, :]
        best_r, idx_r, nan_r = _argmax_step(score_r, idx, best_r, idx_r, nan_r, 1)
        best_p, idx_p, nan_p = _argmax_step(score_p, idx, best_p, idx_p, nan_p, 1)
    arg_r = tl.where(nan_r < _BIG, nan_r, idx_r)
    arg_p = tl.where(nan_p < _BIG, nan_p, idx_p)
    use_r = tl.where(bonus, 0, any_pos) > 0
    last = tl.sum(tl.where(use_r, arg_r, arg_p), axis=0)
    last = tl.minimum(tl.maximum(last, 0), V - 1)  # never emit an id outside [0, V), even from NaN
    _write_tokens(tokens_ptr, b, slots, K, drafts, a, last)
    tl.store(accepted_ptr + b, a.to(tl.int64))


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     num_draft: torch.Tensor | None, uniform: torch.Tensor,
                     exponential: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens int64[B, K], draft_probs float[B, K, V] or None, target_probs float[B, K+1, V],
    num_draft int64[B] or None, uniform float32[B, K], exponential float32[B, V]
    -> (tokens int64[B, K+1], num_accepted int64[B])."""
    batch, k, vocab, tokens, accepted = _row_outputs(draft_tokens, target_probs)
    if batch == 0:
        return tokens, accepted
    block, warps = row_blocks(1, vocab, arrays=4)
    q = draft_probs if draft_probs is not None else target_probs
    q_strides = draft_probs.stride() if draft_probs is not None else (0, 0, 0)
    _rejection_sample_kernel[(batch,)](
        draft_tokens, q, target_probs, num_draft if num_draft is not None else accepted, uniform, exponential,
        tokens, accepted, k, vocab, draft_tokens.stride(0), draft_tokens.stride(1), *q_strides,
        *target_probs.stride(), *uniform.stride(), *exponential.stride(),
        num_draft.stride(0) if num_draft is not None else 0, HAS_Q=draft_probs is not None, HAS_NUM_DRAFT=num_draft is not None, KP=next_pow2(k + 1),
        BLOCK_V=block, num_warps=warps)
    return tokens, accepted
