"""Test set-up. Triton runs through its CPU interpreter here, which must be switched on before any kernel
module is imported; threads are pinned because this 2-core machine is badly hurt by oversubscription."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("SPECDEC_THREADS", "1")))

import specdec_kernels as sk  # noqa: E402

ALL_BACKENDS = ("torch", "cpp", "triton")


def backend_params():
    """Every backend, as pytest params; a backend that cannot run here is skipped with its reason
    (CI builds cpp and runs triton through the interpreter, so nothing is skipped there)."""
    out = []
    for name in ALL_BACKENDS:
        reason = sk.unavailable_reason(name)
        marks = [pytest.mark.skip(reason=f"{name}: {reason}")] if reason else []
        out.append(pytest.param(name, id=name, marks=marks))
    return out
