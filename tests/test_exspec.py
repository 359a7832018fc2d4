"""EXSPEC-only behaviour: same-length grouping, the sliding window, the pool. The output guarantees it shares with
EQSPEC (greedy equivalence, lossless sampling, seeds, backends, realign modes) are the parametrised tests of
test_engine.py and test_engine_sampling.py."""

import pytest
import torch

from engine_models import draft, prompts, reference, target
from specdec import NgramDrafter, RaggedKV, SpeculativeDecoder
from specdec.kv.pool import SlotPool
from specdec.scheduling.exspec import ExspecSource


def _exspec(drafter=None, **kwargs):
    kwargs.setdefault("adaptive", False)  # these tests are about grouping: every step speculates
    return SpeculativeDecoder(target("llama"), drafter if drafter is not None else draft("llama", "agree"),
                              num_draft_tokens=kwargs.pop("k", 3), scheduler="exspec", **kwargs)


@pytest.fixture
def picked(monkeypatch):
    """The cached lengths of every group the scheduler picks, in order."""
    groups = []
    pick = ExspecSource.pick

    def spy(self, waiting):
        chosen = pick(self, waiting)
        groups.append([self.pool.lengths[s] for s in chosen])
        return chosen

    monkeypatch.setattr(ExspecSource, "pick", spy)
    return groups


def test_equal_lengths_form_groups(picked):
    ps = prompts((12,) * 8, seed=80)
    res = _exspec(window=8).generate(ps, max_new_tokens=16, batch_size=4, eos_token_id=[])
    assert res.sequences == reference("llama", ps, 16)
    assert res.stats["group_rate"] > 0 and res.stats["groups"] == len(picked)
    assert picked[0] == [12] * 4  # the cached prompt; the first new token is `last`, not cached yet
    assert res.stats["group_rate"] == sum(len(set(g)) == 1 for g in picked) / len(picked)


def test_equal_lengths_with_a_perfect_draft_never_realign():
    # Every row accepts all K each step, so lengths stay equal: every group stacks as it is, no padding.
    ps = prompts((9,) * 6, seed=81)
    res = _exspec(target("llama"), window=6).generate(ps, max_new_tokens=13, batch_size=3, eos_token_id=[])
    assert res.sequences == reference("llama", ps, 13)
    s = res.stats
    assert s["acceptance_rate"] == 1.0 and s["group_rate"] == 1.0 and s["padding_fraction"] == 0.0
    assert s["phase_seconds"]["realign"] == 0.0


@pytest.mark.parametrize("lengths,first_group", [
    ((5, 9, 9, 2, 9, 9, 30), [9, 9, 9, 9]),  # a full group of one length goes first
    ((5, 9, 9, 2, 5, 30), [2, 5, 5, 9]),  # else the first slot (prompt 0), its length's peer, the closest lengths
])
def test_full_equal_group_first_else_closest_lengths(picked, lengths, first_group):
    ps = prompts(lengths, seed=82)
    res = _exspec(window=8).generate(ps, max_new_tokens=8, batch_size=4, eos_token_id=[])
    assert res.sequences == reference("llama", ps, 8)
    assert sorted(picked[0]) == first_group


def test_window_smaller_than_the_number_of_prompts():
    ps = prompts((7, 1, 25, 3, 14, 40, 2, 9, 18), seed=83)
    res = _exspec(window=3).generate(ps, max_new_tokens=14, batch_size=2, eos_token_id=[])
    assert res.sequences == reference("llama", ps, 14)
    assert res.stats["window"] == 3 and res.stats["mean_group_rows"] <= 2
    assert res.stats["ragged_steps"] > 0


def test_window_one_steps_one_sequence_at_a_time(picked):
    ps = prompts((6, 13, 2), seed=84)
    res = _exspec(window=1).generate(ps, max_new_tokens=10, batch_size=4, eos_token_id=[])
    assert res.sequences == reference("llama", ps, 10)
    assert all(len(g) == 1 for g in picked)
    assert res.stats["group_rate"] == 1.0 and res.stats["phase_seconds"]["realign"] == 0.0


def test_batch_size_larger_than_the_window(picked):
    ps = prompts((4, 19, 8, 2, 11, 33, 6), seed=85)
    res = _exspec(window=3).generate(ps, max_new_tokens=12, batch_size=8, eos_token_id=[])
    assert res.sequences == reference("llama", ps, 12)
    assert max(len(g) for g in picked) == 3


