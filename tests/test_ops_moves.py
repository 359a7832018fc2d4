"""shift_rows_ and compact_rows_: in place, every backend equal to the reference, the reference equal to the naive
per-row loop (specdec_kernels/moves/naive.py), neighbours of views untouched, mixed dtypes and lengths in one call."""

import pytest
import torch
from conftest import DEVICE, backend_params, run_inplace
from kernel_cases import move_backend_params, torch_threads

import specdec_kernels as sk
from specdec_kernels import reference as ref
from specdec_kernels.moves import naive

BACKENDS = backend_params()
MOVE_BACKENDS = move_backend_params()  # cpp also at 2 threads
FILL = -7  # vacated positions get a value no input holds, so an unwritten position shows


def random_tensor(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 1000, shape, generator=gen).to(dtype)


DTYPES = [pytest.param(d, id=str(d).replace("torch.", "")) for d in
          (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool)]
# (B, T, extra dims after T): B=1, T=63, a large batch, a bare [B, T] mask-like tensor.
MOVE_SHAPES = [
    pytest.param(1, 63, (3,), id="B1-T63-D3"),
    pytest.param(4, 17, (2, 5), id="B4-T17-H2D5"),
    pytest.param(33, 8, (4,), id="B33-T8-D4"),
    pytest.param(5, 31, (), id="B5-T31-mask"),
]


def shifts_for(batch, length, gen):
    """Zero, full-length, beyond-length and negative shifts, plus random ones."""
    s = torch.randint(-length, length + 1, (batch,), generator=gen)
    specials = [0, length, -length, length + 3, 1, -1]
    s[: min(batch, len(specials))] = torch.tensor(specials[:batch])
    return s


@pytest.mark.parametrize("batch,length,inner", MOVE_SHAPES)
def test_reference_shift_matches_naive_loop(batch, length, inner):
    gen = torch.Generator().manual_seed(11)
    x = random_tensor((batch, length, *inner), torch.float32, gen)
    shifts = shifts_for(batch, length, gen)
    want = naive.shift_rows(x, shifts, 1, FILL)
    ref.shift_rows_(x, shifts, dim=1, fill=FILL)
    assert torch.equal(x, want)


@pytest.mark.parametrize("batch,length,inner", MOVE_SHAPES)
def test_reference_compact_matches_naive_loop(batch, length, inner):
    gen = torch.Generator().manual_seed(12)
    x = random_tensor((batch, length, *inner), torch.float32, gen)
    keep = torch.rand(batch, length, generator=gen) < 0.6
    keep[0] = True
    if batch > 1:
        keep[1] = False
    want = naive.compact_rows(x, keep, 1, FILL)
    kept = ref.compact_rows_(x, keep, dim=1, fill=FILL)
    assert torch.equal(x, want) and torch.equal(kept, keep.sum(1))


