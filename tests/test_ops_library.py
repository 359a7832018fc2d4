"""One op path: every public call goes through its torch.library op (specdec_kernels::*), whose per-device kernel
runs the backend chosen for the call (carried outside the schema); torch.library.opcheck passes for every op on
every backend; check_values=False skips exactly the checks that read tensor values."""

import pytest
import torch
from conftest import DEVICE, backend_params
from kernel_cases import greedy_case, sampling_case
from torch.utils._python_dispatch import TorchDispatchMode

import specdec_kernels as sk
from specdec_kernels import library

BACKENDS = backend_params()
OPS = torch.ops.specdec_kernels


def op_args():
    """(op name, public call, library op arguments) on small inputs."""
    gen = torch.Generator().manual_seed(71)
    drafts, logits, nd = greedy_case(3, 2, 9, seed=72)
    case = sampling_case(3, 2, 9, seed=73)
    matches = torch.rand(3, 4, generator=gen) < 0.6
    kv = [torch.randn(3, 2, 6, 2, generator=gen), torch.randint(0, 9, (3, 6, 1), generator=gen)]
    shifts = torch.tensor([1, -2, 0])
    keep = torch.rand(3, 6, generator=gen) < 0.5
    return {
        "accept_lengths": (lambda b: sk.accept_lengths(matches, nd.clamp(max=4), backend=b),
                           (matches, torch.tensor([4, 1, 0]))),
        "verify_greedy": (lambda b: sk.verify_greedy(drafts, logits, nd, backend=b), (drafts, logits, nd)),
        "rejection_sample": (lambda b: sk.rejection_sample(case.draft_tokens, case.draft_probs, case.target_probs,
                                                           case.num_draft, uniform=case.uniform,
                                                           exponential=case.exponential, backend=b),
                             (case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft, case.uniform,
                              case.exponential)),
        "shift_rows_": (lambda b: sk.shift_rows_([x.clone() for x in kv], shifts, dim=-2, fill=-1, backend=b),
                        ([x.clone() for x in kv], shifts, -2, -1)),
        "compact_rows_": (lambda b: sk.compact_rows_([x.clone() for x in kv], keep, dim=-2, fill=3, backend=b),
                          ([x.clone() for x in kv], keep, -2, 3)),
    }


NAMES = list(op_args())


def on_device(args):
    return tuple([t.to(DEVICE) for t in a] if isinstance(a, list) else a.to(DEVICE) if isinstance(a, torch.Tensor)
                 else a for a in args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_opcheck(backend, name):
    """Schema (what is mutated, no aliasing outputs), fake implementation, and AOT dispatch (static and
    dynamic shapes) agree with the eager kernel of the backend selected around the call."""
    args = on_device(op_args()[name][1])
    with sk.use_backend(backend):
        torch.library.opcheck(getattr(OPS, name).default, args)


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_public_call_goes_through_the_library_op(backend, name, monkeypatch):
    call = op_args()[name][0]
    with Recorder() as rec:
        call(backend)
    assert f"specdec_kernels.{name}.default" in rec.ops, rec.ops
    # ... and the op's kernel runs the backend named for this call, not the process-wide one.
    ran = []
    real = library.implementation(name, backend)
    monkeypatch.setitem(library._TABLES[backend], name, lambda *a: ran.append(backend) or real(*a))
    other = next(b for b in sk.available_backends() if b != backend) if len(sk.available_backends()) > 1 else backend
    with sk.use_backend(other):
        call(backend)
    assert ran == [backend]


def test_cpp_kernels_live_in_the_op_namespace():
    if "cpp" not in sk.available_backends():
        pytest.skip("the C++ extension is not built")
    for name in ("accept_lengths_cpp", "verify_greedy_cpp", "rejection_sample_cpp", "shift_rows_cpp_",
                 "compact_rows_cpp_"):
        assert hasattr(OPS, name)
    schema = str(OPS.verify_greedy_cpp.default._schema)
    assert schema.endswith("-> (Tensor, Tensor)"), schema  # functional: outputs come back, no out= arguments
    assert not hasattr(torch.ops.specdec, "verify_greedy")


# ------------------------------------------------------------------------------------------- check_values

@pytest.mark.parametrize("backend", BACKENDS)
def test_check_values_false_skips_only_value_checks(backend, monkeypatch):
    monkeypatch.setenv("SPECDEC_CHECKS", "1")
    drafts = torch.zeros(2, 2, dtype=torch.int64, device=DEVICE)
    logits = torch.randn(2, 3, 5, device=DEVICE)
    logits[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="target_logits contains NaN"):
        sk.verify_greedy(drafts, logits, backend=backend)
    tokens, _ = sk.verify_greedy(drafts, logits, backend=backend, check_values=False)  # no host sync, no check
    assert ((tokens[tokens >= 0] < 5)).all()
    with pytest.raises(ValueError, match=r"target_logits must have shape"):  # structural checks always run
        sk.verify_greedy(drafts, logits[:, :2], backend=backend, check_values=False)
    monkeypatch.setenv("SPECDEC_CHECKS", "0")
    with pytest.raises(ValueError, match="target_logits contains NaN"):  # True overrides the environment
        sk.verify_greedy(drafts, logits, backend=backend, check_values=True)
    with pytest.raises(ValueError, match="check_values must be True, False or None"):
        sk.verify_greedy(drafts, logits, backend=backend, check_values=1)


def test_every_op_takes_check_values():
    import inspect
    for name in ("accept_lengths", "verify_greedy", "rejection_sample", "shift_rows_", "compact_rows_"):
        param = inspect.signature(getattr(sk, name)).parameters["check_values"]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is None
