"""Triton kernels of the sampling family, shaped for a GPU (the "triton" backend).

The work of a call is spread over many programs, then reduced per row:
- verify_greedy needs an argmax over V at every one of the K+1 positions of every row. Programs cover
  (row, position, vocab chunk) -- grid (B, K+1, SPLIT) -- and each writes a partial argmax of its chunk (value,
  index; a chunk holding a NaN writes NaN and its first NaN index); a second kernel, one program per row, merges
  the partials in chunk order (larger value wins, ties and NaN go to the lowest index: exactly torch.argmax)
  and applies the accept rule.
- rejection_sample needs one sweep per row only, over the row a_b of the first rejection (or the bonus slot).
  Spreading over positions as vLLM's recovered-token kernel does would read (K+1) times the bytes; the same
  parallelism comes from vocab chunks: grid (B, SPLIT), every program recomputes a_b (K gathers) and sweeps its
  chunk of row a_b (max(p - q, 0) / e and p / e, and whether the residual has mass); a second kernel merges.
When the batch alone fills the GPU (B >= PROGRAMS) or the vocabulary is one chunk, one program per row does the
whole row and writes the tokens itself: no partials, one launch (that is also the interpreter's default, which
keeps CPU test grids small; tests set PROGRAMS and MIN_CHUNK to run the split paths).

Results equal reference.py bit for bit: argmax follows torch (first NaN, else first maximum; -0.0 == 0.0),
probabilities are compared in float32 and divided with correctly rounded div_rn (`/` is approximate on GPU),
float64 logits compare in float64. Arguments arrive validated (ops.py); with value checks off, an invalid draft
id is masked, never read, and no emitted id leaves [0, V). Plain pointer arithmetic only (Triton 3.x).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..outputs import new_int64
from ..triton_utils import next_pow2, prev_pow2, row_blocks

_BIG = tl.constexpr(2147483647)  # index sentinel, above any vocabulary index

# Programs a launch aims at: None = 4 per SM on CUDA, 1 under the interpreter (one program per row, no split).
PROGRAMS: int | None = None
# Fewest vocabulary elements one program sweeps (below this a program's setup outweighs its loop).
MIN_CHUNK = 2048
# Widest vocab block of a split program's loop (a 1-D tile; 1024 x 4 bytes is 8 registers per thread at 4 warps).
SPLIT_BLOCK = 1024


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _target_programs(device: torch.device) -> int:
    if PROGRAMS is not None:
        return PROGRAMS
    if device.type != "cuda":
        return 1
    return 4 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _vocab_split(rows: int, vocab: int, target: int) -> tuple[int, int, int]:
    """(SPLIT chunks, CHUNK elements each, BLOCK_V) so that rows * SPLIT reaches `target` programs where the
    vocabulary allows it; CHUNK is a multiple of BLOCK_V."""
    split = max(1, min(triton.cdiv(target, rows), triton.cdiv(vocab, MIN_CHUNK)))
    desired = triton.cdiv(vocab, split)
    block = min(SPLIT_BLOCK, max(16, prev_pow2(desired)), row_blocks(1, desired)[0])
    chunk = triton.cdiv(desired, block) * block
    return triton.cdiv(vocab, chunk), chunk, block


def _warps(tile: int) -> int:
    return 8 if tile >= 8192 else 4 if tile >= 1024 else 2 if tile >= 256 else 1


@triton.jit
def _argmax_step(x, idx, best, best_idx, nan_idx, AXIS: tl.constexpr):
    """Fold one block into a running torch-style argmax along AXIS. Lanes outside the row must hold -inf in x
    and an index above every real one in idx; the first NaN is tracked apart and wins at the end."""
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
def _write_tokens(tokens_ptr, b, slots, K, drafts, a, last):
    """tokens[b, :a] = drafts, tokens[b, a] = last, tokens[b, a+1:K+1] = -1."""
    out = tl.where(slots < a, drafts, tl.where(slots == a, last.to(tl.int64), -1))
    tl.store(tokens_ptr + b * (K + 1) + slots, out, mask=slots < K + 1)


# ------------------------------------------------------------------------------------------ accept_lengths

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
    """matches bool[B, K], num_draft int64[B] or None -> int64[B]: leading True count, capped at num_draft.
    One program per row: K is a handful of slots, there is nothing to spread."""
    batch, k = matches.shape
    out = new_int64(batch, device=matches.device)
    if batch == 0:
        return out
    m = matches.view(torch.int8)
    block, warps = row_blocks(1, k)
    _accept_lengths_kernel[(batch,)](
        m, num_draft if num_draft is not None else out, out, k, m.stride(0), m.stride(1),
        num_draft.stride(0) if num_draft is not None else 0,
        HAS_NUM_DRAFT=num_draft is not None, BLOCK_K=block, num_warps=warps)
    return out


# ------------------------------------------------------------------------------------------- verify_greedy

@triton.jit
def _greedy_accept(draft_ptr, num_draft_ptr, tokens_ptr, accepted_ptr, b, slots, pred, K, V, s_db, s_dk, s_n,
                   HAS_NUM_DRAFT: tl.constexpr, KP: tl.constexpr):
    """From the K+1 argmaxes of row b: the accepted count a and the row of tokens."""
    pred = tl.minimum(tl.maximum(pred, 0), V - 1).to(tl.int64)
    drafts = tl.load(draft_ptr + b * s_db + slots * s_dk, mask=slots < K, other=-1)
    match = (drafts == pred) & (slots < K)
    if HAS_NUM_DRAFT:
        match = match & (slots < tl.load(num_draft_ptr + b * s_n))
    a = tl.min(tl.where(match, KP, slots), axis=0)  # slot K never matches, so a <= K
    last = tl.sum(tl.where(slots == a, pred, 0), axis=0)
    _write_tokens(tokens_ptr, b, slots, K, drafts, a, last)
    tl.store(accepted_ptr + b, a.to(tl.int64))


@triton.jit
def _verify_sweep_kernel(draft_ptr, logits_ptr, num_draft_ptr, tokens_ptr, accepted_ptr, val_ptr, idx_ptr,
                         K, V, CHUNK, SPLIT, s_db, s_dk, s_lb, s_lk, s_lv, s_n,
                         HAS_NUM_DRAFT: tl.constexpr, CDT: tl.constexpr, POS: tl.constexpr, KP: tl.constexpr,
                         BLOCK_V: tl.constexpr, FINISH: tl.constexpr):
    """Program (b, position block, vocab chunk): the argmax of POS rows of target_logits[b] over one chunk.
    FINISH (one program per row: POS covers all K+1 positions, one chunk): apply the accept rule and write the
    tokens. Else: write the partials for _verify_finish_kernel."""
    b = tl.program_id(0).to(tl.int64)
    pos = tl.program_id(1).to(tl.int64) * POS + tl.arange(0, POS).to(tl.int64)
    c = tl.program_id(2).to(tl.int64)
    in_rows = pos < K + 1
    row = logits_ptr + b * s_lb + pos[:, None] * s_lk  # [POS, 1]
    best = tl.full([POS], float("-inf"), CDT)
    best_idx = tl.zeros([POS], tl.int32)
    nan_idx = tl.full([POS], _BIG, tl.int32)
    v_lo = c * CHUNK
    v_hi = tl.minimum(v_lo + CHUNK, V)
    for v0 in range(0, CHUNK, BLOCK_V):
        cols = v_lo + v0 + tl.arange(0, BLOCK_V)
        mask = in_rows[:, None] & (cols[None, :] < v_hi)
        x = tl.load(row + cols[None, :] * s_lv, mask=mask, other=float("-inf")).to(CDT)
        best, best_idx, nan_idx = _argmax_step(x, tl.where(mask, cols[None, :], _BIG).to(tl.int32), best,
                                               best_idx, nan_idx, 1)
    if FINISH:
        pred = tl.where(nan_idx < _BIG, nan_idx, best_idx)
        _greedy_accept(draft_ptr, num_draft_ptr, tokens_ptr, accepted_ptr, b, pos, pred, K, V, s_db, s_dk, s_n,
                       HAS_NUM_DRAFT, KP)
    else:
        has_nan = nan_idx < _BIG
        at = (b * (K + 1) + pos) * SPLIT + c
        tl.store(val_ptr + at, tl.where(has_nan, float("nan"), best).to(CDT), mask=in_rows)
        tl.store(idx_ptr + at, tl.where(has_nan, nan_idx, best_idx), mask=in_rows)


@triton.jit
def _verify_finish_kernel(draft_ptr, num_draft_ptr, tokens_ptr, accepted_ptr, val_ptr, idx_ptr, K, V, SPLIT,
                          s_db, s_dk, s_n, HAS_NUM_DRAFT: tl.constexpr, CDT: tl.constexpr, KP: tl.constexpr,
                          BLOCK_S: tl.constexpr):
    """One program per row: merge the SPLIT partial argmaxes of each position in chunk order, then accept."""
    b = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, KP).to(tl.int64)
    in_rows = slots < K + 1
    base = (b * (K + 1) + slots[:, None]) * SPLIT
    best = tl.full([KP], float("-inf"), CDT)
    best_idx = tl.zeros([KP], tl.int32)
    nan_idx = tl.full([KP], _BIG, tl.int32)
    for s0 in range(0, SPLIT, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        mask = in_rows[:, None] & (ss[None, :] < SPLIT)
        x = tl.load(val_ptr + base + ss[None, :], mask=mask, other=float("-inf"))
        ix = tl.load(idx_ptr + base + ss[None, :], mask=mask, other=_BIG)
        best, best_idx, nan_idx = _argmax_step(x, ix, best, best_idx, nan_idx, 1)
    pred = tl.where(nan_idx < _BIG, nan_idx, best_idx)
    _greedy_accept(draft_ptr, num_draft_ptr, tokens_ptr, accepted_ptr, b, slots, pred, K, V, s_db, s_dk, s_n,
                   HAS_NUM_DRAFT, KP)


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
    cdt = tl.float64 if target_logits.dtype == torch.float64 else tl.float32
    nd = num_draft if num_draft is not None else accepted
    s_n = num_draft.stride(0) if num_draft is not None else 0
    common = (k, vocab)
    strides = (draft_tokens.stride(0), draft_tokens.stride(1), *target_logits.stride(), s_n)
    target = _target_programs(target_logits.device)
    split, chunk, block = _vocab_split(batch * (k + 1), vocab, target)
    if batch >= target or (split == 1 and k == 0):  # one program per row does it all
        block, warps = row_blocks(kp, vocab)
        _verify_sweep_kernel[(batch, 1, 1)](
            draft_tokens, target_logits, nd, tokens, accepted, tokens, accepted, *common, vocab, 1, *strides,
            HAS_NUM_DRAFT=num_draft is not None, CDT=cdt, POS=kp, KP=kp, BLOCK_V=block, FINISH=True,
            num_warps=warps)
        return tokens, accepted
    rows = batch * (k + 1) * split
    vals = torch.empty(rows, dtype=torch.float64 if cdt == tl.float64 else torch.float32,
                       device=target_logits.device)
    idxs = torch.empty(rows, dtype=torch.int32, device=target_logits.device)
    _verify_sweep_kernel[(batch, k + 1, split)](
        draft_tokens, target_logits, nd, tokens, accepted, vals, idxs, *common, chunk, split, *strides,
        HAS_NUM_DRAFT=num_draft is not None, CDT=cdt, POS=1, KP=kp, BLOCK_V=block, FINISH=False,
        num_warps=_warps(block))
    block_s = min(next_pow2(split), max(1, 1024 // kp))
    _verify_finish_kernel[(batch,)](
        draft_tokens, nd, tokens, accepted, vals, idxs, *common, split, draft_tokens.stride(0),
        draft_tokens.stride(1), s_n, HAS_NUM_DRAFT=num_draft is not None, CDT=cdt, KP=kp, BLOCK_S=block_s,
        num_warps=_warps(kp * block_s))
    return tokens, accepted


# ---------------------------------------------------------------------------------------- rejection_sample

@triton.jit
def _accept_row(draft_ptr, q_ptr, p_ptr, num_draft_ptr, u_ptr, b, slots, K, V, s_db, s_dk, s_qb, s_qk, s_qv,
                s_pb, s_pk, s_pv, s_ub, s_uk, s_n, HAS_Q: tl.constexpr, HAS_NUM_DRAFT: tl.constexpr,
                KP: tl.constexpr):
    """Row b's accept decisions: (drafts, a = first rejection, bonus, j = the slot whose q forms the residual,
    d_j = its draft id). Draft i is accepted iff u * q < p in float32 (strict); q = 1 without draft_probs."""
    in_k = slots < K
    drafts = tl.load(draft_ptr + b * s_db + slots * s_dk, mask=in_k, other=-1)
    valid = in_k & (drafts >= 0) & (drafts < V)  # an invalid id is never accepted, never read
    ids = tl.minimum(tl.maximum(drafts, 0), V - 1)
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
    return drafts, a, bonus, j, d_j, n


@triton.jit
def _choose(bonus, any_pos, best_r, idx_r, nan_r, idx_p, nan_p, V):
    """The emitted token: argmax of r / e where the residual has mass (and the row was rejected), else of p / e;
    clamped into [0, V) so no id outside it is ever emitted, even from NaN."""
    arg_r = tl.where(nan_r < _BIG, nan_r, idx_r)
    arg_p = tl.where(nan_p < _BIG, nan_p, idx_p)
    use_r = tl.where(bonus, 0, any_pos) > 0
    last = tl.sum(tl.where(use_r, arg_r, arg_p), axis=0)
    return tl.minimum(tl.maximum(last, 0), V - 1)


@triton.jit
def _rejection_sweep_kernel(draft_ptr, q_ptr, p_ptr, num_draft_ptr, u_ptr, e_ptr, tokens_ptr, accepted_ptr,
                            val_ptr, idx_ptr, K, V, CHUNK, SPLIT, s_db, s_dk, s_qb, s_qk, s_qv, s_pb, s_pk, s_pv,
                            s_ub, s_uk, s_eb, s_ev, s_n, HAS_Q: tl.constexpr, HAS_NUM_DRAFT: tl.constexpr,
                            KP: tl.constexpr, BLOCK_V: tl.constexpr, FINISH: tl.constexpr):
    """Program (b, vocab chunk c): row b's accept decisions, then one sweep over chunk c of row a of p (and row j
    of q): the argmax of r / e and of p / e, and whether any r > 0. FINISH (one chunk): write the tokens; else
    write the partials for _rejection_finish_kernel."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    slots = tl.arange(0, KP).to(tl.int64)
    drafts, a, bonus, j, d_j, n = _accept_row(draft_ptr, q_ptr, p_ptr, num_draft_ptr, u_ptr, b, slots, K, V,
                                              s_db, s_dk, s_qb, s_qk, s_qv, s_pb, s_pk, s_pv, s_ub, s_uk, s_n,
                                              HAS_Q, HAS_NUM_DRAFT, KP)
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
    v_lo = c * CHUNK
    v_hi = tl.minimum(v_lo + CHUNK, V)
    for v0 in range(0, CHUNK, BLOCK_V):
        cols = v_lo + v0 + tl.arange(0, BLOCK_V)
        vmask = cols < v_hi
        p = tl.load(p_row + cols * s_pv, mask=vmask, other=0).to(tl.float32)
        e = tl.load(e_row + cols * s_ev, mask=vmask, other=1).to(tl.float32)
        if HAS_Q:
            q = tl.load(q_row + cols * s_qv, mask=vmask & (cols < q_lim), other=0).to(tl.float32)
        else:
            q = tl.where((cols == d_j) & (cols < q_lim), 1.0, 0.0)
        diff = p - q
        r = tl.where(diff < 0, 0.0, diff)  # clamp_min(0) keeping NaN, like torch
        any_pos = tl.maximum(any_pos, tl.max(tl.where(vmask & (r > 0), 1, 0), axis=0))
        idx = tl.where(vmask, cols, _BIG).to(tl.int32)[None, :]
        score_r = tl.where(vmask, tl.div_rn(r, e), float("-inf"))[None, :]
        score_p = tl.where(vmask, tl.div_rn(p, e), float("-inf"))[None, :]
        best_r, idx_r, nan_r = _argmax_step(score_r, idx, best_r, idx_r, nan_r, 1)
        best_p, idx_p, nan_p = _argmax_step(score_p, idx, best_p, idx_p, nan_p, 1)
    if FINISH:
        last = _choose(bonus, any_pos, best_r, idx_r, nan_r, idx_p, nan_p, V)
        _write_tokens(tokens_ptr, b, slots, K, drafts, a, last)
        tl.store(accepted_ptr + b, a.to(tl.int64))
    else:
        one = tl.arange(0, 1)
        at = (b * SPLIT + c) * 2
        tl.store(val_ptr + at + one, tl.where(nan_r < _BIG, float("nan"), best_r))
        tl.store(val_ptr + at + 1 + one, tl.where(nan_p < _BIG, float("nan"), best_p))
        at = (b * SPLIT + c) * 3
        tl.store(idx_ptr + at + one, tl.where(nan_r < _BIG, nan_r, idx_r))
        tl.store(idx_ptr + at + 1 + one, tl.where(nan_p < _BIG, nan_p, idx_p))
        tl.store(idx_ptr + at + 2 + one, any_pos)


