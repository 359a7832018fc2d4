"""The rules of DESIGN.md's "Layouts, aliasing, writes", on every backend: aliasing is refused, a refused call
writes nothing (every refusal reason is checked before the first write), in-place writes are visible to
autograd, and bad arguments are ValueErrors that name the argument."""

import pytest
import torch
from conftest import DEVICE, backend_params
from kernel_cases import greedy_case, move_backend_params, sampling_case, torch_threads

import specdec_kernels as sk
from specdec_kernels import reference as ref

BACKENDS = backend_params()
MOVE_BACKENDS = move_backend_params()


def dev(*tensors):
    return [t.to(DEVICE) for t in tensors]


def shifts3():
    return torch.tensor([1, 0, 2], device=DEVICE)


def keep3(length=5):
    return (torch.arange(3 * length).view(3, length) % 3 != 0).to(DEVICE)


# ---------------------------------------------------------------------------------------------- aliasing

def alias_cases():
    """(tensors, which entries the error names) for calls whose tensors share memory."""
    def same_twice():
        x = torch.randn(3, 5, 2, device=DEVICE)
        return [x, x], r"tensors\[0\] and tensors\[1\] share memory"

    def nested_views():
        a = torch.randn(3, 4, 5, 2, device=DEVICE)
        return [a[:, 1], a], r"tensors\[0\] and tensors\[1\] share memory"

    def partial_overlap():
        buf = torch.randn(3, 2, 9, 2, device=DEVICE)
        return [buf[:, :, :5], torch.randn(3, 5, 1, device=DEVICE), buf[:, :, 3:8]], \
            r"tensors\[0\] and tensors\[2\] share memory"

    def reshaped_alias():
        x = torch.randn(3, 5, 4, device=DEVICE)
        return [x, x.view(3, 5, 2, 2)[..., 0]], r"tensors\[0\] and tensors\[1\] share memory"

    return [pytest.param(same_twice, id="same-tensor-twice"), pytest.param(nested_views, id="nested-views"),
            pytest.param(partial_overlap, id="partial-overlap"), pytest.param(reshaped_alias, id="reshaped-view")]


@pytest.mark.parametrize("backend,threads", MOVE_BACKENDS)
@pytest.mark.parametrize("make", alias_cases())
@pytest.mark.parametrize("op", ["shift_rows_", "compact_rows_"])
def test_aliased_tensors_are_refused_and_untouched(backend, threads, make, op):
    tensors, message = make()
    dim = -2 if tensors[0].ndim > 3 or tensors[0].shape[-2] != 5 else -2
    per_row = shifts3() if op == "shift_rows_" else keep3(tensors[0].shape[dim])
    before = [t.clone() for t in tensors]
    with torch_threads(threads), pytest.raises(ValueError, match=message):
        getattr(sk, op)(tensors, per_row, dim=dim, backend=backend)
    assert all(torch.equal(t, b) for t, b in zip(tensors, before))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["shift_rows_", "compact_rows_"])
def test_per_row_input_inside_a_written_tensor_is_refused(backend, op):
    mask = torch.ones(3, 6, dtype=torch.int64, device=DEVICE)
    if op == "shift_rows_":
        per_row, other = mask[:, 0], torch.randn(3, 6, device=DEVICE)
    else:
        flags = torch.ones(3, 2, 6, dtype=torch.bool, device=DEVICE)
        per_row, other = flags[:, 0], flags
    target = [mask] if op == "shift_rows_" else [other]
    before = [t.clone() for t in target]
    name = "shifts" if op == "shift_rows_" else "keep"
    with pytest.raises(ValueError, match=rf"tensors\[0\] and {name} share memory"):
        getattr(sk, op)(target, per_row, dim=-1, backend=backend)
    assert all(torch.equal(t, b) for t, b in zip(target, before))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["shift_rows_", "compact_rows_"])
