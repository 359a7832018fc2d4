"""realign="mask": rejected columns stay as holes, positions count real tokens, compaction now and then.

Two levels. RaggedKV with a stub model whose keys and values are a function of (token, position, layer) only,
so a hole run and a shift run of the same sequences must hold bit-identical real columns, masks and
positions: any bookkeeping slip shows as an inequality, not as a rounding question. Then the engine: greedy
output token-exact, sampling identical to shift under the same seed, the draft cache's holes right (same
acceptance as shift), with the compaction count asserted both where it triggers several times and where it
never does.
"""

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig

from conftest import backend_params
from engine_models import draft, prompts, reference, target
from specdec import SpeculativeDecoder
from specdec.kv.ragged import COMPACT_THRESHOLD, RaggedKV
from test_engine_sampling import PROMPT, chi_square_p, exact_joint, small_draft, small_target

K = 4
LAYERS, HEAD_DIM = 2, 4


class StubLM(torch.nn.Module):
    """Writes keys and values determined by (token, position, layer) alone (integers, exact in float32) and
    records the masks and position ids it is handed. No mask (a window without padding or holes) is recorded as
    the causal mask over the cache that transformers would build in its place."""

    def __init__(self):
        super().__init__()
        self.config = LlamaConfig(vocab_size=64, hidden_size=2 * HEAD_DIM, num_hidden_layers=LAYERS,
                                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # RaggedKV reads device and dtype from parameters
        self.calls = []

    def forward(self, input_ids, attention_mask, position_ids, cache, use_cache, logits_to_keep):
        if attention_mask is None:
            n = input_ids.shape[1]
            past = cache.get_mask_sizes(n, 0)[0] - n
            q, kv = torch.arange(past, past + n), torch.arange(past + n)
            attention_mask = (kv[None, :] <= q[:, None]).expand(input_ids.shape[0], 1, n, past + n)
        self.calls.append((attention_mask.clone(), position_ids.clone()))
        base = (input_ids * 4096 + position_ids).float()[:, None, :, None] * 16  # < 2**23
        for i, layer in enumerate(cache.layers):
            k = base + torch.arange(HEAD_DIM) + 4 * i
            layer.update(k, -k)
        n = logits_to_keep or input_ids.shape[1]
        return SimpleNamespace(logits=torch.zeros(input_ids.shape[0], n, 1))


def real_columns(state: RaggedKV) -> torch.Tensor:
    """Every row's real keys and values in order, holes and padding left out: [tokens, 2 * layers, H, D]."""
    window = state.mask[:, state.start:state.length]
    return state.cache.live().permute(0, 3, 1, 2, 4)[window]


def assert_same_window(holes: RaggedKV, shifted: RaggedKV) -> None:
    """A compacted hole run equals the run that never had holes: window, mask, lengths, real columns."""
    assert holes.length - holes.start == shifted.length - shifted.start
    assert torch.equal(holes.mask[:, holes.start:holes.length], shifted.mask[:, shifted.start:shifted.length])
    assert torch.equal(holes.seq_len, shifted.seq_len)
    assert torch.equal(real_columns(holes), real_columns(shifted))


def _ids(g, rows, n):
    return torch.randint(0, 64, (rows, n), generator=g)


@pytest.mark.parametrize("backend", backend_params())
def test_holes_then_compaction_equal_a_run_that_shifted(backend):
    # Same prompts, same blocks, same drops, evictions and a refill, in both modes; a small starting capacity
    # so that relocation and growth happen along the way. The hole run compacts on the backend under test;
    # the shift run is the reference (torch), which also keeps the interpreted triton run to a few launches.
    g = torch.Generator().manual_seed(1)
    ps = [_ids(g, 1, n)[0].tolist() for n in (5, 1, 12, 3)]
    holes_model, shift_model = StubLM(), StubLM()
    holes, _ = RaggedKV.prefill(holes_model, ps, 8, backend=backend, realign="mask", compact_threshold=0.15)
    shifted, _ = RaggedKV.prefill(shift_model, ps, 8, backend="torch", realign="shift")
    compactions, compared_masks, saw_holes = 0, 0, False
    for step in range(48):
        block = _ids(g, holes.batch, K + 1)
        holes.forward(block)
        shifted.forward(block)
        # positions count real tokens, holes or not: always equal
        assert torch.equal(holes_model.calls[-1][1], shift_model.calls[-1][1])
        if holes.compactions > compactions:  # the step before compacted: the next forward's mask is the same
            assert torch.equal(holes_model.calls[-1][0], shift_model.calls[-1][0])
            compared_masks += 1
        compactions = holes.compactions
        drop = torch.randint(0, K + 1, (holes.batch,), generator=g)
        holes.drop_and_align(drop)
        shifted.drop_and_align(drop)
        assert torch.equal(holes.seq_len, shifted.seq_len)
        assert torch.equal(holes.mask[:, holes.start:holes.length].sum(1), holes.seq_len)
        assert torch.equal(real_columns(holes), real_columns(shifted))
        saw_holes |= holes.length - holes.start > int(holes.seq_len.max())
        if holes.compactions > compactions:
            assert_same_window(holes, shifted)
        if step == 15:  # evict row 1
            keep = torch.tensor([0, 2, 3])
            holes.select_rows(keep)
            shifted.select_rows(keep)
        if step == 27:  # refill row 0 with a prompt longer than the live window could be
            p = _ids(g, 1, 70)[0].tolist()
            for state, model in ((holes, holes_model), (shifted, shift_model)):
                src, _ = RaggedKV.prefill(model, [p], 0, backend=state.backend, realign=state.realign)
                state.place(torch.tensor([0]), src)
            assert torch.equal(real_columns(holes), real_columns(shifted))
    assert saw_holes
    assert holes.compactions >= 4 and compared_masks >= 3
    holes.compact()  # an explicit compaction at any point lands where shift is
    assert_same_window(holes, shifted)


def test_holes_never_make_the_buffer_grow():
    # A threshold no window reaches: compaction only where the buffer would otherwise grow, so the hole run
    # never holds a bigger buffer than the run that shifts.
    g = torch.Generator().manual_seed(2)
    ps = [_ids(g, 1, n)[0].tolist() for n in (3, 9, 1)]
    holes, _ = RaggedKV.prefill(StubLM(), ps, 4, realign="mask", compact_threshold=1e9)
    shifted, _ = RaggedKV.prefill(StubLM(), ps, 4, realign="shift")
    for _ in range(60):
        block = _ids(g, 3, K + 1)
        holes.forward(block)
        shifted.forward(block)
        drop = torch.randint(0, K + 1, (3,), generator=g)
        holes.drop_and_align(drop)
        shifted.drop_and_align(drop)
        assert holes.cache.capacity <= shifted.cache.capacity
        assert torch.equal(real_columns(holes), real_columns(shifted))
    assert holes.compactions >= 2


def test_compact_threshold_validation():
    with pytest.raises(ValueError, match="compact_threshold"):
        SpeculativeDecoder(target("llama"), draft("llama", "agree"), realign="mask", compact_threshold=0)
    for bad in (-0.5, float("nan"), True, "0.25"):
        with pytest.raises(ValueError, match="compact_threshold"):
            RaggedKV(StubLM(), 1, 8, realign="mask", compact_threshold=bad)
    dec = SpeculativeDecoder(target("llama"), draft("llama", "agree"), realign="mask")
    assert dec.compact_threshold == COMPACT_THRESHOLD


MIX = (5, 1, 38, 12, 3, 21, 64)


def _generate(family, realign, threshold=None, k=K, batch_size=3, max_new=40, lengths=MIX, prompt_seed=70, **kw):
    dec = SpeculativeDecoder(target(family), draft(family, "agree"), num_draft_tokens=k, realign=realign,
                             compact_threshold=threshold, adaptive=False)
    return dec.generate(prompts(lengths, prompt_seed), max_new_tokens=max_new, batch_size=batch_size,
                        eos_token_id=[], **kw)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_exact_with_many_compactions(family):
    # 7 prompts through 3 rows: evictions and refills with holes in the target's and the draft's caches.
    res = _generate(family, "mask", threshold=0.05)
    assert res.sequences == reference(family, prompts(MIX, 70), 40)
    assert res.stats["compactions"] >= 6 and res.stats["ragged_steps"] > 0
    # The draft's cache with holes proposes what it proposes after shifting: same acceptance, step by step.
    shifted = _generate(family, "shift")
    assert res.stats["accept_histogram"] == shifted.stats["accept_histogram"]
    assert shifted.stats["compactions"] == 0


def test_greedy_exact_with_no_compaction():
    # Long prompts, few new tokens: the holes stay below a quarter of the window, so nothing ever moves.
    lengths = (60, 90, 75, 64)
    res = _generate("qwen2", "mask", threshold=0.25, max_new=10, lengths=lengths, prompt_seed=71)
    assert res.stats["compactions"] == 0
    assert res.stats["ragged_steps"] > 0, "no holes were made"
    assert res.sequences == reference("qwen2", prompts(lengths, 71), 10)


def test_sampling_identical_to_shift_under_the_same_seed():
    # The noise is drawn in the same order whatever the realignment; only where the caches hold their columns
    # differs. Same tokens as shift, whose distribution the sampling tests establish.
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, seed=5)
    holes = _generate("llama", "mask", threshold=0.05, **kw)
    assert holes.stats["compactions"] >= 6
    assert holes.sequences == _generate("llama", "shift", **kw).sequences


def test_sampled_distribution_with_compactions():
    # Thousands of copies of one prompt accept different lengths; a threshold of 0.01 compacts after every
    # ragged step, so the distribution is checked through holes and compactions alike.
    n, depth, k = 6000, 3, 3
    dec = SpeculativeDecoder(small_target(), small_draft(), num_draft_tokens=k, realign="mask",
                             compact_threshold=0.01, adaptive=False)
    res = dec.generate([PROMPT] * n, max_new_tokens=depth, batch_size=n, eos_token_id=[], do_sample=True, seed=8)
    counts: dict = {}
    for s in res.sequences:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    assert res.stats["compactions"] > 0
    assert chi_square_p(counts, exact_joint(small_target(), depth, 1.0, 0, 1.0), n) > 1e-3
    assert chi_square_p(counts, exact_joint(small_draft(), depth, 1.0, 0, 1.0), n) < 1e-6