@triton.jit
def _rejection_finish_kernel(draft_ptr, q_ptr, p_ptr, num_draft_ptr, u_ptr, tokens_ptr, accepted_ptr, val_ptr,
                             idx_ptr, K, V, SPLIT, s_db, s_dk, s_qb, s_qk, s_qv, s_pb, s_pk, s_pv, s_ub, s_uk, s_n,
                             HAS_Q: tl.constexpr, HAS_NUM_DRAFT: tl.constexpr, KP: tl.constexpr,
                             BLOCK_S: tl.constexpr):
    """One program per row: the accept decisions again (cheap), then the partials merged in chunk order."""
    b = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, KP).to(tl.int64)
    drafts, a, bonus, j, d_j, n = _accept_row(draft_ptr, q_ptr, p_ptr, num_draft_ptr, u_ptr, b, slots, K, V,
                                              s_db, s_dk, s_qb, s_qk, s_qv, s_pb, s_pk, s_pv, s_ub, s_uk, s_n,
                                              HAS_Q, HAS_NUM_DRAFT, KP)
    best_r = tl.full([1], float("-inf"), tl.float32)
    best_p = tl.full([1], float("-inf"), tl.float32)
    idx_r = tl.zeros([1], tl.int32)
    idx_p = tl.zeros([1], tl.int32)
    nan_r = tl.full([1], _BIG, tl.int32)
    nan_p = tl.full([1], _BIG, tl.int32)
    any_pos = tl.zeros([1], tl.int32)
    for s0 in range(0, SPLIT, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < SPLIT
        at_v = (b * SPLIT + ss) * 2
        at_i = (b * SPLIT + ss) * 3
        vr = tl.load(val_ptr + at_v, mask=smask, other=float("-inf"))[None, :]
        vp = tl.load(val_ptr + at_v + 1, mask=smask, other=float("-inf"))[None, :]
        ir = tl.load(idx_ptr + at_i, mask=smask, other=_BIG)[None, :]
        ip = tl.load(idx_ptr + at_i + 1, mask=smask, other=_BIG)[None, :]
        pos = tl.load(idx_ptr + at_i + 2, mask=smask, other=0)
        any_pos = tl.maximum(any_pos, tl.max(pos, axis=0))
        best_r, idx_r, nan_r = _argmax_step(vr, ir, best_r, idx_r, nan_r, 1)
        best_p, idx_p, nan_p = _argmax_step(vp, ip, best_p, idx_p, nan_p, 1)
    last = _choose(bonus, any_pos, best_r, idx_r, nan_r, idx_p, nan_p, V)
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
    kp = next_pow2(k + 1)
    q = draft_probs if draft_probs is not None else target_probs
    q_strides = draft_probs.stride() if draft_probs is not None else (0, 0, 0)
    nd = num_draft if num_draft is not None else accepted
    s_n = num_draft.stride(0) if num_draft is not None else 0
    head = (draft_tokens.stride(0), draft_tokens.stride(1), *q_strides, *target_probs.stride(),
            *uniform.stride())
    flags = dict(HAS_Q=draft_probs is not None, HAS_NUM_DRAFT=num_draft is not None, KP=kp)
    target = _target_programs(target_probs.device)
    split, chunk, block = _vocab_split(batch, vocab, target)
    if batch >= target or split == 1:  # one program per row does it all
        block, warps = row_blocks(1, vocab, arrays=4)
        _rejection_sweep_kernel[(batch, 1)](
            draft_tokens, q, target_probs, nd, uniform, exponential, tokens, accepted, tokens, accepted, k, vocab,
            vocab, 1, *head, *exponential.stride(), s_n, **flags, BLOCK_V=block, FINISH=True, num_warps=warps)
        return tokens, accepted
    vals = torch.empty(batch * split * 2, dtype=torch.float32, device=target_probs.device)
    idxs = torch.empty(batch * split * 3, dtype=torch.int32, device=target_probs.device)
    _rejection_sweep_kernel[(batch, split)](
        draft_tokens, q, target_probs, nd, uniform, exponential, tokens, accepted, vals, idxs, k, vocab, chunk,
        split, *head, *exponential.stride(), s_n, **flags, BLOCK_V=block, FINISH=False,
        num_warps=_warps(4 * block))
    block_s = min(next_pow2(split), 1024)
    _rejection_finish_kernel[(batch,)](
        draft_tokens, q, target_probs, nd, uniform, tokens, accepted, vals, idxs, k, vocab, split, *head, s_n,
        **flags, BLOCK_S=block_s, num_warps=_warps(block_s))
    return tokens, accepted
