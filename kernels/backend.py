"""The backend switch: which implementation runs an op.

Backends: "torch" (the reference in reference.py, vectorised PyTorch), "cpp" (the C++ extension
specdec_kernels._C, CPU tensors), "triton" (Triton kernels: CUDA tensors, or CPU tensors under
TRITON_INTERPRET=1). "auto" picks triton for CUDA tensors, cpp for CPU tensors when it is built, else torch.

The choice is explicit and loud: an unknown name is a ValueError, a known backend that cannot run here
is a RuntimeError that says why. Nothing falls back silently.

The choice travels outside the ops' schemas: every op is one torch.library op (library.py) whose CPU and CUDA
kernels ask `kernel_backend(device)` which implementation to run. The public functions (ops.py) resolve a call's
backend= and put it in a context variable around the op call; without one (a compiled graph, opcheck, a direct
torch.ops call) the kernel uses the process-wide choice (set_backend / use_backend / SPECDEC_BACKEND).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from typing import Iterator

import torch

BACKENDS = ("torch", "cpp", "triton")
_CHOICES = ("auto",) + BACKENDS
ENV_VAR = "SPECDEC_BACKEND"


def _check_name(name: str) -> str:
    if not isinstance(name, str) or name not in _CHOICES:
        raise ValueError(f"backend must be one of {_CHOICES}, got {name!r}")
    return name


_current = _check_name(os.environ.get(ENV_VAR, "auto").strip().lower() or "auto")


@functools.lru_cache(maxsize=None)
def _cpp_status() -> str | None:
    """None when the C++ extension is usable, else the reason it is not."""
    if os.environ.get("SPECDEC_NO_CPP") == "1":
        return "disabled by SPECDEC_NO_CPP=1"
    try:
        from . import _C  # noqa: F401  (importing registers torch.ops.specdec.*)
    except ImportError as e:
        return (f"the C++ extension specdec_kernels._C is not built ({e}); "
                "reinstall with `pip install --no-build-isolation -e .` and a C++ compiler")
    return None


_ENV_DATA = getattr(os.environ, "_data", None)
_INTERPRET_KEY = b"TRITON_INTERPRET" if isinstance(_ENV_DATA, dict) and all(
    isinstance(k, bytes) for k in list(_ENV_DATA)[:1]) else None


def _interpreting() -> bool:
    if _INTERPRET_KEY is not None:  # os.environ's backing dict: a cheap read that still sees every change
        return _ENV_DATA.get(_INTERPRET_KEY) == b"1"
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _triton_import_error() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not installed ({e})"
    return None


def _triton_status(device: torch.device | None = None) -> str | None:
    err = _triton_import_error()
    if err:
        return err
    if _interpreting():
        return None
    if device is not None and device.type != "cuda":
        return (f"triton kernels need CUDA tensors (got {device.type}); "
                "set TRITON_INTERPRET=1 before importing specdec_kernels to run them on CPU")
    if not torch.cuda.is_available():
        return "triton needs a CUDA device or TRITON_INTERPRET=1, and CUDA is not available"
    return None


def unavailable_reason(name: str, device: torch.device | None = None) -> str | None:
    """Why backend `name` cannot run (on `device`, if given), or None if it can."""
    _check_name(name)
    if name == "cpp":
        reason = _cpp_status()
        if reason is None and device is not None and device.type != "cpu":
            reason = f"the cpp backend runs on CPU tensors only (got {device.type})"
        return reason
    if name == "triton":
        return _triton_status(device)
    return None


def available_backends() -> tuple[str, ...]:
    """The backends that can run in this process; always includes "torch"."""
    return tuple(b for b in BACKENDS if unavailable_reason(b) is None)


def get_backend() -> str:
    """The process-wide backend choice ("auto" unless set)."""
    return _current


def set_backend(name: str) -> None:
    """Set the process-wide backend. Raises ValueError for an unknown name and RuntimeError
    for a backend that is not available here."""
    global _current
    name = _check_name(name)
    if name != "auto":
        reason = unavailable_reason(name)
        if reason:
            raise RuntimeError(f"backend {name!r} is not available: {reason}")
    _current = name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Use backend `name` inside the block; the previous choice comes back on exit, also on exceptions."""
    previous = _current
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


# The backend of the op call in progress, set by the dispatch layer (ops.py) around each op call.
call_backend: contextvars.ContextVar[str | None] = contextvars.ContextVar("specdec_kernels_backend", default=None)


def kernel_backend(device: torch.device) -> str:
    """Inside an op's kernel: the backend this call runs on."""
    name = call_backend.get()
    return name if name is not None else resolve(None, device)


def resolve(backend: str | None, device: torch.device) -> str:
    """The concrete backend for one call on tensors on `device`."""
    if backend == "cpp" and device.type == "cpu" and _cpp_status() is None:  # the common explicit choice, fast
        return "cpp"
    name = _check_name(backend) if backend is not None else _current
    if name == "auto":
        if device.type == "cuda" and _triton_status(device) is None:
            return "triton"
        if device.type == "cpu" and _cpp_status() is None:
            return "cpp"
        return "torch"
    reason = unavailable_reason(name, device)
    if reason:
        raise RuntimeError(f"backend {name!r} is not available: {reason}")
    return name
