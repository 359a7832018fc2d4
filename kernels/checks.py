"""Argument validation, done once in the dispatch layer for every backend, before anything is modified.

Structural checks (shape, dtype, device, layout, aliasing, autograd state, fill) read no tensor values and are
always on. Checks that read tensor values (NaN, id and count ranges) cost one host sync on a GPU; they are on
unless SPECDEC_CHECKS=0 or an op is called with check_values=False. All value checks of one call are gathered
into a single tensor and read back once.

In-place calls (shift_rows_, compact_rows_) follow one set of rules on every backend, all checked before the
first write (see `check_inplace`): the tensors must not overlap themselves or each other or the per-row input
(shifts/keep); tensors autograd tracks are refused while grad mode is on; `fill` must be representable in every
tensor's dtype. Every written tensor's version counter is bumped afterwards (`bump_versions`), so autograd
notices the change in a tensor some graph saved for backward.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DEVICE_TYPES = ("cpu", "cuda")
ENV_CHECKS = "SPECDEC_CHECKS"

# os.environ.get encodes the key on every call (its cost next to the direct read: docs/ops_overhead.json, "micro",
# from `python bench/op_overhead.py`); its backing dict of bytes is read directly
# where the platform has one (POSIX), so the per-call check of SPECDEC_CHECKS stays cheap and still sees
# changes made through os.environ at any time.
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEY = ENV_CHECKS.encode() if isinstance(_ENV_DATA, dict) and all(
    isinstance(k, bytes) for k in list(_ENV_DATA)[:1]) else None


def value_checks_enabled(check_values: bool | None = None) -> bool:
    """check_values if given, else the SPECDEC_CHECKS default (on unless "0")."""
    if check_values is not None:
        if not isinstance(check_values, bool):
            raise ValueError(f"check_values must be True, False or None, got {check_values!r}")
        return check_values
    if _ENV_KEY is not None:
        return _ENV_DATA.get(_ENV_KEY, b"1") != b"0"
    return os.environ.get(ENV_CHECKS, "1") != "0"


def describe(x: torch.Tensor) -> str:
    return f"shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}"


def expect_tensor(name: str, x, *, ndim: int | None = None, dtypes=None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got {describe(x)}")
    if dtypes is not None and x.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"{name} must have dtype in ({names}), got {describe(x)}")
    return x


def expect_shape(name: str, x: torch.Tensor, shape: Sequence[int], meaning: str) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({meaning}), got {describe(x)}")


def expect_device(name: str, x: torch.Tensor, device: torch.device, other: str) -> None:
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but {other} is on {device}; all tensors must share a device")


def expect_supported_device(name: str, x: torch.Tensor) -> None:
    """CPU and CUDA tensors only: a meta (or other) tensor has no data for a kernel to read."""
    if not (x.is_cpu or x.is_cuda):
        raise ValueError(f"{name} is a {x.device.type} tensor ({describe(x)}); specdec_kernels ops run on CPU and "
                         f"CUDA tensors (meta tensors work only inside torch.compile tracing, through the ops' "
                         f"fake implementations)")


def check_num_draft(num_draft, batch: int, k: int, device: torch.device, other: str):
    if num_draft is None:
        return None
    expect_tensor("num_draft", num_draft, ndim=1, dtypes=(torch.int64,))
    expect_shape("num_draft", num_draft, (batch,), "one count per row")
    expect_device("num_draft", num_draft, device, other)
    return num_draft


def check_generator(generator, device: torch.device, drawing: bool) -> None:
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__} "
                         f"({generator!r:.40})")
    if drawing and generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device} but target_probs is on {device}; the noise is drawn "
                         f"on the tensors' device")


class ValueChecks:
    """Collects named boolean 'is bad' scalars and raises for the first true one after a single readback."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._flags: list[torch.Tensor] = []

    def add(self, bad: torch.Tensor, message: str) -> None:
        self._names.append(message)
        self._flags.append(bad.reshape(()))

    def add_num_draft(self, num_draft, k: int) -> None:
        if num_draft is not None and num_draft.numel():
            self.add((num_draft < 0).any() | (num_draft > k).any(),
                     f"num_draft entries must lie in 0..K={k}")

    def add_draft_ids(self, draft_tokens: torch.Tensor, num_draft, vocab: int) -> None:
        if draft_tokens.numel() == 0:
            return
        bad = (draft_tokens < 0) | (draft_tokens >= vocab)
        if num_draft is not None:
            slots = torch.arange(draft_tokens.shape[1], device=draft_tokens.device)
            bad = bad & (slots[None, :] < num_draft[:, None])
        self.add(bad.any(), f"draft_tokens has an id outside [0, V={vocab}) among the first num_draft slots")

    def add_probs(self, name: str, probs: torch.Tensor) -> None:
        if probs.numel():
            low = probs.min()  # min propagates NaN, so one reduction finds NaN and negative entries
            self.add(low.isnan() | (low < 0), f"{name} contains NaN or negative probabilities")

    def add_no_nan(self, name: str, x: torch.Tensor) -> None:
        if x.numel():
            self.add(x.max().isnan(), f"{name} contains NaN")

    def raise_first(self) -> None:
        if not self._flags:
            return
        flags = torch.stack(self._flags).tolist()  # the one host sync of the call
        for bad, message in zip(flags, self._names):
            if bad:
                raise ValueError(message)


