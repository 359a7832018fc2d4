"""One step's cache update at growing context lengths: the engine's slab cache writes K+1 new columns in place
(flat in the length), transformers' DynamicCache concatenates (grows with the length). 24 layers, batch 8,
4 KV heads, head_dim 64, float32, 5 new columns per step."""

import pytest
import torch
from transformers import DynamicCache

from specdec.kv.slab import SlabCache

LAYERS, BATCH, HEADS, DIM, NEW = 24, 8, 4, 64, 5
LENGTHS = [128, 1024, 4096]


def _new_kv():
    return torch.randn(BATCH, HEADS, NEW, DIM), torch.randn(BATCH, HEADS, NEW, DIM)


@pytest.mark.parametrize("length", LENGTHS)
def test_slab_cache_step(benchmark, length):
    cache = SlabCache(BATCH, LAYERS, HEADS, DIM, capacity=length + 64)
    cache.length = length  # pretend `length` columns are live
    k, v = _new_kv()

    def step():
        cache.reserve(NEW)
        for i, layer in enumerate(cache.layers):
            layer.update(k, v)
        cache.pending = 0  # keep the length fixed so every round measures the same step

    benchmark(step)


@pytest.mark.parametrize("length", LENGTHS)
def test_dynamic_cache_step(benchmark, length):
    k0, v0 = torch.randn(BATCH, HEADS, length, DIM), torch.randn(BATCH, HEADS, length, DIM)
    k, v = _new_kv()

    def setup():
        cache = DynamicCache()
        for i in range(LAYERS):
            cache.update(k0, v0, i)
        return (cache,), {}

    def step(cache):
        for i in range(LAYERS):
            cache.update(k, v, i)

    benchmark.pedantic(step, setup=setup, rounds=10)
