"""Every op on every backend honours the layout of every input: contiguous, transposed, strided (every dim
[::2]), expanded (broadcast along the batch) and offset views, one input at a time and all at once, compared
with the reference on contiguous copies by torch.equal. In-place tensors that are expanded overlap themselves
and are refused (ValueError, nothing written); an expanded shifts/keep is fine (it is only read). Strided and
offset views of in-place tensors sit inside a sentinel-filled buffer, and the memory around them must stay
untouched. Shapes are tiny: the Triton interpreter runs every program in Python."""

import pytest
import torch
from conftest import DEVICE, backend_params
from kernel_cases import greedy_case, sampling_case

import specdec_kernels as sk
from specdec_kernels import reference as ref

BACKENDS = backend_params()
LAYOUTS = ["contiguous", "transposed", "strided", "expanded", "offset"]
SENTINEL = 77


def layout(x: torch.Tensor, kind: str, device=DEVICE):
    """(a tensor on `device` with x's values, or x's first row broadcast for "expanded", in layout `kind`;
    the buffer that holds it, filled with SENTINEL outside the view)."""
    if kind == "contiguous":
        y = x.to(device).contiguous()
        return y, y
    if kind == "expanded":
        y = x[:1].to(device).clone().expand(x.shape)
        return y, y
    if kind == "transposed":
        if x.ndim == 1:  # a column of a matrix: stride 3, offset 1
            base = torch.full((x.shape[0], 3), SENTINEL, dtype=x.dtype, device=device)
            y = base[:, 1]
        else:
            dims = list(range(x.ndim))[::-1]
            base = torch.full([x.shape[d] for d in dims], SENTINEL, dtype=x.dtype, device=device)
            y = base.permute(dims)
    elif kind == "strided":
        base = torch.full([2 * n + 1 for n in x.shape], SENTINEL, dtype=x.dtype, device=device)
        y = base[tuple(slice(1, 2 * n + 1, 2) for n in x.shape)]
    elif kind == "offset":
        base = torch.full((x.numel() + 3,), SENTINEL, dtype=x.dtype, device=device)
        y = base[3:].view(x.shape)
    else:
        raise AssertionError(kind)
    y.copy_(x.to(device))
    return y, base


def contiguous_cpu(x):
    return None if x is None else x.cpu().contiguous()


def equal(a, b):
    return all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b)) if isinstance(a, tuple) else \
        torch.equal(a.cpu(), b.cpu())


def targets(names):
    return [pytest.param(n, id=n) for n in names] + [pytest.param("all", id="all")]


def with_layout(inputs: dict, target: str, kind: str) -> dict:
    return {name: (layout(x, kind)[0] if x is not None and target in (name, "all") else
                   (x.to(DEVICE) if x is not None else None)) for name, x in inputs.items()}


# ------------------------------------------------------------------------------------------- sampling ops

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("target", targets(["matches", "num_draft"]))
def test_accept_lengths_layouts(backend, kind, target):
    gen = torch.Generator().manual_seed(51)
    inputs = dict(matches=torch.rand(3, 4, generator=gen) < 0.7, num_draft=torch.tensor([4, 1, 3]))
    args = with_layout(inputs, target, kind)
    got = sk.accept_lengths(args["matches"], args["num_draft"], backend=backend)
    want = ref.accept_lengths(contiguous_cpu(args["matches"]), contiguous_cpu(args["num_draft"]))
    assert equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("target", targets(["draft_tokens", "target_logits", "num_draft"]))
def test_verify_greedy_layouts(backend, kind, target):
    drafts, logits, _ = greedy_case(3, 3, 11, seed=52, ragged=False)
    num_draft = torch.tensor([1, 3, 2])
    args = with_layout(dict(draft_tokens=drafts, target_logits=logits, num_draft=num_draft), target, kind)
    got = sk.verify_greedy(args["draft_tokens"], args["target_logits"], args["num_draft"], backend=backend)
    want = ref.verify_greedy(*(contiguous_cpu(args[n]) for n in ("draft_tokens", "target_logits", "num_draft")))
    assert equal(got, want)


SAMPLING_INPUTS = ["draft_tokens", "draft_probs", "target_probs", "num_draft", "uniform", "exponential"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("target", targets(SAMPLING_INPUTS))
def test_rejection_sample_layouts(backend, kind, target):
    case = sampling_case(3, 3, 11, seed=53, ragged=False)
    inputs = dict(draft_tokens=case.draft_tokens, draft_probs=case.draft_probs, target_probs=case.target_probs,
                  num_draft=torch.tensor([2, 3, 0]), uniform=case.uniform, exponential=case.exponential)
    args = with_layout(inputs, target, kind)
    got = sk.rejection_sample(args["draft_tokens"], args["draft_probs"], args["target_probs"], args["num_draft"],
                              uniform=args["uniform"], exponential=args["exponential"], backend=backend)
    plain = {n: contiguous_cpu(v) for n, v in args.items()}
    want = ref.rejection_sample(plain["draft_tokens"], plain["draft_probs"], plain["target_probs"],
                                plain["num_draft"], uniform=plain["uniform"], exponential=plain["exponential"])
    assert equal(got, want)


# ---------------------------------------------------------------------------------------------- row moves

def move_inputs(gen):
    """Two tensors of one call, of different dtypes and ranks, both with T=6 along dim=-2."""
    x = torch.randint(-50, 50, (3, 2, 6, 4), generator=gen).float()
    y = torch.randint(-50, 50, (3, 6, 2), generator=gen).to(torch.int32)
    return [x, y]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("target", targets(["tensors", "shifts"]))
@pytest.mark.parametrize("op", ["shift_rows_", "compact_rows_"])
def test_row_moves_layouts(backend, kind, target, op):
    gen = torch.Generator().manual_seed(54)
    plain = move_inputs(gen)
    per_row = torch.tensor([2, -1, 6]) if op == "shift_rows_" else torch.rand(3, 6, generator=gen) < 0.5
    moved = [layout(x, kind) if target in ("tensors", "all") else (x.to(DEVICE),) * 2 for x in plain]
    tensors, bases = [m[0] for m in moved], [m[1] for m in moved]
    rows = layout(per_row, kind)[0] if target in ("shifts", "all") else per_row.to(DEVICE)
    fn = getattr(sk, op)
    if kind == "expanded" and target in ("tensors", "all"):
        before = [b.clone() for b in bases]
        with pytest.raises(ValueError, match=r"tensors\[0\] overlaps itself"):
            fn(tensors, rows, dim=-2, fill=-9, backend=backend)
        assert all(torch.equal(b, c) for b, c in zip(bases, before)), "a refused call wrote something"
        return
    want = [t.cpu().clone() for t in tensors]
    want_out = getattr(ref, op)(want, contiguous_cpu(rows), dim=-2, fill=-9)
    out = fn(tensors, rows, dim=-2, fill=-9, backend=backend)
    for t, w in zip(tensors, want):
        assert torch.equal(t.cpu(), w)
    if op == "compact_rows_":
        assert torch.equal(out.cpu(), want_out)
    if kind in ("strided", "transposed", "offset") and target in ("tensors", "all"):
        for t, b in zip(tensors, bases):  # the memory around each view still holds the sentinel
            outside = torch.ones_like(b, dtype=torch.bool)
            mask_view = outside.as_strided(t.shape, t.stride(), t.storage_offset() - b.storage_offset())
            mask_view.fill_(False)
            assert (b[outside] == SENTINEL).all(), "a write landed outside the view"