def test_expanded_tensor_is_refused_everywhere(backend, op):
    x = torch.randn(1, 5, 2, device=DEVICE).expand(3, 5, 2)
    fine = torch.randn(3, 5, 2, device=DEVICE)
    before = fine.clone()
    per_row = shifts3() if op == "shift_rows_" else keep3()
    with pytest.raises(ValueError, match=r"tensors\[1\] overlaps itself"):
        getattr(sk, op)([fine, x], per_row, dim=1, backend=backend)
    assert torch.equal(fine, before)


@pytest.mark.parametrize("backend,threads", MOVE_BACKENDS)
def test_disjoint_interleaved_slab_views_are_accepted(backend, threads):
    """Layers of one [B, L, H, T, D] slab interleave row by row: their byte ranges overlap but no byte is
    shared, so they may go in one call (alone, or next to the whole slab's other layers)."""
    slab = torch.randn(3, 4, 2, 7, 2, device=DEVICE)
    want = slab.cpu().clone()
    shifts = torch.tensor([1, -2, 3])
    ref.shift_rows_(want, shifts, dim=-2, fill=0)
    views = [slab[:, 0], slab[:, 1], slab[:, 2:4]]
    with torch_threads(threads):
        sk.shift_rows_(views, shifts.to(DEVICE), dim=-2, backend=backend)
    assert torch.equal(slab.cpu(), want)
    # Two halves of the head dim of one tensor are disjoint too.
    x = torch.randn(3, 5, 4, device=DEVICE)
    want = x.cpu().clone()
    ref.shift_rows_(want, shifts, dim=1, fill=0)
    sk.shift_rows_([x[..., :2], x[..., 2:]], shifts.to(DEVICE), dim=1, backend=backend)
    assert torch.equal(x.cpu(), want)


# --------------------------------------------------------------------------------------- all or nothing

def refusal_cases():
    """(make() -> (tensors, fill), error pattern): the bad entry always comes after a good one, so a backend
    that wrote tensor by tensor would have modified the first before noticing."""
    def f32():
        return torch.randn(3, 5, 2, device=DEVICE)

    def leaf():
        return torch.randn(3, 5, 2, device=DEVICE, requires_grad=True)

    def view_of_leaf():
        return torch.randn(3, 6, 2, device=DEVICE, requires_grad=True)[:, 1:]

    cases = {
        "fill-f16": (lambda: ([f32(), f32().half()], 1e10), r"fill=10000000000\.0.*tensors\[1\].*float16"),
        "fill-fraction-int": (lambda: ([f32(), f32().to(torch.int64)], 0.5), r"fill=0\.5.*tensors\[1\].*int64.*integer"),
        "fill-int8": (lambda: ([f32(), f32().to(torch.int8)], 300), r"fill=300.*tensors\[1\].*int8"),
        "fill-bool": (lambda: ([f32(), f32() > 0], -7), r"fill=-7.*tensors\[1\].*bool"),
        "fill-2**70": (lambda: ([f32(), f32().to(torch.int64)], 2**70), r"fill=1180591620717411303424.*tensors\[0\]"),
        "fill-nan-int": (lambda: ([f32(), f32().to(torch.int64)], float("nan")), r"fill=nan.*tensors\[1\].*int64"),
        "fill-not-a-number": (lambda: ([f32(), f32()], "0"), r"fill must be a Python number"),
        "not-a-tensor": (lambda: ([f32(), "x"], 0), r"tensors\[1\] must be a torch.Tensor"),
        "expanded": (lambda: ([f32(), torch.randn(1, 5, 2, device=DEVICE).expand(3, 5, 2)], 0),
                     r"tensors\[1\] overlaps itself"),
        "aliased": (lambda: (lambda x: [x, f32(), x[:, :, :1]])(f32()), r"tensors\[0\] and tensors\[2\] share memory"),
        "grad-leaf": (lambda: ([f32(), leaf()], 0), r"tensors\[1\] is a leaf that requires grad"),
        "grad-view-of-leaf": (lambda: ([f32(), view_of_leaf()], 0), r"tensors\[1\] is a view of a leaf that requires"),
        "meta-entry": (lambda: ([f32(), f32().to("meta")], 0), r"tensors\[1\] is on meta"),
    }
    return [pytest.param(make, pattern, id=name) for name, (make, pattern) in cases.items()]


