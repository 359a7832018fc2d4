"""Greedy equivalence: the engine's output equals target.generate on each prompt alone, token for token.

Ragged batches (prompt lengths 1..100 in one batch), more prompts than batch_size (eviction and refill),
K from 1 to 6, drafts of another family that agree often or not at all, every backend. Each test also
checks that the hard paths really ran (rows accepting different lengths, all K accepted, cut blocks), so a
test cannot pass by never reaching them. The speculative tests run under both schedulers, EQSPEC and EXSPEC
(whose pool, here twice the batch size, slides over the prompts when there are more); EXSPEC-only behaviour is
in test_exspec.py.
"""

from collections import Counter

import pytest
import torch

from conftest import backend_params
from engine_models import CONTROLS, SPEC_SCHEDULERS, decoder, draft, prompts, reference, target
from specdec import SpeculativeDecoder
from specdec.models import tiny_model
from specdec.drafting.ngram import NgramDrafter

LONG_MIX = (1, 100, 7, 33, 2, 64, 15, 4, 51, 9, 1, 27)

# id, target family, draft kind, batch_size, K, prompt lengths, max_new_tokens, prompt seed
CASES = [
    ("llama-agree-b3-k4", "llama", "agree", 3, 4, LONG_MIX, 24, 1),
    ("llama-unrelated-b8-k2", "llama", "unrelated", 8, 2, LONG_MIX, 20, 2),
    ("qwen2-agree-b1-k1", "qwen2", "agree", 1, 1, (5, 1, 40), 20, 3),
    ("qwen2-agree-b8-k6", "qwen2", "agree", 8, 6, LONG_MIX, 32, 4),
    ("qwen2-unrelated-b3-k3", "qwen2", "unrelated", 3, 3, (3, 60, 1, 12, 8), 20, 5),
    ("gpt2-agree-b3-k5", "gpt2", "agree", 3, 5, LONG_MIX[:8], 28, 6),
    ("gpt2-unrelated-b8-k2", "gpt2", "unrelated", 8, 2, LONG_MIX[:9], 16, 7),
    ("llama-agree-b8-k3-exact-batch", "llama", "agree", 8, 3, (2, 18, 3, 77, 5, 1, 30, 11), 24, 8),
]


def _run(family, kind, batch_size, k, lengths, max_new, seed, backend="torch", eos=None, scheduler="eqspec",
         realign="shift", control="fixed"):
    ps = prompts(lengths, seed)
    dec = decoder(target(family), draft(family, kind), scheduler, window=2 * batch_size, num_draft_tokens=k,
                  backend=backend, realign=realign, control=control)
    res = dec.generate(ps, max_new_tokens=max_new, batch_size=batch_size, eos_token_id=[] if eos is None else eos)
    return ps, res


# the real controller on shift only: on these tiny models it soon decodes plainly, so mask adds nothing there
REALIGN_CONTROL = [pytest.param(r, c, id=f"{r}-{c}") for r in ("shift", "mask") for c in CONTROLS
                   if not (r == "mask" and c == "adaptive")]