def test_output_order_is_input_order():
    # Long prompts first and an EOS that stops some rows early: prompts finish out of input order.
    ps = prompts((50, 41, 30, 22, 3, 2, 1, 12), seed=86)
    ref = reference("llama", ps, 20)
    eos = ref[3][4]
    finished = []
    res = _exspec(window=4).generate(ps, max_new_tokens=20, batch_size=2, eos_token_id=eos,
                                     progress=finished.append)
    assert res.sequences == reference("llama", ps, 20, eos=eos)
    assert sorted(finished) == list(range(len(ps))) and finished != sorted(finished)


def test_slot_pool_gathers_what_it_was_given():
    # Rows go in right-aligned (a prefilled batch), live left-aligned in their slots, and come out right-aligned.
    model = target("llama")
    ps = prompts((3, 7, 7, 1), seed=87)
    with torch.no_grad():
        src, _ = RaggedKV.prefill(model, ps, 0)
    rows = [src.cache.slab[b, :, :, src.length - len(p):src.length].clone() for b, p in enumerate(ps)]
    pool = SlotPool(model, 5, extra=8, room=4)
    slots = [4, 0, 2, 1]
    pool.admit(slots, src)
    assert [pool.lengths[s] for s in slots] == [3, 7, 7, 1]
    group = [2, 0, 4]  # prompts 2, 1, 0: lengths 7, 7, 3
    state, pad = pool.gather(group)
    assert pad == [0, 0, 4] and state.length == 7 and state.cache.capacity >= 7 + 4
    pool.align(state, pad)
    assert state.seq_len.tolist() == [7, 7, 3]
    for b, prompt_index in enumerate([2, 1, 0]):
        n = len(ps[prompt_index])
        assert torch.equal(state.cache.slab[b, :, :, 7 - n:7], rows[prompt_index])
        assert state.mask[b, :7].tolist() == [False] * (7 - n) + [True] * n
    # A step appended 4 columns; rows keep 1, 4 and 2 of them, which land at the end of their slots.
    state.cache.slab[:, :, :, 7:11] = torch.randn_like(state.cache.slab[:, :, :, 7:11])
    state.cache.length, state.written, state.new_real, state.first_new = 11, 4, [4, 4, 4], [0, 0, 0]
    pool.scatter(group, state, [3, 0, 2])
    assert [pool.lengths[s] for s in (2, 0, 4)] == [8, 11, 5]
    assert torch.equal(pool.slab[0, :, :, 7:11], state.cache.slab[1, :, :, 7:11])
    assert torch.equal(pool.slab[4, :, :, 3:5], state.cache.slab[2, :, :, 7:9])


class _OldProtocolDrafter:
    """A drafter written for another protocol (begin/accept, no offer/commit)."""

    def begin(self, prompts, first_tokens, *, extra_capacity):
        pass

    def propose(self, k, sampling, generator):
        pass

    def accept(self, tokens, num_accepted):
        pass


@pytest.mark.parametrize("scheduler", ["eqspec", "exspec"])
def test_a_drafter_must_follow_the_protocol(scheduler):
    # One protocol for both schedulers: a drafter never knows which one runs it.
    with pytest.raises(ValueError, match="drafter"):
        SpeculativeDecoder(target("llama"), _OldProtocolDrafter(), scheduler=scheduler)


@pytest.mark.parametrize("window", [0, -3, 2.0, True])
def test_window_must_be_a_positive_int(window):
    with pytest.raises(ValueError, match="window"):
        _exspec(window=window)


def test_narrowed_steps_never_copy_unwritten_columns(monkeypatch):
    """A drafter proposing fewer than K narrows the verify forward; the pool must take back only the columns
    the step wrote. The step buffer is poisoned with NaN, so copying one unwritten column into the pool would
    put a NaN key into a masked hole, and 0 * NaN would surface as NaN logits (a ValueError from the checks)."""
    original = SlotPool._buffer

    def poisoned(self, rows, columns):
        fresh = self._buf is None or self._buf.shape[0] < rows or self._buf.shape[-2] < columns
        out = original(self, rows, columns)
        if fresh:
            self._buf.fill_(float("nan"))
        return out

    monkeypatch.setattr(SlotPool, "_buffer", poisoned)
    model = target("llama")
    ps = prompts((2, 30, 7, 60, 11, 3, 45, 19, 5, 24, 8, 13, 36), seed=90)
    for realign in ("mask", "shift"):
        res = SpeculativeDecoder(model, NgramDrafter(max_n=3, min_n=1), num_draft_tokens=4, scheduler="exspec",
                                 window=5, realign=realign, adaptive=False).generate(ps, max_new_tokens=40, batch_size=3,
                                                                     eos_token_id=[])
        assert res.sequences == reference("llama", ps, 40)
        assert res.stats["drafted"] < 4 * sum(res.stats["accept_histogram"]), "no step was narrowed"