# ------------------------------------------------------------------------------------------- in-place rules

@functools.lru_cache(maxsize=512)
def _fill_problem(dtype: torch.dtype, fill_type: type, fill) -> str | None:
    """Why `fill` cannot be stored in `dtype`, or None. The conversion is the reference's own (masked_fill_),
    so what passes here is written identically by every backend; integer and bool dtypes also refuse values
    they would silently truncate (0.5 -> 0, -7 -> True)."""
    try:
        torch.zeros(1, dtype=dtype).masked_fill_(torch.ones(1, dtype=torch.bool), fill)
    except (RuntimeError, OverflowError, TypeError) as e:
        return str(e).split("\n")[0]
    if dtype == torch.bool:
        return None if fill in (0, 1) else "a bool tensor holds only 0/1 (False/True)"
    if not (dtype.is_floating_point or dtype.is_complex):
        if isinstance(fill, float) and not (math.isfinite(fill) and fill.is_integer()):
            return "not an integer"
    return None


_ZERO_FILL_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
                               torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                               torch.bool))


def check_fill(fill, first_of: dict, name: str) -> None:
    """`fill` is a Python number that every dtype of the call stores (first_of: dtype -> first entry with it)."""
    if isinstance(fill, torch.Tensor) or not isinstance(fill, (int, float, bool)):
        raise ValueError(f"fill must be a Python number (int, float or bool), got {type(fill).__name__} "
                         f"({fill!r:.40})")
    if fill == 0 and _ZERO_FILL_DTYPES.issuperset(first_of):
        return  # 0 (0.0, -0.0, False) is stored exactly by these: the engine's common case, no lookups
    for dtype, i in first_of.items():
        problem = _fill_problem(dtype, type(fill), fill)
        if problem:
            raise ValueError(f"fill={fill!r} cannot be stored in {name}[{i}] (dtype {dtype}): {problem}")


@functools.lru_cache(maxsize=1024)
def _extent(shape: torch.Size, stride: tuple[int, ...]) -> tuple[int, int, bool]:
    """(lowest element offset, one past the highest, may overlap itself) of a non-empty strided layout, relative
    to its first element. No self-overlap is proved by a sufficient condition: sorted by stride, each stride steps
    past everything the smaller strides reach. Exotic interleavings that fail it are refused (their writes cannot
    be proved apart). Cached: it depends on the layout only, not on the tensor."""
    lo = hi = 0
    dims = []
    for n, st in zip(shape, stride):
        if n > 1:
            if st < 0:
                lo += (n - 1) * st
            else:
                hi += (n - 1) * st
            dims.append((abs(st), n))
    dims.sort()
    reach = 0
    for st, n in dims:
        if st <= reach:
            return lo, hi + 1, True
        reach += (n - 1) * st
    return lo, hi + 1, False


@functools.lru_cache(maxsize=1024)
def _residues(shape: torch.Size, stride: tuple[int, ...], esize: int, modulus: int) -> tuple[int, int]:
    """(offset of the window start from the data pointer, window length) in bytes: the bytes of the layout lie in
    one window of residues mod `modulus` (dims whose byte stride is a multiple of it contribute nothing)."""
    start, length = 0, esize
    for n, st in zip(shape, stride):
        if n > 1 and (st * esize) % modulus:
            length += (n - 1) * abs(st) * esize
            if st < 0:
                start += (n - 1) * st * esize
    return start, length