@pytest.mark.parametrize("realign,control", REALIGN_CONTROL)
@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
@pytest.mark.parametrize("family,kind,batch_size,k,lengths,max_new,seed",
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_greedy_equals_target_generate(family, kind, batch_size, k, lengths, max_new, seed, scheduler, realign,
                                       control):
    ps, res = _run(family, kind, batch_size, k, lengths, max_new, seed, scheduler=scheduler, realign=realign,
                   control=control)
    assert res.sequences == reference(family, ps, max_new)
    stats = res.stats
    assert stats["new_tokens"] == len(ps) * max_new
    if control != "fixed":
        assert stats["steps"] == sum(stats["width_histogram"])
        if control == "scripted":  # the draft model sat steps out and caught up on them, exactly
            assert stats["plain_steps"] > 0 and stats["resumed_columns"] > 0
            assert sum(stats["width_histogram"][1:]) > 0, "no step speculated"
        return
    assert stats["drafted"] == k * sum(stats["accept_histogram"])
    if kind == "agree":
        assert stats["accept_histogram"][k] > 0, "no step accepted all K drafts (the no-re-prefill path)"
        assert stats["accept_histogram"][0] > 0, "no step rejected the first draft"
        if batch_size > 1:
            assert stats["ragged_steps"] > 0, "rows never accepted different lengths in one step"


@pytest.mark.parametrize("control", ["fixed", "scripted"])
@pytest.mark.parametrize("realign", ["shift", "mask"])
@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
@pytest.mark.parametrize("backend", backend_params())
def test_greedy_every_backend(backend, scheduler, realign, control):
    # The interpreter makes triton slow on CPU: one mid-size ragged case with eviction for every backend.
    lengths = (9, 1, 30, 4, 17)
    ps, res = _run("llama", "agree", 3, 4, lengths, 16, seed=12, backend=backend, scheduler=scheduler,
                   realign=realign, control=control)
    assert res.sequences == reference("llama", ps, 16)
    assert res.stats["ragged_steps"] > 0
    assert res.stats["backend"] == backend


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_eos_inside_an_accepted_block(family, scheduler):
    lengths, max_new = (6, 1, 22, 3, 45, 10, 2), 28
    ps = prompts(lengths, seed=20)
    ref = reference(family, ps, max_new)
    # The most frequent token after the first position: several rows stop on it, mid-sequence.
    eos = Counter(t for r in ref for t in r[1:]).most_common(1)[0][0]
    _, res = _run(family, "agree", 3, 5, lengths, max_new, seed=20, eos=eos, scheduler=scheduler)
    expected = reference(family, ps, max_new, eos=eos)
    assert res.sequences == expected
    assert any(len(s) < max_new and s[-1] == eos for s in res.sequences)
    assert all(eos not in s[:-1] for s in res.sequences)
    assert res.stats["cut_blocks"]["eos"] > 0, "EOS never fell inside an accepted block"


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
@pytest.mark.parametrize("max_new", [1, 2, 7, 13])
def test_max_new_tokens_inside_an_accepted_block(max_new, scheduler):
    lengths = (4, 12, 1, 30, 8)
    ps, res = _run("qwen2", "agree", 2, 6, lengths, max_new, seed=21, scheduler=scheduler)
    assert res.sequences == reference("qwen2", ps, max_new)
    assert all(len(s) == max_new for s in res.sequences)
    if max_new > 1:
        assert res.stats["cut_blocks"]["max_new_tokens"] > 0


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_autoregressive_scheduler(family, batch_size):
    ps = prompts((3, 1, 40, 12, 7, 2), seed=30 + batch_size)
    dec = SpeculativeDecoder(target(family), None, scheduler="autoregressive")
    res = dec.generate(ps, max_new_tokens=16, batch_size=batch_size, eos_token_id=[])
    assert res.sequences == reference(family, ps, 16)
    assert res.stats["steps"] > 0 and res.stats["drafted"] == 0


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_eos_equal_to_padding_value(scheduler):
    # Padding is tracked by the mask, so an EOS id of 0 (the value padded columns hold) changes nothing
    # except stopping at 0.
    ps = prompts((1, 9, 25, 4), seed=40)
    ps = [[0] * 3 + p for p in ps]
    dec = decoder(target("llama"), draft("llama", "agree"), scheduler, window=3, num_draft_tokens=3)
    res = dec.generate(ps, max_new_tokens=20, batch_size=2, eos_token_id=0)
    assert res.sequences == reference("llama", ps, 20, eos=0)


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_stats_phases_add_up(scheduler):
    ps, res = _run("llama", "agree", 3, 4, (5, 20, 2, 9), 12, seed=50, scheduler=scheduler)
    s = res.stats
    assert s["scheduler"] == scheduler
    assert set(s["phase_seconds"]) == {"draft", "verify", "sample", "realign", "schedule", "other"}
    assert sum(s["phase_seconds"].values()) == pytest.approx(s["total_seconds"], rel=1e-9)
    assert s["total_seconds"] > 0 and s["tokens_per_s"] == pytest.approx(s["new_tokens"] / s["total_seconds"])
    assert 0 <= s["acceptance_rate"] <= 1
    assert s["accepted"] == sum(i * c for i, c in enumerate(s["accept_histogram"]))
    assert s["mean_accepted_length"] == pytest.approx(1 + s["accepted"] / sum(s["accept_histogram"]))
    # every new prompt is filled into the draft model's lane (inside the draft phase) before it drafts for it
    assert s["catch_up_columns"] > 0 and 0 < s["draft_prefill_seconds"] <= s["phase_seconds"]["draft"]
    if scheduler == "exspec":
        assert 0 <= s["group_rate"] <= 1 and s["groups"] == s["steps"]


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_empty_prompt_list_and_zero_new_tokens(scheduler):
    dec = decoder(target("llama"), draft("llama", "agree"), scheduler)
    assert dec.generate([]).sequences == []
    res = dec.generate([[1, 2], [3]], max_new_tokens=0)
    assert res.sequences == [[], []] and res.stats["steps"] == 0


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_string_prompts_with_a_tokenizer(scheduler):
    class ByteTokenizer:
        def __call__(self, text):
            return {"input_ids": list(text.encode())}

        def decode(self, ids):
            return bytes(i % 256 for i in ids).decode("latin-1")

    dec = decoder(target("llama"), draft("llama", "agree"), scheduler, tokenizer=ByteTokenizer())
    res = dec.generate(["hello", "a"], max_new_tokens=8, eos_token_id=[])
    assert res.sequences == reference("llama", [list(b"hello"), list(b"a")], 8)
    assert res.texts == [ByteTokenizer().decode(s) for s in res.sequences]

@pytest.mark.parametrize("control", ["fixed", "scripted"])
@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_draft_equal_to_target_accepts_everything(family, scheduler, control):
    # Greedy output is right whatever the draft proposes, so this is what checks the draft's own cache
    # bookkeeping (prev/last, realignment, refill, the all-accepted step without re-prefill, catching up on the
    # steps it sat out): a draft that is the target must have every proposal accepted.
    ps = prompts((5, 1, 38, 12, 3, 21), seed=60)
    dec = decoder(target(family), target(family), scheduler, window=4, num_draft_tokens=4, control=control)
    res = dec.generate(ps, max_new_tokens=25, batch_size=3, eos_token_id=[])
    assert res.sequences == reference(family, ps, 25)
    assert res.stats["acceptance_rate"] == 1.0
    if control == "fixed":
        assert res.stats["accept_histogram"][:4] == [0, 0, 0, 0]
    else:
        assert res.stats["resumed_columns"] > 0 and res.stats["plain_steps"] > 0


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_ngram_drafter_ragged_num_draft(scheduler):
    # A model-free drafter proposes a different number of tokens per row (num_draft), often none. A
    # 16-token vocabulary makes the target's greedy output repeat, so lookups hit.
    model = tiny_model("qwen2", vocab_size=16, hidden_size=64, num_layers=2, seed=1)
    g = torch.Generator().manual_seed(1)
    ps = [torch.randint(0, 16, (n,), generator=g).tolist() for n in (3, 1, 20, 9, 5)]
    want = [model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=48)[0, len(p):].tolist() for p in ps]
    widths = []  # query widths of the target's forwards: verification is narrowed to the longest proposal
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                           with_kwargs=True)
    try:
        res = decoder(model, NgramDrafter(), scheduler, window=4, num_draft_tokens=4).generate(
            ps, max_new_tokens=48, batch_size=3, eos_token_id=[])
    finally:
        hook.remove()
    assert res.sequences == want
    hist = res.stats["accept_histogram"]
    assert hist[0] > 0 and hist[4] > 0 and res.stats["ragged_steps"] > 0
    assert res.stats["drafted"] < 4 * sum(hist), "some rows must have proposed fewer than K drafts"
    assert 5 in widths and any(1 < w < 5 for w in widths), sorted(set(widths))