def unpack(made):
    return made if isinstance(made[1], (int, float, str)) else (made, 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make,pattern", refusal_cases())
@pytest.mark.parametrize("op", ["shift_rows_", "compact_rows_"])
def test_refused_call_writes_nothing(backend, make, pattern, op):
    tensors, fill = unpack(make())
    snapshot = [t.detach().clone() if isinstance(t, torch.Tensor) and t.device.type != "meta" else None
                for t in tensors]
    per_row = shifts3() if op == "shift_rows_" else keep3()
    with pytest.raises(ValueError, match=pattern):
        getattr(sk, op)(tensors, per_row, dim=1, fill=fill, backend=backend)
    for t, before in zip(tensors, snapshot):
        if before is not None:
            assert torch.equal(t.detach(), before), "a refused call modified a tensor"


# ---------------------------------------------------------------------------------------------- autograd

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["shift_rows_", "compact_rows_"])
def test_every_written_tensor_gets_a_new_version(backend, op):
    x, y = torch.randn(3, 5, 2, device=DEVICE), torch.randn(3, 5, device=DEVICE)
    before = (x._version, y._version)
    per_row = shifts3() if op == "shift_rows_" else keep3()
    getattr(sk, op)([x, y], per_row, dim=1, backend=backend)
    assert x._version > before[0] and y._version > before[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["shift_rows_", "compact_rows_"])
def test_saved_non_leaf_written_under_no_grad_fails_backward(backend, op):
    """exp saves its result for backward; writing that result in place must not give a silent wrong gradient."""
    x = torch.randn(3, 5, 2, device=DEVICE, requires_grad=True)
    y = x.exp()
    with torch.no_grad():
        getattr(sk, op)(y, shifts3() if op == "shift_rows_" else keep3(), dim=1, backend=backend)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["shift_rows_", "compact_rows_"])
def test_graph_tensor_written_in_grad_mode_has_no_gradient(backend, op):
    """A non-leaf in a graph (y = x * 2 saves nothing, so the version check alone would not fire) is written
    with the right values, and any backward through it raises instead of returning the unshifted gradient."""
    per_row = shifts3() if op == "shift_rows_" else keep3()
    x = torch.randn(3, 5, 2, device=DEVICE, requires_grad=True)
    slab = x * 2
    y = slab[:, :, :1]  # a view of a non-leaf, as the engine's cache views are
    want = y.detach().cpu().clone()
    getattr(ref, op)(want, per_row.cpu(), dim=1, fill=0)
    getattr(sk, op)([y, slab[:, :, 1:]], per_row, dim=1, backend=backend)
    assert torch.equal(y.detach().cpu(), want)
    for target in (y, slab, slab[:, :, 1:] * 3):
        with pytest.raises(RuntimeError, match=rf"{op} wrote this tensor in place and has no derivative"):
            target.sum().backward(retain_graph=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["shift_rows_", "compact_rows_"])
def test_saved_leaf_written_fails_backward(backend, op):
    """A plain tensor another op saved (t in w * t) may be written, and a leaf that requires grad may be written
    under no_grad (as an optimizer does); a backward that saved either then raises."""
    per_row = shifts3() if op == "shift_rows_" else keep3()
    w = torch.randn(3, 5, 2, device=DEVICE, requires_grad=True)
    t = torch.randn(3, 5, 2, device=DEVICE)
    z = (w * t).sum()
    getattr(sk, op)(t, per_row, dim=1, backend=backend)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    z = (w * w).sum()
    with torch.no_grad():
        getattr(sk, op)(w, per_row, dim=1, backend=backend)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


# ------------------------------------------------------------------------------------------- error types