def _windows(xs: list[torch.Tensor], modulus: int) -> list[tuple[int, int, int]] | None:
    out = []
    for k, x in enumerate(xs):
        rel, length = _residues(x.shape, x.stride(), x.element_size(), modulus)
        if length > modulus:
            return None
        out.append(((x.data_ptr() + rel) % modulus, length, k))
    return out


def _apart_mod(xs: list[torch.Tensor], modulus: int) -> bool:
    """True if the residue windows mod `modulus` of all of xs are pairwise disjoint (so their bytes are)."""
    wins = _windows(xs, modulus)
    if wins is None:
        return False
    wins.sort()
    for (s0, l0, _), (s1, _, _) in zip(wins, wins[1:]):
        if s0 + l0 > s1:
            return False
    last_start, last_len, _ = wins[-1]
    return last_start + last_len <= wins[0][0] + modulus


def _moduli(xs: list[torch.Tensor]) -> list[int]:
    """Candidate moduli: the byte strides of the dims (of size > 1) of the tensors, largest first."""
    seen = {abs(st) * x.element_size() for x in xs for n, st in zip(x.shape, x.stride()) if n > 1 and st}
    return sorted(seen, reverse=True)


def _provably_apart(xs: list[torch.Tensor]) -> bool:
    """True if tensors whose byte ranges overlap still share no byte: views interleaved at a common stride (layer i
    of a [B, layers, H, T, D] slab, slab[:, i], next to slab[:, j]). For some stride S of one of them, the bytes of
    each lie in one window of residues mod S; pairwise disjoint windows mean disjoint memory."""
    return any(_apart_mod(xs, m) for m in _moduli(xs))


def _memory_conflict(name: str, tensors: list[torch.Tensor], per_row: torch.Tensor, per_row_name: str,
                     cluster: list[int]) -> None:
    """Raise for the first pair of a cluster of overlapping byte ranges that cannot be proved apart."""
    def get(i):
        return tensors[i] if i >= 0 else per_row

    if _provably_apart([get(i) for i in cluster]):
        return
    for a in range(len(cluster)):
        for b in range(a + 1, len(cluster)):
            i, j = cluster[a], cluster[b]
            if not _provably_apart([get(i), get(j)]):
                first, second = sorted((i, j), key=lambda k: (k < 0, k))
                other = per_row_name if second < 0 else f"{name}[{second}]"
                raise ValueError(f"{name}[{first}] and {other} share memory: the tensors of one in-place call must be "
                                 f"disjoint from each other and from {per_row_name} (pass each buffer once, or one "
                                 f"tensor covering all of them)")
    # Every pair is apart, the cluster as a whole was not provable at one modulus: exotic, but disjoint.


