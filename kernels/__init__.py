"""specdec_kernels: fused ragged-batch primitives for batch speculative decoding.

    import specdec_kernels as sk
    sk.available_backends()            # ("torch", "cpp", "triton") where each can run
    sk.set_backend("cpp"); sk.get_backend()
    with sk.use_backend("torch"): ...
    tokens, accepted = sk.verify_greedy(draft_tokens, target_logits, num_draft)
    tokens, accepted = sk.rejection_sample(draft_tokens, draft_probs, target_probs, num_draft, generator=g)
    sk.shift_rows_(kv_tensors, shifts)        # in place
    kept = sk.compact_rows_(kv_tensors, keep)  # in place

SPECDEC_BACKEND sets the starting backend ("auto" by default); SPECDEC_CHECKS=0 (or check_values=False on a
call) turns off the checks that read tensor values.

Layout, one folder per op family (as flash-linear-attention lays out its ops): sampling/ (accept_lengths,
verify_greedy, rejection_sample) and moves/ (shift_rows_, compact_rows_), each with its naive per-row loop
(naive.py, the readable spec), the vectorised torch reference (reference.py), the Triton kernels
(triton_kernels.py) and the C++ sources (cpp/). library.py defines the torch.library ops, ops.py the public
functions (validation and dispatch), backend.py the switch.
"""

import sys as _sys

if __name__ != "specdec_kernels":
    # Imported under the folder's own name ("kernels", with the repo root on sys.path: transformers probes for a
    # package of that name). The ops are process-wide torch.library registrations, so a second copy of this
    # package must not run: that name becomes an alias of specdec_kernels.
    import importlib as _importlib

    _sys.modules[__name__] = _importlib.import_module("specdec_kernels")
else:
    from .backend import available_backends, get_backend, set_backend, unavailable_reason, use_backend
    from .noise import draw_noise
    from .ops import accept_lengths, compact_rows_, rejection_sample, shift_rows_, verify_greedy

    __all__ = [
        "accept_lengths", "available_backends", "compact_rows_", "draw_noise", "get_backend", "rejection_sample",
        "set_backend", "shift_rows_", "unavailable_reason", "use_backend", "verify_greedy",
    ]
    __version__ = "0.1.0"
