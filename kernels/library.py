"""The five ops as torch.library ops in the specdec_kernels namespace: one path for every call (eager,
torch.compile, torch.library.opcheck, the profiler).

    specdec_kernels::accept_lengths(Tensor matches, Tensor? num_draft) -> Tensor
    specdec_kernels::verify_greedy(Tensor draft_tokens, Tensor target_logits, Tensor? num_draft) -> (Tensor, Tensor)
    specdec_kernels::rejection_sample(Tensor draft_tokens, Tensor? draft_probs, Tensor target_probs,
                                      Tensor? num_draft, Tensor uniform, Tensor exponential) -> (Tensor, Tensor)
    specdec_kernels::shift_rows_(Tensor(a!)[] tensors, Tensor shifts, int dim, Scalar fill) -> ()
    specdec_kernels::compact_rows_(Tensor(a!)[] tensors, Tensor keep, int dim, Scalar fill) -> Tensor

Each op has a fake (meta) implementation and a kernel per device, registered the library's way (CPU and CUDA
dispatch keys). A kernel runs the backend `backend.kernel_backend` names: the one the dispatch layer (ops.py)
put in a context variable for this call, else the process-wide choice. The backend is not part of the schema.
The C++ backend is its own ops in this namespace (specdec_kernels::*_cpp, registered by the extension with
TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL, functional schemas, outputs allocated in C++); the CPU kernels call
them. Kernels assume arguments the dispatch layer validated; the in-place ones bump every written tensor's
version counter, as torch's own in-place ops do.

Registration goes through torch.library.Library (define + impl) rather than torch.library.custom_op: the same
dispatcher entries with less Python per call (both are timed in docs/ops_overhead.json, "micro", by
`python bench/op_overhead.py`).
"""

from __future__ import annotations

import importlib

import torch

from . import backend as _backend

NAMESPACE = "specdec_kernels"
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")

SCHEMAS = {
    "accept_lengths": "accept_lengths(Tensor matches, Tensor? num_draft) -> Tensor",
    "verify_greedy": "verify_greedy(Tensor draft_tokens, Tensor target_logits, Tensor? num_draft) -> (Tensor, Tensor)",
    "rejection_sample": "rejection_sample(Tensor draft_tokens, Tensor? draft_probs, Tensor target_probs, "
                        "Tensor? num_draft, Tensor uniform, Tensor exponential) -> (Tensor, Tensor)",
    "shift_rows_": "shift_rows_(Tensor(a!)[] tensors, Tensor shifts, int dim, Scalar fill) -> ()",
    "compact_rows_": "compact_rows_(Tensor(a!)[] tensors, Tensor keep, int dim, Scalar fill) -> Tensor",
}
for _schema in SCHEMAS.values():
    _lib.define(_schema)

# ------------------------------------------------------------------------------------------- the backends


def _cpp_ops():
    from . import _C  # noqa: F401  (importing registers torch.ops.specdec_kernels.*_cpp)
    ops = getattr(torch.ops, NAMESPACE)
    return {
        "accept_lengths": ops.accept_lengths_cpp.default,
        "verify_greedy": ops.verify_greedy_cpp.default,
        "rejection_sample": ops.rejection_sample_cpp.default,
        "shift_rows_": ops.shift_rows_cpp_.default,
        "compact_rows_": ops.compact_rows_cpp_.default,
    }


def _module_ops(sampling: str, moves: str):
    s = importlib.import_module(f".sampling.{sampling}", __package__)
    m = importlib.import_module(f".moves.{moves}", __package__)
    return {
        "accept_lengths": s.accept_lengths,
        "verify_greedy": s.verify_greedy,
        "rejection_sample": lambda d, q, p, n, u, e: s.rejection_sample(d, q, p, n, uniform=u, exponential=e),
        "shift_rows_": lambda xs, shifts, dim, fill: m.shift_rows_(xs, shifts, dim=dim, fill=fill),
        "compact_rows_": lambda xs, keep, dim, fill: m.compact_rows_(xs, keep, dim=dim, fill=fill),
    }