def check_inplace(name: str, tensors, per_row: torch.Tensor, per_row_name: str, dim, fill,
                  length: int | None = None, memory: bool = True) -> tuple[list[torch.Tensor], list[int]]:
    """Every rule of an in-place call, in one pass over the tensors and before the first write (reads no tensor
    values, no host sync):
    - each entry is a tensor with batch B = len(per_row) at dim 0, `dim` a non-batch dim, on per_row's device,
      length `length` along dim when given;
    - `fill` is a Python number every dtype stores (check_fill's rule);
    - while grad mode is on, no leaf that requires grad (nor a view of one): torch refuses in-place writes to those;
    - no tensor overlaps itself, no two tensors (nor a tensor and per_row) share memory: compared by absolute byte
      ranges, ranges that overlap then tested for an interleaving that shares no byte (`_provably_apart`).
      memory=False skips these (torch.compile tracing: fake tensors have no addresses; functionalization owns
      aliasing there).
    Returns (the tensors as a list, the indices of those that are part of an autograd graph: non-leaf, requires
    grad, grad mode on; `cut_history` makes their backward raise)."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    elif not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{name} must be a tensor or a non-empty list/tuple of tensors, got {tensors!r:.80}")
    else:
        tensors = list(tensors)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ValueError(f"dim must be an int, got {dim!r}")
    batch, on_cpu, index = per_row.shape[0], per_row.is_cpu, per_row.get_device()
    grad = torch.is_grad_enabled()
    tracked: list[int] = []
    spans = []
    first_of: dict = {}  # dtype -> the first entry holding it, for the fill check
    for i, x in enumerate(tensors):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name}[{i}] must be a torch.Tensor, got {type(x).__name__}")
        nd = x.ndim
        if nd < 2:
            raise ValueError(f"{name}[{i}] needs batch at dim 0 and at least one more dimension, got {describe(x)}")
        if not -nd <= dim < nd or dim % nd == 0:
            raise ValueError(f"dim={dim} is not a non-batch dimension of {name}[{i}] ({describe(x)})")
        shape = x.shape
        if shape[0] != batch:
            raise ValueError(f"{name}[{i}] has batch {shape[0]} but {per_row_name} has {batch} rows ({describe(x)})")
        if x.is_cpu != on_cpu or x.get_device() != index:
            expect_device(f"{name}[{i}]", x, per_row.device, per_row_name)
        if length is not None and shape[dim] != length:
            raise ValueError(f"{name}[{i}] has length {shape[dim]} along dim={dim} but {per_row_name} has T={length}")
        if grad and x.requires_grad:
            base = x._base
            if x.is_leaf or (base is not None and base.is_leaf):
                what = "a leaf that requires grad" if x.is_leaf else "a view of a leaf that requires grad"
                raise ValueError(f"{name}[{i}] is {what} ({describe(x)}); like torch's own in-place ops, {name} "
                                 f"cannot be written in place while grad mode is on: call it under torch.no_grad() "
                                 f"or pass detached tensors")
            tracked.append(i)
        if x.dtype not in first_of:
            first_of[x.dtype] = i
        if not memory:
            continue
        if x.is_contiguous():  # dense: no self-overlap, one plain byte range
            n = x.numel()
            if n:
                ptr = x.data_ptr()
                spans.append((ptr, ptr + n * x.element_size(), i))
        elif x.numel():
            lo, hi, overlap = _extent(shape, x.stride())
            if overlap:
                raise ValueError(f"{name}[{i}] overlaps itself (an expanded or stride-0 view, strides {x.stride()}, "
                                 f"{describe(x)}): an in-place write would hit one element through several "
                                 f"indices; pass a tensor whose elements each have their own memory")
            ptr, es = x.data_ptr(), x.element_size()
            spans.append((ptr + lo * es, ptr + hi * es, i))
    check_fill(fill, first_of, name)
    if memory and spans and per_row.numel():
        lo, hi, _ = _extent(per_row.shape, per_row.stride())
        ptr, es = per_row.data_ptr(), per_row.element_size()
        spans.append((ptr + lo * es, ptr + hi * es, -1))
    if len(spans) > 1:
        _check_spans(name, tensors, per_row, per_row_name, spans)
    return tensors, tracked


def _check_spans(name: str, tensors: list[torch.Tensor], per_row: torch.Tensor, per_row_name: str,
                 spans: list[tuple[int, int, int]]) -> None:
    spans.sort()
    cluster, reach = [spans[0][2]], spans[0][1]  # runs of byte ranges that overlap one another
    for lo, hi, i in spans[1:]:
        if lo < reach:
            cluster.append(i)
            reach = max(reach, hi)
            continue
        if len(cluster) > 1:
            _memory_conflict(name, tensors, per_row, per_row_name, cluster)
        cluster, reach = [i], hi
    if len(cluster) > 1:
        _memory_conflict(name, tensors, per_row, per_row_name, cluster)


class _NoDerivative(torch.autograd.Function):
    """An in-place no-op in the autograd graph whose backward raises: the history of a tensor that an op
    without a derivative wrote in place."""

    @staticmethod
    def forward(ctx, x, op):
        ctx.op = op
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(f"specdec_kernels.{ctx.op} wrote this tensor in place and has no derivative: there is "
                           f"no gradient through it (call the op under torch.no_grad(), or on detached tensors)")


def cut_history(op: str, name: str, tensors: list[torch.Tensor], tracked: list[int]) -> None:
    """Before the write: give each tracked (non-leaf) tensor a history whose backward raises, as an in-place
    op without a derivative formula must; the forward values stay usable. Never a silent wrong gradient."""
    for i in tracked:
        try:
            _NoDerivative.apply(tensors[i], op)
        except RuntimeError as e:  # e.g. a view made in no_grad mode of a tensor that requires grad
            raise ValueError(f"{name}[{i}] cannot be written in place while grad mode is on "
                             f"({describe(tensors[i])}): {str(e).splitlines()[0]}") from None


def bump_versions(tensors: list[torch.Tensor]) -> None:
    """Tell autograd the tensors changed in place (what torch's own in-place ops do); a backward that saved one
    of them then raises instead of computing a wrong gradient. No-op for inference-mode tensors."""
    torch._C._increment_version(tuple(tensors))