@pytest.mark.parametrize("backend", BACKENDS)
def test_generator_must_be_a_generator(backend):
    case = sampling_case(2, 2, 7, seed=61)
    for bad in (0, "seed", torch.tensor(1)):
        with pytest.raises(ValueError, match=r"generator must be a torch.Generator"):
            sk.rejection_sample(*dev(case.draft_tokens, case.draft_probs, case.target_probs), generator=bad,
                                backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("inf"), 0.0, float("nan"), -1.0], ids=["inf", "zero", "nan", "negative"])
def test_exponential_must_be_finite_and_positive(backend, bad):
    """An infinite exponential would zero every score of its column (inf emitted id 0 even with p[0] = 0)."""
    p = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]], device=DEVICE)
    e = torch.tensor([[bad, 1.0]], device=DEVICE)
    with pytest.raises(ValueError, match=r"exponential must be finite and positive"):
        sk.rejection_sample(torch.tensor([[0]], device=DEVICE), None, p, uniform=torch.tensor([[0.5]], device=DEVICE),
                            exponential=e, backend=backend)


def meta_calls():
    m = torch.device("meta")
    drafts, logits, nd = greedy_case(2, 2, 5, seed=62)
    case = sampling_case(2, 2, 5, seed=63)
    return [
        pytest.param(lambda b: sk.accept_lengths(torch.ones(2, 2, dtype=torch.bool, device=m), backend=b),
                     r"matches is a meta tensor", id="accept_lengths"),
        pytest.param(lambda b: sk.verify_greedy(drafts.to(m), logits.to(m), backend=b), r"target_logits is a meta",
                     id="verify_greedy"),
        pytest.param(lambda b: sk.rejection_sample(case.draft_tokens.to(m), None, case.target_probs.to(m), backend=b),
                     r"target_probs is a meta", id="rejection_sample"),
        pytest.param(lambda b: sk.shift_rows_(torch.zeros(2, 3, device=m), torch.zeros(2, dtype=torch.int64,
                                                                                    device=m), dim=1, backend=b),
                     r"shifts is a meta", id="shift_rows_"),
        pytest.param(lambda b: sk.compact_rows_(torch.zeros(2, 3, device=m), torch.ones(2, 3, dtype=torch.bool,
                                                                                      device=m), dim=1, backend=b),
                     r"keep is a meta", id="compact_rows_"),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("call,pattern", meta_calls())
def test_meta_tensors_are_a_value_error(backend, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_the_reference_cannot_fill_is_refused_up_front(backend):
    """A dtype masked_fill_ does not implement (uint16 here) is refused before the float32 entry is written, for
    fill=0 too."""
    if not hasattr(torch, "uint16"):
        pytest.skip("no torch.uint16")
    x = torch.randn(3, 5, 2, device=DEVICE)
    before = x.clone()
    with pytest.raises(ValueError, match=r"fill=0 cannot be stored in tensors\[1\] \(dtype torch.uint16\)"):
        sk.shift_rows_([x, torch.zeros(3, 5, dtype=torch.uint16, device=DEVICE)], shifts3(), dim=1, backend=backend)
    assert torch.equal(x, before)


@pytest.mark.parametrize("backend,threads", MOVE_BACKENDS)
def test_many_interleaved_views_and_one_overlap(backend, threads):
    """48 layer views of one slab (their byte ranges all overlap, their bytes never do) go in one call; add a
    view that really overlaps one of them and the call is refused, naming that pair."""
    slab = torch.randn(2, 48, 1, 4, 2, device=DEVICE)
    views = [slab[:, i] for i in range(48)]
    want = slab.cpu().clone()
    shifts = torch.tensor([1, -1])
    ref.shift_rows_(want, shifts, dim=-2, fill=0)
    with torch_threads(threads):
        sk.shift_rows_(views, shifts.to(DEVICE), dim=-2, backend=backend)
    assert torch.equal(slab.cpu(), want)
    with pytest.raises(ValueError, match=r"tensors\[7\] and tensors\[48\] share memory"):
        sk.shift_rows_(views + [slab[:, 7, :, 1:]], shifts.to(DEVICE), dim=-2, backend=backend)
