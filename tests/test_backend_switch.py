"""The backend switch: explicit, loud, restored on exceptions, settable by environment variable."""

import os
import subprocess
import sys

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import backend as backend_mod


def test_torch_is_always_available():
    assert "torch" in sk.available_backends()


def test_ci_builds_every_cpu_backend():
    """CI builds the C++ extension and runs Triton through the interpreter: neither may silently go missing."""
    if os.environ.get("CI"):
        assert set(sk.available_backends()) == {"torch", "cpp", "triton"}, sk.available_backends()


def test_set_get_and_use_backend_restores_on_exception():
    assert sk.get_backend() == "auto"
    with sk.use_backend("torch"):
        assert sk.get_backend() == "torch"
    with pytest.raises(KeyError):
        with sk.use_backend("torch"):
            raise KeyError("boom")
    assert sk.get_backend() == "auto"
    sk.set_backend("torch")
    try:
        assert sk.get_backend() == "torch"
    finally:
        sk.set_backend("auto")


@pytest.mark.parametrize("name", ["cuda", "", "Torch", None])
def test_unknown_backend_is_value_error(name):
    with pytest.raises(ValueError, match="backend must be one of"):
        sk.set_backend(name)
    with pytest.raises(ValueError, match="backend must be one of"):
        sk.accept_lengths(torch.ones(1, 1, dtype=torch.bool), backend=name or "nope")


def test_unavailable_backend_is_runtime_error_with_reason(monkeypatch):
    monkeypatch.setattr(backend_mod, "_cpp_status", lambda: "the C++ extension is not built (test)")
    with pytest.raises(RuntimeError, match="'cpp' is not available: the C\\+\\+ extension is not built"):
        sk.set_backend("cpp")
    with pytest.raises(RuntimeError, match="not built"):
        sk.accept_lengths(torch.ones(1, 1, dtype=torch.bool), backend="cpp")
    assert sk.get_backend() == "auto"
    # auto falls back to torch for CPU tensors only because cpp is missing, which it reports via unavailable_reason
    assert backend_mod.resolve(None, torch.device("cpu")) == "torch"


def test_triton_without_cuda_or_interpreter_says_why(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reason = sk.unavailable_reason("triton", torch.device("cpu"))
    assert reason and "TRITON_INTERPRET=1" in reason


def test_auto_prefers_cpp_on_cpu_when_built():
    if "cpp" in sk.available_backends():
        assert backend_mod.resolve(None, torch.device("cpu")) == "cpp"


@pytest.mark.parametrize("value,expect", [("torch", "torch"), ("auto", "auto"), ("bogus", "error")])
def test_environment_variable_sets_the_start_value(value, expect):
    code = "import specdec_kernels as sk; print(sk.get_backend())"
    env = dict(os.environ, SPECDEC_BACKEND=value)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if expect == "error":
        assert run.returncode != 0 and "backend must be one of" in run.stderr
    else:
        assert run.returncode == 0 and run.stdout.strip() == expect
