"""pytest-benchmark microbenchmarks of every op on every backend at realistic sizes (`make bench`).

Sizes: rejection sampling and greedy verification at B=8, K=4, V=32000; shifting and compacting a 24-layer
cache (keys and values, [8, 4, 512, 64] float32) with shifts 0..4, next to a plain copy of the same bytes.
For ratios measured side by side in one process use bench/compare_ops.py.
"""

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.microbench import backends_for, kv_cache
from specdec_kernels.noise import draw_noise

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BACKENDS = backends_for(DEVICE)
B, K, V = 8, 4, 32000


@pytest.fixture(scope="module")
def sampling_inputs():
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    p = torch.softmax(torch.randn(B, K + 1, V, generator=gen, device=DEVICE), -1)
    q = torch.softmax(torch.randn(B, K, V, generator=gen, device=DEVICE), -1)
    drafts = torch.multinomial(q.view(-1, V), 1, generator=gen).view(B, K)
    uniform, exponential = draw_noise(B, K, V, DEVICE, gen)
    return drafts, q, p, uniform, exponential


@pytest.fixture(scope="module")
def cache():
    return kv_cache(24, 8, 4, 512, 64, DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejection_sample(benchmark, backend, sampling_inputs):
    drafts, q, p, uniform, exponential = sampling_inputs
    benchmark(sk.rejection_sample, drafts, q, p, uniform=uniform, exponential=exponential, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_greedy(benchmark, backend, sampling_inputs):
    drafts, _, p, _, _ = sampling_inputs
    benchmark(sk.verify_greedy, drafts, p, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_accept_lengths(benchmark, backend):
    matches = torch.rand(256, 8, device=DEVICE) < 0.8
    benchmark(sk.accept_lengths, matches, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shift_rows_cache(benchmark, backend, cache):
    shifts = (torch.arange(8, device=DEVICE) % 5).to(torch.int64)
    benchmark(sk.shift_rows_, cache, shifts, dim=-2, backend=backend)


def test_shift_rows_cache_copy_floor(benchmark, cache):
    src = [x.clone() for x in cache]
    benchmark(lambda: [d.copy_(s) for d, s in zip(cache, src)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_compact_rows_cache(benchmark, backend, cache):
    keep = torch.rand(8, 512, device=DEVICE) < 0.9
    benchmark(sk.compact_rows_, cache, keep, dim=-2, backend=backend)
