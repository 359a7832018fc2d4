"""The slab KV cache and the ragged batch: same logits as transformers' DynamicCache, in-place writes, one
slab per model, realignment through sk.shift_rows_."""

import pytest
import torch
from transformers import DynamicCache

from conftest import backend_params
from specdec import SlabCache
from specdec.kv.ragged import RaggedKV
from specdec.models import tiny_model

FAMILIES = ["llama", "qwen2", "gpt2"]


def _model(family):
    return tiny_model(family, vocab_size=128, hidden_size=64, num_layers=3, seed=5)


def _prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 128, (n,), generator=g).tolist() for n in lengths]


class MaskSpy:
    """Records the 4-D masks and position ids the batch hands the model."""

    def __init__(self, state: RaggedKV):
        self.calls = []
        model = state.model

        def forward(**kw):
            self.calls.append((kw["input_ids"], kw["attention_mask"].clone(), kw["position_ids"].clone()))
            return model(**kw)
        state.model = forward


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_dynamic_cache_with_the_same_masks(family):
    # Same inputs, masks and positions; only the cache differs (slab views vs concatenated tensors), so the
    # logits must be bitwise equal.
    model = _model(family)
    g = torch.Generator().manual_seed(1)
    state = RaggedKV(model, 3, capacity=8)  # small: the steps below force two doublings
    spy = MaskSpy(state)
    ids = torch.zeros(3, 13, dtype=torch.long)
    prompts = _prompts((13, 1, 6), seed=2)
    for b, p in enumerate(prompts):
        ids[b, 13 - len(p):] = torch.tensor(p)
    ours = [state.forward(ids, [len(p) for p in prompts])]
    for n in (1, 5, 2, 1, 7):
        ours.append(state.forward(torch.randint(0, 128, (3, n), generator=g)))
    assert state.cache.capacity == 32
    dynamic = DynamicCache(config=model.config)
    for (x, mask, pos), got in zip(spy.calls, ours):
        want = model(input_ids=x, attention_mask=mask, position_ids=pos, cache=dynamic, use_cache=True).logits
        assert torch.equal(got, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_unpadded_logits_match_plain_transformers_path(family):
    # Against the plain path (transformers builds its own mask, or none, and may pick a different SDPA kernel
    # for grouped-query attention), results agree to float32 rounding only: 5e-5 absolute on logits of
    # magnitude ~10 (a few hundred ulps after three layers; 1.3e-5 is observed), with identical argmax.
    model = _model(family)
    p = _prompts((11,), seed=3)[0]
    steps = [torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(n)) for n in (1, 3, 1)]
    dynamic = DynamicCache(config=model.config)
    want = [model(torch.tensor([p]), cache=dynamic, use_cache=True).logits]
    want += [model(s, cache=dynamic, use_cache=True).logits for s in steps]
    state, first = RaggedKV.prefill(model, [p], 0, logits_to_keep=0)
    got = [first] + [state.forward(s) for s in steps]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=5e-5)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_realigned_rows_continue_like_each_row_alone(family, backend):
    # Write 4 columns per row, keep a different number per row, realign, continue: each row's next logits
    # equal those of its surviving tokens run alone (no padding) through DynamicCache.
    model = _model(family)
    prompts = _prompts((9, 2, 15, 5), seed=4)
    state, _ = RaggedKV.prefill(model, prompts, 4, backend=backend)
    block = torch.randint(0, 128, (4, 4), generator=torch.Generator().manual_seed(5))
    state.forward(block)
    drop = [3, 0, 1, 2]
    shifts = state.drop_and_align(drop)
    assert shifts == [3, 0, 1, 2]
    assert state.seq_len.tolist() == [len(p) + 4 - d for p, d in zip(prompts, drop)]
    assert state.lengths == state.seq_len.tolist()  # the host copy agrees
    nxt = torch.randint(0, 128, (4, 2), generator=torch.Generator().manual_seed(6))
    got = state.forward(nxt)
    for b, p in enumerate(prompts):
        row = p + block[b, :4 - drop[b]].tolist() + nxt[b].tolist()
        want = model(torch.tensor([row])).logits[0, -2:]
        # Padding and batching change SDPA's kernel and reduction lengths: float32 rounding, as above.
        torch.testing.assert_close(got[b], want, rtol=0, atol=5e-5)
        assert torch.equal(got[b].argmax(-1), want.argmax(-1))


def test_one_slab_written_in_place():
    model = _model("llama")
    cache = SlabCache.for_model(model, batch=2, capacity=64)
    assert cache.slab.shape == (2, 2 * 3, 2, 64, 16)
    state, _ = RaggedKV.prefill(model, _prompts((5, 3), seed=7), 40)
    slab = state.cache.slab
    ptr = slab.data_ptr()
    for _ in range(6):
        state.forward(torch.ones(2, 2, dtype=torch.long))
    assert state.cache.slab.data_ptr() == ptr, "a step within capacity must not reallocate"
    for i, layer in enumerate(state.cache.layers):
        assert layer.keys.untyped_storage().data_ptr() == slab.untyped_storage().data_ptr()
        assert torch.equal(layer.keys, slab[:, 2 * i, :, state.start:state.length])
        assert torch.equal(layer.values, slab[:, 2 * i + 1, :, state.start:state.length])


def test_growth_by_doubling_keeps_contents_and_drops_common_padding():
    model = _model("qwen2")
    state, _ = RaggedKV.prefill(model, _prompts((20, 2), seed=8), 0)
    cap = state.cache.capacity
    before = state.cache.live().clone()
    state.select_rows(torch.tensor([1]))  # the long row leaves: its padding columns are dropped
    assert state.length - state.start == 2
    assert torch.equal(state.cache.live(), before[1:, ..., -2:, :])
    state.forward(torch.ones(1, cap, dtype=torch.long))
    assert state.cache.capacity == 2 * cap
    assert state.start == 0 and state.length == cap + 2
    assert torch.equal(state.cache.slab[..., :2, :], before[1:, ..., -2:, :])


@pytest.mark.parametrize("backend", backend_params())
def test_mask_mode_leaves_holes_then_compacts(backend):
    model = _model("llama")
    prompts = _prompts((3, 6), seed=9)
    state, _ = RaggedKV.prefill(model, prompts, 64, backend=backend, realign="mask")
    want_rows = [list(p) for p in prompts]
    g = torch.Generator().manual_seed(10)
    compacted = False
    for step in range(14):
        block = torch.randint(0, 128, (2, 4), generator=g)
        state.forward(block)
        drop = torch.tensor([3, 0] if step % 2 else [0, 3])
        width_before = state.length - state.start
        state.drop_and_align(drop)
        for b in range(2):
            want_rows[b] += block[b, :4 - int(drop[b])].tolist()
        compacted |= state.length - state.start < width_before - int(drop.min())
        assert state.seq_len.tolist() == [len(r) for r in want_rows]
        assert state.mask[:, state.start:state.length].sum(1).tolist() == [len(r) for r in want_rows]
    assert compacted, "holes never triggered a compaction"
    nxt = torch.randint(0, 128, (2, 1), generator=g)
    got = state.forward(nxt)
    for b in range(2):
        want = model(torch.tensor([want_rows[b] + nxt[b].tolist()])).logits[0, -1]
        torch.testing.assert_close(got[b, -1], want, rtol=0, atol=5e-5)  # float32 rounding, as above