_LOADERS = {
    "torch": lambda: _module_ops("reference", "reference"),
    "cpp": _cpp_ops,
    "triton": lambda: _module_ops("triton_kernels", "triton_kernels"),
}
_TABLES: dict[str, dict] = {}


def implementation(op: str, backend: str):
    """The function backend `backend` runs for `op` (positional arguments as in the op's schema)."""
    table = _TABLES.get(backend)
    if table is None:
        table = _TABLES[backend] = _LOADERS[backend]()
    return table[op]


def _pick(op: str, device: torch.device):
    name = _backend.call_backend.get()
    if name is None:
        name = _backend.resolve(None, device)
    table = _TABLES.get(name)
    return table[op] if table is not None else implementation(op, name)


# ----------------------------------------------------------------------------------------- device kernels

def _accept_lengths(matches, num_draft):
    return _pick("accept_lengths", matches.device)(matches, num_draft)


def _verify_greedy(draft_tokens, target_logits, num_draft):
    return _pick("verify_greedy", target_logits.device)(draft_tokens, target_logits, num_draft)


def _rejection_sample(draft_tokens, draft_probs, target_probs, num_draft, uniform, exponential):
    return _pick("rejection_sample", target_probs.device)(draft_tokens, draft_probs, target_probs, num_draft,
                                                          uniform, exponential)


def _shift_rows_(tensors, shifts, dim, fill):
    _pick("shift_rows_", shifts.device)(tensors, shifts, dim, fill)
    torch._C._increment_version(tuple(tensors))


def _compact_rows_(tensors, keep, dim, fill):
    kept = _pick("compact_rows_", keep.device)(tensors, keep, dim, fill)
    torch._C._increment_version(tuple(tensors))
    return kept


def _no_grad(kernel):
    """The kernel's own torch ops (the torch backend's) must not be recorded by autograd: the op has no
    derivative (ops.py gives written graph tensors a history whose backward raises)."""
    def run(*args):
        if torch.is_grad_enabled():
            with torch.no_grad():
                return kernel(*args)
        return kernel(*args)
    run.__name__ = kernel.__name__
    return run


_KERNELS = {"accept_lengths": _accept_lengths, "verify_greedy": _verify_greedy,
            "rejection_sample": _rejection_sample, "shift_rows_": _shift_rows_, "compact_rows_": _compact_rows_}
for _name, _kernel in _KERNELS.items():
    for _key in ("CPU", "CUDA"):
        _lib.impl(_name, _no_grad(_kernel), _key)


# ------------------------------------------------------------------------------------------------- fakes

@torch.library.register_fake(f"{NAMESPACE}::accept_lengths", lib=_lib)
def _(matches, num_draft):
    return matches.new_empty(matches.shape[0], dtype=torch.int64)


@torch.library.register_fake(f"{NAMESPACE}::verify_greedy", lib=_lib)
def _(draft_tokens, target_logits, num_draft):
    batch, k = draft_tokens.shape
    return draft_tokens.new_empty(batch, k + 1), draft_tokens.new_empty(batch)


@torch.library.register_fake(f"{NAMESPACE}::rejection_sample", lib=_lib)
def _(draft_tokens, draft_probs, target_probs, num_draft, uniform, exponential):
    batch, k = draft_tokens.shape
    return draft_tokens.new_empty(batch, k + 1), draft_tokens.new_empty(batch)


@torch.library.register_fake(f"{NAMESPACE}::shift_rows_", lib=_lib)
def _(tensors, shifts, dim, fill):
    return None


@torch.library.register_fake(f"{NAMESPACE}::compact_rows_", lib=_lib)
def _(tensors, keep, dim, fill):
    return keep.new_empty(keep.shape[0], dtype=torch.int64)


_ops = getattr(torch.ops, NAMESPACE)
accept_lengths = _ops.accept_lengths.default
verify_greedy = _ops.verify_greedy.default
rejection_sample = _ops.rejection_sample.default
shift_rows_ = _ops.shift_rows_.default
compact_rows_ = _ops.compact_rows_.default