@pytest.mark.parametrize("backend,threads", MOVE_BACKENDS)
@pytest.mark.parametrize("batch,length,inner", MOVE_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_shift_rows_equals_reference(backend, threads, batch, length, inner, dtype):
    gen = torch.Generator().manual_seed(13)
    x = random_tensor((batch, length, *inner), dtype, gen)
    shifts = shifts_for(batch, length, gen)
    fill = True if dtype == torch.bool else FILL
    want = x.clone()
    ref.shift_rows_(want, shifts, dim=1, fill=fill)
    with torch_threads(threads):
        run_inplace(sk.shift_rows_, x, shifts, dim=1, fill=fill, backend=backend)
    assert torch.equal(x, want)


@pytest.mark.parametrize("backend,threads", MOVE_BACKENDS)
@pytest.mark.parametrize("batch,length,inner", MOVE_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_compact_rows_equals_reference(backend, threads, batch, length, inner, dtype):
    gen = torch.Generator().manual_seed(14)
    x = random_tensor((batch, length, *inner), dtype, gen)
    keep = torch.rand(batch, length, generator=gen) < 0.5
    keep[0] = False
    keep[-1] = True
    fill = False if dtype == torch.bool else FILL
    want = x.clone()
    want_kept = ref.compact_rows_(want, keep, dim=1, fill=fill)
    with torch_threads(threads):
        kept = run_inplace(sk.compact_rows_, x, keep, dim=1, fill=fill, backend=backend)
    assert torch.equal(kept, want_kept)
    assert torch.equal(x, want)


def cache_like(batch, gen, device=torch.device("cpu")):
    """What the engine shifts: per-layer keys/values as views into bigger buffers, two disjoint slices of one
    slab that interleave row by row (layer 1, then layers 2-3 of a [B, layers, H, T, D] slab), a transposed
    tensor, in several dtypes and lengths, together in one call (built on the CPU, views taken on `device`).
    The views never share memory: overlapping views are refused (test_ops_contract.py)."""
    buffers = [random_tensor((batch, 2, 40, 4), torch.float32, gen).to(device),
               random_tensor((batch, 2, 40, 4), torch.float16, gen).to(device)]
    slab = random_tensor((batch, 4, 2, 24, 3), torch.bfloat16, gen).to(device)
    views = [buffers[0][:, :, :29, :], buffers[1][:, :, 5:34, :], slab[:, 1, :, :20, :], slab[:, 2:, :, :20, :],
             random_tensor((batch, 3, 29, 2), torch.int64, gen).to(device).transpose(1, 3)]  # [B, 2, 29, 3]
    return buffers, slab, views


@pytest.mark.parametrize("backend,threads", MOVE_BACKENDS)
@pytest.mark.parametrize("batch", [1, 6], ids=["B1", "B6"])
def test_shift_many_views_in_one_call(backend, threads, batch):
    gen = torch.Generator().manual_seed(15 + batch)
    buffers, slab, views = cache_like(batch, gen, DEVICE)
    want_buffers, want_slab, want_views = cache_like(batch, torch.Generator().manual_seed(15 + batch))
    shifts = torch.randint(-3, 6, (batch,), generator=gen)
    shifts[0] = 2
    ref.shift_rows_(want_views, shifts, dim=-2, fill=FILL)
    shifts = shifts.to(DEVICE)
    with torch_threads(threads):
        run_inplace(sk.shift_rows_, views, shifts, dim=-2, fill=FILL, backend=backend)
    for got, want in zip(views, want_views):
        assert torch.equal(got.cpu(), want)
    # Everything outside the views (the rest of each buffer) is untouched.
    for got, want in zip(buffers + [slab], want_buffers + [want_slab]):
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("backend,threads", MOVE_BACKENDS)
def test_compact_many_views_in_one_call(backend, threads):
    gen = torch.Generator().manual_seed(16)
    buffers, slab, views = cache_like(5, gen, DEVICE)
    want_buffers, want_slab, want_views = cache_like(5, torch.Generator().manual_seed(16))
    pick = (0, 1, 4)  # the views of length 29 along dim -2
    views, want_views = [views[i] for i in pick], [want_views[i] for i in pick]
    keep = torch.rand(5, 29, generator=gen).to(DEVICE) < 0.4
    want_kept = ref.compact_rows_(want_views, keep.cpu(), dim=-2, fill=FILL)
    with torch_threads(threads):
        kept = run_inplace(sk.compact_rows_, views, keep, dim=-2, fill=FILL, backend=backend)
    assert torch.equal(kept, want_kept)
    for got, want in zip(buffers + [slab] + views, want_buffers + [want_slab] + want_views):
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_and_cache_shift_agree(backend):
    """A right-aligned batch: shifting mask (dim=-1) and cache (dim=-2) keeps them consistent."""
    batch, length = 4, 12
    valid = torch.tensor([12, 7, 3, 9])
    mask = (torch.arange(length)[None, :] >= length - valid[:, None]).to(torch.int64)
    cache = torch.arange(batch * length, dtype=torch.float32).view(batch, 1, length, 1) * mask.view(batch, 1, length, 1)
    shifts = torch.tensor([0, 2, 5, 1])
    run_inplace(sk.shift_rows_, mask, shifts, dim=-1, fill=0, backend=backend)
    run_inplace(sk.shift_rows_, cache, shifts, dim=-2, fill=0, backend=backend)
    assert mask.sum(1).tolist() == [12, 5, 0, 8]
    assert torch.equal(cache.view(batch, length) != 0, mask.bool() & (cache.view(batch, length) != 0))


@pytest.mark.parametrize("backend,threads", MOVE_BACKENDS)
@pytest.mark.parametrize("op", ["shift", "compact"])
def test_rows_big_enough_to_split_across_threads(backend, threads, op):
    """Enough bytes per call (1.5 MiB over 3 tensors) that the cpp backend really hands lines to 2 threads;
    interleaved slab views and a transposed tensor, so a worker that strayed into another's row would show."""
    if backend == "triton" and DEVICE.type == "cpu":
        pytest.skip("the interpreter runs programs one after another: no race to find, and slow at this size")
    gen = torch.Generator().manual_seed(17)
    slab = random_tensor((8, 2, 4, 256, 32), torch.float32, gen)
    other = random_tensor((8, 32, 256, 4), torch.float16, gen).transpose(1, 3)  # [8, 4, 256, 32]
    want = [slab[:, 0].clone(), slab[:, 1].clone(), other.clone()]
    got_slab, got_other = slab.to(DEVICE), other.to(DEVICE)  # .to keeps the transposed strides
    tensors = [got_slab[:, 0], got_slab[:, 1], got_other]
    with torch_threads(threads):
        if op == "shift":
            shifts = torch.tensor([0, 1, 2, 3, 4, -1, 256, -300])
            ref.shift_rows_(want, shifts, dim=-2, fill=FILL)
            sk.shift_rows_(tensors, shifts.to(DEVICE), dim=-2, fill=FILL, backend=backend)
        else:
            keep = torch.rand(8, 256, generator=gen) < 0.7
            ref.compact_rows_(want, keep, dim=-2, fill=FILL)
            sk.compact_rows_(tensors, keep.to(DEVICE), dim=-2, fill=FILL, backend=backend)
    for g, w in zip(tensors, want):
        assert torch.equal(g.cpu(), w)