@pytest.mark.parametrize("control", CONTROLS)
@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_ngram_hindsight_judges_what_was_not_verified(scheduler, control):
    # With a controller that decides (scripted widths, or the adaptive one), the offers it does not verify are
    # judged by the tokens that follow and taught to its table; fixed K verifies everything and judges nothing.
    # Output stays the target's greedy text either way.
    model = tiny_model("qwen2", vocab_size=16, hidden_size=64, num_layers=2, seed=1)
    g = torch.Generator().manual_seed(2)
    ps = [torch.randint(0, 16, (n,), generator=g).tolist() for n in (3, 1, 20, 9, 5)]
    want = [model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=40)[0, len(p):].tolist() for p in ps]
    res = decoder(model, NgramDrafter(), scheduler, window=4, num_draft_tokens=4, control=control).generate(
        ps, max_new_tokens=40, batch_size=3, eos_token_id=[])
    assert res.sequences == want
    if control == "fixed":
        assert res.stats["judged_drafts"] == 0
    else:
        assert res.stats["judged_drafts"] > 0 and res.stats["plain_steps"] > 0


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_step_overhead_leaves_out_the_batch_change(scheduler, monkeypatch):
    # next_batch may evict finished rows from every lane (once, whatever the width): the controller must not
    # book that as what each later step costs beyond its forwards. Here every next_batch burns 30 ms of CPU.
    import time
    from specdec.scheduling.eqspec import EqspecSource
    from specdec.scheduling.exspec import ExspecSource
    source = EqspecSource if scheduler == "eqspec" else ExspecSource
    slow = source.next_batch

    def next_batch(self, *args, **kwargs):
        end = time.process_time() + 0.03
        while time.process_time() < end:
            pass
        return slow(self, *args, **kwargs)

    monkeypatch.setattr(source, "next_batch", next_batch)
    model = tiny_model("qwen2", vocab_size=16, hidden_size=64, num_layers=2, seed=1)
    g = torch.Generator().manual_seed(3)
    ps = [torch.randint(0, 16, (n,), generator=g).tolist() for n in (3, 1, 20, 9, 5)]
    dec = decoder(model, NgramDrafter(), scheduler, window=4, num_draft_tokens=4, control="adaptive")
    res = dec.generate(ps, max_new_tokens=12, batch_size=3, eos_token_id=[])
    assert res.sequences == [model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=12)[0, len(p):].tolist()
                             for p in ps]
    booked = [v for costs in (dec.controller.plain_overhead, dec.controller.spec_overhead)
              for samples in costs.samples.values() for _, v in samples]
    assert booked and max(booked) < 0.03, booked


@pytest.mark.parametrize("control", ["fixed", "scripted"])
@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
@pytest.mark.parametrize("realign", ["shift", "mask", "paper"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_every_realign_mode_is_exact(family, realign, scheduler, control):
    # The ablation's modes: kernel shift, holes in the mask compacted now and then, the paper's row loop.
    # EXSPEC uses them to right-align a group of unequal lengths (which these prompts force).
    ps = prompts((5, 1, 38, 12, 3, 21, 64), seed=70)
    dec = decoder(target(family), draft(family, "agree"), scheduler, window=4, num_draft_tokens=4, realign=realign,
                  control=control)
    res = dec.generate(ps, max_new_tokens=40, batch_size=3, eos_token_id=[])
    assert res.sequences == reference(family, ps, 40)
    assert res.stats["ragged_steps"] > 0 and res.stats["realign"] == realign
    if scheduler == "exspec":
        assert res.stats["group_rate"] < 1, "no group needed aligning"
    same = decoder(target(family), target(family), scheduler, window=4, num_draft_tokens=4, realign=realign,
                   control=control)
    assert same.generate(ps, max_new_tokens=40, batch_size=3, eos_token_id=[]).stats["acceptance_rate"] == 1.0
