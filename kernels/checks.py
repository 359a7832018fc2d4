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

# os.environ.get costs about 1 us (it encodes the key each time); its backing dict of bytes is read directly
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
    if x.device.type not in DEVICE_TYPES:
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


def tensor_list(name: str, tensors) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{name} must be a tensor or a non-empty list/tuple of tensors, got {tensors!r:.80}")
    for i, x in enumerate(tensors):
        expect_tensor(f"{name}[{i}]", x)
    return list(tensors)


def check_rows(name: str, tensors: list[torch.Tensor], batch: int, dim: int, device: torch.device,
               other: str, length: int | None = None) -> None:
    """Every tensor has batch `batch` at dim 0, a distinct non-batch `dim`, and lives on `device`."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ValueError(f"dim must be an int, got {dim!r}")
    for i, x in enumerate(tensors):
        label = f"{name}[{i}]"
        if x.ndim < 2:
            raise ValueError(f"{label} needs batch at dim 0 and at least one more dimension, got {describe(x)}")
        if not -x.ndim <= dim < x.ndim or dim % x.ndim == 0:
            raise ValueError(f"dim={dim} is not a non-batch dimension of {label} ({describe(x)})")
        if x.shape[0] != batch:
            raise ValueError(f"{label} has batch {x.shape[0]} but {other} has {batch} rows ({describe(x)})")
        expect_device(label, x, device, other)
        if length is not None and x.shape[dim] != length:
            raise ValueError(f"{label} has length {x.shape[dim]} along dim={dim} but {other} has T={length}")


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


def check_fill(fill, tensors: list[torch.Tensor], name: str) -> None:
    if isinstance(fill, torch.Tensor) or not isinstance(fill, (int, float, bool)):
        raise ValueError(f"fill must be a Python number (int, float or bool), got {type(fill).__name__} "
                         f"({fill!r:.40})")
    seen: set = set()
    for i, x in enumerate(tensors):
        if x.dtype in seen:
            continue
        seen.add(x.dtype)
        problem = _fill_problem(x.dtype, type(fill), fill)
        if problem:
            raise ValueError(f"fill={fill!r} cannot be stored in {name}[{i}] (dtype {x.dtype}): {problem}")


def _span(x: torch.Tensor) -> tuple[int, int, bool]:
    """(lowest byte, one past the highest byte, may overlap itself) of a non-empty strided tensor."""
    es = x.element_size()
    lo = hi = x.data_ptr()
    if x.is_contiguous():
        return lo, lo + x.numel() * es, False
    dims = []
    for n, s in zip(x.shape, x.stride()):
        if n > 1:
            if s < 0:
                lo += (n - 1) * s * es
            else:
                hi += (n - 1) * s * es
            dims.append((abs(s), n))
    # Sufficient condition for no self-overlap: sorted by stride, each stride steps past everything the
    # smaller strides reach. Exotic interleavings that fail it are refused (their writes cannot be proved apart).
    dims.sort()
    reach, overlap = 0, False
    for s, n in dims:
        if s <= reach:
            overlap = True
            break
        reach += (n - 1) * s
    return lo, hi + es, overlap


def _window(x: torch.Tensor, modulus: int) -> tuple[int, int] | None:
    """The residues mod `modulus` (bytes) that x's bytes occupy, as (start, length), or None if they wrap."""
    es = x.element_size()
    start, length = x.data_ptr(), es
    for n, s in zip(x.shape, x.stride()):
        if n > 1 and (s * es) % modulus:
            length += (n - 1) * abs(s) * es
            if s < 0:
                start += (n - 1) * s * es
    return (start % modulus, length) if length <= modulus else None


def _provably_apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if a and b, whose byte ranges overlap, still share no byte: views interleaved at a common stride
    (layer i of a [B, 2L, H, T, D] slab, slab[:, i], next to slab[:, j]). For each candidate stride S, the
    bytes of each tensor lie in one window of residues mod S; disjoint windows mean disjoint memory."""
    for x in (a, b):
        for n, s in zip(x.shape, x.stride()):
            modulus = abs(s) * x.element_size()
            if n <= 1 or modulus == 0:
                continue
            wa, wb = _window(a, modulus), _window(b, modulus)
            if wa is None or wb is None or wa[1] + wb[1] > modulus:
                continue
            gap = (wb[0] - wa[0]) % modulus
            if gap >= wa[1] and gap + wb[1] <= modulus:
                return True
    return False


def check_inplace(name: str, tensors: list[torch.Tensor], per_row: torch.Tensor, per_row_name: str,
                  memory: bool = True) -> list[int]:
    """The rules of an in-place call, checked before the first write (reads no tensor values, no sync):
    no tensor that overlaps itself, no two tensors (nor a tensor and `per_row`) that share memory, and while
    grad mode is on no leaf that requires grad (nor a view of one): torch refuses in-place writes to those too.
    memory=False skips the memory checks (torch.compile tracing: fake tensors have no addresses;
    functionalization owns aliasing there). Returns the indices of the tensors that are part of an autograd
    graph (non-leaf, requires grad, grad mode on): `cut_history` makes their backward raise."""
    tracked: list[int] = []
    if torch.is_grad_enabled():
        for i, x in enumerate(tensors):
            if x.requires_grad:
                base = x._base
                if x.is_leaf or (base is not None and base.is_leaf):
                    what = "a leaf that requires grad" if x.is_leaf else "a view of a leaf that requires grad"
                    raise ValueError(f"{name}[{i}] is {what} ({describe(x)}); like torch's own in-place ops, "
                                     f"{name} cannot be written in place while grad mode is on: call it under "
                                     f"torch.no_grad() or pass detached tensors")
                tracked.append(i)
    if not memory:
        return tracked
    spans = []
    for i, x in enumerate(tensors):
        if x.numel() == 0:
            continue
        lo, hi, overlap = _span(x)
        if overlap:
            raise ValueError(f"{name}[{i}] overlaps itself (an expanded or stride-0 view, strides {x.stride()}, "
                             f"{describe(x)}): an in-place write would hit one element through several indices; "
                             f"pass a tensor whose elements each have their own memory")
        spans.append((lo, hi, i))
    if per_row.numel():
        lo, hi, _ = _span(per_row)
        spans.append((lo, hi, -1))
    if len(spans) < 2:
        return tracked
    spans.sort()
    active: list[tuple[int, int, int]] = []  # spans that reach past the current start
    for lo, hi, i in spans:
        active = [s for s in active if s[1] > lo]
        for _, _, j in active:
            x = tensors[i] if i >= 0 else per_row
            y = tensors[j] if j >= 0 else per_row
            if not _provably_apart(x, y):
                first, second = sorted((i, j), key=lambda k: (k < 0, k))
                label = f"{name}[{first}]"
                other = per_row_name if second < 0 else f"{name}[{second}]"
                raise ValueError(f"{label} and {other} share memory: the tensors of one in-place call must be "
                                 f"disjoint from each other and from {per_row_name} (pass each buffer once, "
                                 f"or one tensor covering all of them)")
        active.append((lo, hi, i))
    return tracked


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
