"""The public ops: validate once, draw noise once, resolve the backend, call the op.

Every call goes through the op's torch.library op (library.py: specdec_kernels::*), eager included, so eager,
torch.compile, torch.library.opcheck and the profiler all see one path. The backend chosen for a call travels
outside the op's schema, in a context variable the op's kernel reads (backend.kernel_backend).

Under torch.compile the op is traced through its fake implementation and the kernel picks the backend when the
compiled graph runs: select it with sk.set_backend / sk.use_backend around the compiled call; a per-call
backend= that would pick a different one cannot travel into the graph and is refused.

Shapes: B rows, K draft slots, V vocabulary, T positions; token ids are int64.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import backend as _backend
from . import library as _library
from .checks import (FLOAT_DTYPES, ValueChecks, check_generator, check_inplace, check_num_draft, cut_history,
                     describe, expect_device, expect_shape, expect_supported_device, expect_tensor,
                     value_checks_enabled)
from .noise import draw_noise

TensorOrList = torch.Tensor | Sequence[torch.Tensor]


def _compiling() -> bool:
    return torch.compiler.is_compiling()


@torch._dynamo.assume_constant_result
def _compiled_backend_conflict(backend: str, device_type: str) -> str:
    """'' if backend= names the backend a compiled graph will run (the process-wide choice), else why not."""
    device = torch.device(device_type)
    want, runtime = _backend.resolve(backend, device), _backend.resolve(None, device)
    if want == runtime:
        return ""
    return (f"backend={backend!r} would run {want!r}, but a compiled graph runs the process-wide choice "
            f"({runtime!r}); the per-call override cannot travel into the graph: select the backend with "
            f"sk.use_backend({want!r}) or sk.set_backend around the compiled call")


def _resolve(backend: str | None, device: torch.device) -> str | None:
    """The backend for this call (None under torch.compile, where the kernel resolves it when the graph runs)."""
    if _compiling():
        if backend is not None:
            conflict = _compiled_backend_conflict(backend, device.type)
            if conflict:
                raise RuntimeError(conflict)
        return None
    return _backend.resolve(backend, device)


def _run(op, name: str | None, *args):
    """Call the library op with backend `name` chosen for this call."""
    if name is None:
        return op(*args)
    token = _backend.call_backend.set(name)
    try:
        return op(*args)
    finally:
        _backend.call_backend.reset(token)


# ------------------------------------------------------------------------------------------------ public ops

def accept_lengths(matches: torch.Tensor, num_draft: torch.Tensor | None = None, *,
                   backend: str | None = None, check_values: bool | None = None) -> torch.Tensor:
    """Accepted length of each row: the count of leading True values, capped at num_draft.

    Args:
        matches: bool[B, K], whether draft i of row b was accepted on its own.
        num_draft: optional int64[B], each in 0..K: row b has only its first num_draft[b] drafts.
        backend: "torch" | "cpp" | "triton" | "auto" for this call; default: the process-wide choice.
        check_values: None (default): the SPECDEC_CHECKS setting; False: skip the checks that read tensor
            values (each costs a host sync on a GPU); the structural checks always run.
    Returns:
        int64[B].
    """
    expect_tensor("matches", matches, ndim=2, dtypes=(torch.bool,))
    expect_supported_device("matches", matches)
    batch, k = matches.shape
    check_num_draft(num_draft, batch, k, matches.device, "matches")
    if value_checks_enabled(check_values):
        checks = ValueChecks()
        checks.add_num_draft(num_draft, k)
        checks.raise_first()
    return _run(_library.accept_lengths, _resolve(backend, matches.device), matches, num_draft)


def _check_drafts(draft_tokens, scores: torch.Tensor, scores_name: str, num_draft):
    expect_tensor("draft_tokens", draft_tokens, ndim=2, dtypes=(torch.int64,))
    expect_tensor(scores_name, scores, ndim=3, dtypes=FLOAT_DTYPES)
    expect_supported_device(scores_name, scores)
    batch, k = draft_tokens.shape
    if scores.shape[0] != batch or scores.shape[1] != k + 1:
        raise ValueError(f"{scores_name} must have shape (B, K+1, V) = ({batch}, {k + 1}, V) to match "
                         f"draft_tokens {tuple(draft_tokens.shape)}, got {describe(scores)}")
    if scores.shape[2] < 1:
        raise ValueError(f"{scores_name} needs a vocabulary of at least 1, got {describe(scores)}")
    expect_device("draft_tokens", draft_tokens, scores.device, scores_name)
    check_num_draft(num_draft, batch, k, scores.device, scores_name)
    return batch, k, scores.shape[2]


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor, num_draft: torch.Tensor | None = None,
                  *, backend: str | None = None,
                  check_values: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of K drafts per row against the target's argmax, fused with the accept reduction.

    Row b accepts a_b = the leading count of i < num_draft[b] with draft_tokens[b, i] == argmax(target_logits[b, i])
    (argmax ties go to the lowest index), then emits the target's own token at position a_b (the correction,
    or the bonus token when every draft was accepted).

    Args:
        draft_tokens: int64[B, K]; slots at or past num_draft[b] are ignored (-1 padding is fine there).
        target_logits: float[B, K+1, V] (float16, bfloat16, float32 or float64).
        num_draft: optional int64[B], each in 0..K.
        backend: backend for this call; default: the process-wide choice.
        check_values: None (default): the SPECDEC_CHECKS setting; False: skip the checks that read tensor
            values (each costs a host sync on a GPU); the structural checks always run.
    Returns:
        tokens: int64[B, K+1], tokens[b, :a_b+1] = argmax(target_logits[b, :a_b+1]), then -1.
        num_accepted: int64[B], a_b.
    """
    batch, k, vocab = _check_drafts(draft_tokens, target_logits, "target_logits", num_draft)
    if value_checks_enabled(check_values):
        checks = ValueChecks()
        checks.add_num_draft(num_draft, k)
        checks.add_draft_ids(draft_tokens, num_draft, vocab)
        checks.add_no_nan("target_logits", target_logits)
        checks.raise_first()
    return _run(_library.verify_greedy, _resolve(backend, target_logits.device), draft_tokens, target_logits,
                num_draft)


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     num_draft: torch.Tensor | None = None, *, uniform: torch.Tensor | None = None,
                     exponential: torch.Tensor | None = None, generator: torch.Generator | None = None,
                     backend: str | None = None,
                     check_values: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched speculative rejection sampling, fused with the accept-length reduction.

    Draft i < num_draft[b] of row b (token d) is accepted iff uniform[b, i] * q < p in float32, with
    p = target_probs[b, i, d] and q = draft_probs[b, i, d] (q = 1 when draft_probs is None: a deterministic
    drafter). At the first rejection j the row emits argmax_v r_v / exponential[b, v] with
    r = max(p[b, j] - q[b, j], 0) (q = one-hot(d) without draft_probs; p itself when r is all zero); when all
    drafts are accepted it emits the bonus token argmax_v p[b, num_draft[b], v] / exponential[b, v]. This
    samples exactly from the target distribution.

    Args:
        draft_tokens: int64[B, K].
        draft_probs: float[B, K, V] (the processed draft distribution the drafts were sampled from), or None.
        target_probs: float[B, K+1, V].
        num_draft: optional int64[B], each in 0..K.
        uniform: optional float32[B, K] in [0, 1); exponential: optional float32[B, V] > 0. When either is
            missing both are drawn here with torch (from `generator`), so every backend sees the same noise.
        generator: torch.Generator for the noise.
        backend: backend for this call; default: the process-wide choice.
        check_values: None (default): the SPECDEC_CHECKS setting; False: skip the checks that read tensor
            values (each costs a host sync on a GPU); the structural checks always run.
    Returns:
        tokens: int64[B, K+1], the accepted drafts, the sampled token, then -1.
        num_accepted: int64[B].
    """
    batch, k, vocab = _check_drafts(draft_tokens, target_probs, "target_probs", num_draft)
    device = target_probs.device
    if draft_probs is not None:
        expect_tensor("draft_probs", draft_probs, ndim=3, dtypes=FLOAT_DTYPES)
        expect_shape("draft_probs", draft_probs, (batch, k, vocab), "B, K, V of draft_tokens and target_probs")
        expect_device("draft_probs", draft_probs, device, "target_probs")
    for label, noise, shape in (("uniform", uniform, (batch, k)), ("exponential", exponential, (batch, vocab))):
        if noise is not None:
            expect_tensor(label, noise, ndim=2, dtypes=(torch.float32,))
            expect_shape(label, noise, shape, "float32 noise")
            expect_device(label, noise, device, "target_probs")
    check_generator(generator, device, drawing=uniform is None or exponential is None)
    if value_checks_enabled(check_values):
        checks = ValueChecks()
        checks.add_num_draft(num_draft, k)
        checks.add_draft_ids(draft_tokens, num_draft, vocab)
        checks.add_probs("target_probs", target_probs)
        if draft_probs is not None:
            checks.add_probs("draft_probs", draft_probs)
        if uniform is not None and uniform.numel():
            checks.add(~((uniform >= 0) & (uniform < 1)).all(), "uniform must lie in [0, 1)")
        if exponential is not None and exponential.numel():
            checks.add(~((exponential > 0) & (exponential < float("inf"))).all(),
                       "exponential must be finite and positive (no NaN, 0 or inf)")
        checks.raise_first()
    name = _resolve(backend, device)
    if uniform is None or exponential is None:
        drawn_u, drawn_e = draw_noise(batch, k, vocab, device, generator)
        uniform = drawn_u if uniform is None else uniform
        exponential = drawn_e if exponential is None else exponential
    return _run(_library.rejection_sample, name, draft_tokens, draft_probs, target_probs, num_draft, uniform,
                exponential)


def _check_shifted(op: str, tensors, per_row: torch.Tensor, per_row_name: str, dim: int, fill,
                   length: int | None = None) -> list[torch.Tensor]:
    """Every reason to refuse an in-place call, before anything is written (see checks.check_inplace)."""
    expect_supported_device(per_row_name, per_row)
    compiling = _compiling()
    tensors, tracked = check_inplace("tensors", tensors, per_row, per_row_name, dim, fill, length,
                                     memory=not compiling)
    if tracked and not compiling:
        cut_history(op, "tensors", tensors, tracked)
    return tensors


def shift_rows_(tensors: TensorOrList, shifts: torch.Tensor, *, dim: int = -2, fill: float = 0,
                backend: str | None = None, check_values: bool | None = None) -> None:
    """Shift each row of one or many tensors by its own offset along `dim`, in place.

    y[b, ..., t, ...] = x[b, ..., t - shifts[b], ...] where that index is in range, else `fill`. Positive
    shifts move toward the end. A shift of 0 leaves the row alone; |shift| >= T fills the whole row.

    Args:
        tensors: a tensor or a list of tensors, each with batch B at dim 0 (for example every layer's keys
            and values [B, H, T, D] and, in a second call with dim=-1, the attention mask [B, T]). They may
            differ in dtype and length along `dim`, and may be strided, transposed or offset views (writes go
            through the strides). See "Rules" below.
        shifts: int64[B] (any layout, expanded included).
        dim: the dimension to shift along, the same for every tensor; not the batch dimension.
        fill: the value written into vacated positions.
        backend: backend for this call; default: the process-wide choice.
        check_values: accepted for symmetry with the other ops; shift_rows_ has no checks that read values.

    Rules (every backend alike, all checked before the first write; a refused call is a ValueError that names
    the entries and modifies nothing):
        - the tensors must not share memory with each other or with `shifts`, and none may overlap itself
          (an expanded view). Disjoint views of one buffer are fine, also when they interleave (layer i and
          layer j of a [B, layers, H, T, D] slab); passing the whole slab as one tensor is cheaper still.
        - `fill` must be representable in every tensor's dtype (no overflow; integers for integer dtypes,
          0/1 for bool).
        - autograd: every written tensor's version counter is bumped (by the op's kernel), so a backward that
          saved one of them raises; while grad mode is on, a leaf that requires grad (or a view of one) is refused, as torch's
          own in-place ops refuse it, and a tensor that is part of a graph is written but its backward then
          raises (the op has no derivative). Never a silent wrong gradient.
    """
    expect_tensor("shifts", shifts, ndim=1, dtypes=(torch.int64,))
    tensors = _check_shifted("shift_rows_", tensors, shifts, "shifts", dim, fill)
    value_checks_enabled(check_values)  # validates the flag
    _run(_library.shift_rows_, _resolve(backend, shifts.device), tensors, shifts, dim, fill)


def compact_rows_(tensors: TensorOrList, keep: torch.Tensor, *, dim: int = -2, fill: float = 0,
                  backend: str | None = None, check_values: bool | None = None) -> torch.Tensor:
    """Squeeze out the holes of each row, in place: kept positions move, in order, to the end of the row.

    Row b keeps the positions t with keep[b, t]; they end at columns T - kept[b] .. T - 1 in their original
    order, and columns 0 .. T - kept[b] - 1 get `fill`. shift_rows_ is the cheap special case of a
    contiguous kept block.

    Args:
        tensors: a tensor or a list of tensors, each with batch B at dim 0 and length T along `dim` (strided,
            transposed or offset views are fine; see "Rules" below).
        keep: bool[B, T] (any layout, expanded included).
        dim: the dimension to compact along; not the batch dimension.
        fill: the value written into the freed front.
        backend: backend for this call; default: the process-wide choice.
        check_values: accepted for symmetry with the other ops; compact_rows_ has no checks that read values.
    Returns:
        kept: int64[B], the number of kept positions per row.

    Rules (every backend alike, all checked before the first write; a refused call is a ValueError that names
    the entries and modifies nothing):
        - the tensors must not share memory with each other or with `keep`, and none may overlap itself
          (an expanded view). Disjoint views of one buffer are fine, also when they interleave (layer i and
          layer j of a [B, layers, H, T, D] slab); passing the whole slab as one tensor is cheaper still.
        - `fill` must be representable in every tensor's dtype (no overflow; integers for integer dtypes,
          0/1 for bool).
        - autograd: every written tensor's version counter is bumped (by the op's kernel), so a backward that
          saved one of them raises; while grad mode is on, a leaf that requires grad (or a view of one) is refused, as torch's
          own in-place ops refuse it, and a tensor that is part of a graph is written but its backward then
          raises (the op has no derivative). Never a silent wrong gradient.
    """
    expect_tensor("keep", keep, ndim=2, dtypes=(torch.bool,))
    tensors = _check_shifted("compact_rows_", tensors, keep, "keep", dim, fill, length=keep.shape[1])
    value_checks_enabled(check_values)  # validates the flag
    return _run(_library.compact_rows_, _resolve(backend, keep.device), tensors, keep, dim, fill)
