"""specdec.generate against model.generate, greedy, token for token: the same padded batch in, the same tensor out.

Each case checks two references: model.generate on every prompt alone (the stronger guarantee: what each row
must continue with) and, for left padding, model.generate on the same padded batch (the tensor a user's script
got before). Llama, Qwen2, GPT-2 and Mistral (no window); a draft model, prompt lookup, and plain decoding;
left and right padding, mixed lengths, EOS mid-batch, max_length and max_new_tokens; every supported processor,
each chosen so that it changes the output (a processor that never fires would test nothing).
"""

import functools
from collections import Counter

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import LogitsProcessor, LogitsProcessorList

import specdec
from engine_models import VOCAB, draft, prompts, target

FAMILIES = ("llama", "qwen2", "gpt2", "mistral")
DRAFTERS = ("assistant", "lookup", "none")
LENGTHS = (5, 1, 12, 30, 3)
MAX_NEW = 14


class PenaliseSum(LogitsProcessor):
    """A user's processor that reads the whole prefix: bans (sum of ids) % V and favours the id that follows the
    last one."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for i, row in enumerate(input_ids.tolist()):
            scores[i, sum(row) % scores.shape[-1]] = -float("inf")
            scores[i, (row[-1] + 1) % scores.shape[-1]] += 2.0
        return scores


def padded(ps, side="left", pad=0):
    width = max(map(len, ps))
    ids = torch.full((len(ps), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(ps):
        cols = slice(width - len(p), width) if side == "left" else slice(0, len(p))
        ids[i, cols], mask[i, cols] = torch.tensor(p), 1
    return ids, mask


def alone(family, p, **options):
    """model.generate on one prompt: its new tokens."""
    with torch.no_grad():
        out = target(family).generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                      do_sample=False, **options)
    return out[0, len(p):].tolist()


def expected(ids, news, pad):
    width = max(map(len, news))
    tail = torch.full((len(news), width), pad, dtype=torch.long)
    for i, n in enumerate(news):
        tail[i, :len(n)] = torch.tensor(n)
    return torch.cat([ids, tail], dim=1)


def drafting(kind, family):
    return {"assistant": {"assistant_model": draft(family, "agree")}, "lookup": {"prompt_lookup_num_tokens": 3},
            "none": {}}[kind]


@functools.lru_cache(maxsize=None)
def plain(family):
    ps = prompts(LENGTHS, seed=7)
    return ps, [alone(family, p, max_new_tokens=MAX_NEW) for p in ps]


def frequent(family, rank=0, skip_first=True):
    """A token plain greedy decoding emits often (rank 0: the most often)."""
    _, refs = plain(family)
    return Counter(t for r in refs for t in (r[1:] if skip_first else r)).most_common(rank + 1)[rank][0]


def unused_id(*token_lists):
    used = {t for lists in token_lists for row in lists for t in row}
    return next(t for t in range(VOCAB - 1, -1, -1) if t not in used)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_padded_batch_with_eos_mid_batch(family, kind, side):
    ps, refs = plain(family)
    eos = frequent(family)
    news = [alone(family, p, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=eos) for p in ps]
    assert any(len(n) < MAX_NEW for n in news) and any(len(n) == MAX_NEW for n in news), "EOS must cut some rows"
    pad = unused_id(ps, news)
    ids, mask = padded(ps, side, pad)
    out = specdec.generate(target(family), ids, mask, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=pad,
                           adaptive=False, batch_size=3, **drafting(kind, family))
    assert torch.equal(out, expected(ids, news, pad))
    if side == "left":
        with torch.no_grad():
            batch = target(family).generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False,
                                            eos_token_id=eos, pad_token_id=pad)
        assert torch.equal(out, batch)


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_max_length_counts_the_padded_width(family, kind):
    ps, _ = plain(family)
    ids, mask = padded(ps, "left", pad=0)
    out = specdec.generate(target(family), ids, mask, max_length=ids.shape[1] + 9, pad_token_id=0, adaptive=False,
                           **drafting(kind, family))
    assert torch.equal(out, expected(ids, [alone(family, p, max_new_tokens=9) for p in ps], 0))
    with torch.no_grad():
        batch = target(family).generate(ids, attention_mask=mask, max_length=ids.shape[1] + 9, do_sample=False,
                                        pad_token_id=0)
    assert torch.equal(out, batch)


def _processor_cases(family):
    """name -> (generation options, logits_processor or None, compare with the padded batch too, prompts)."""
    ps, refs = plain(family)
    # prompts that already hold the bigram (last token, its greedy successor): the tiny models rarely repeat one
    # on their own within MAX_NEW tokens
    bigrams = [[p[-1], r[0]] + p for p, r in zip(ps, refs)]
    a, b = frequent(family), frequent(family, 1)
    pair = next((r[i], r[i + 1]) for r in refs for i in range(1, len(r) - 1) if r[i] != a)
    firsts = Counter(r[0] for r in refs).most_common(1)[0][0]
    return {
        "repetition_penalty": ({"repetition_penalty": 1.5}, None, True, ps),
        "no_repeat_ngram_size": ({"no_repeat_ngram_size": 2}, None, True, bigrams),
        "bad_words_ids": ({"bad_words_ids": [[a], list(pair)]}, None, True, ps),
        "min_new_tokens": ({"min_new_tokens": 8, "eos_token_id": a}, None, True, ps),
        "suppress_tokens": ({"suppress_tokens": [a], "begin_suppress_tokens": [firsts]}, None, True, ps),
        "sequence_bias": ({"sequence_bias": [[[b], -4.0], [list(pair), 6.0]]}, None, True, ps),
        # a user's processor sees model.generate's padded rows there, its own prompt here: compared alone only
        "logits_processor": ({}, PenaliseSum, False, ps),
    }


PROCESSORS = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_new_tokens", "suppress_tokens",
              "sequence_bias", "logits_processor")
PROCESSOR_RUNS = ([(f, "assistant", p) for f in FAMILIES for p in PROCESSORS]
                  + [("llama", k, p) for k in ("lookup", "none") for p in PROCESSORS])


@pytest.mark.parametrize("family,kind,name", [pytest.param(*r, id="-".join(r)) for r in PROCESSOR_RUNS])
def test_each_processor(family, kind, name):
    options, processor, batch_too, ps = _processor_cases(family)[name]
    refs = [alone(family, p, max_new_tokens=MAX_NEW) for p in ps]
    user = (lambda: LogitsProcessorList([processor()])) if processor else (lambda: None)
    eos = options.get("eos_token_id")
    news = [alone(family, p, max_new_tokens=MAX_NEW, logits_processor=user(), pad_token_id=eos, **options)
            for p in ps]
    assert news != refs, f"{name} changed nothing: the case tests nothing"
    pad = unused_id(ps, news)
    ids, mask = padded(ps, "left", pad)
    out = specdec.generate(target(family), ids, mask, max_new_tokens=MAX_NEW, pad_token_id=pad,
                           logits_processor=user(), adaptive=False, **options, **drafting(kind, family))
    assert torch.equal(out, expected(ids, news, pad))
    if batch_too:
        with torch.no_grad():
            batch = target(family).generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False,
                                            pad_token_id=pad, logits_processor=user(), **options)
        assert torch.equal(out, batch)


@pytest.mark.parametrize("scheduler", ["eqspec", "exspec"])
def test_all_processors_together_right_padding_both_schedulers(scheduler):
    family = "qwen2"
    ps, _ = plain(family)
    a = frequent(family)
    options = {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3, "bad_words_ids": [[frequent(family, 2)]],
               "min_new_tokens": 5, "eos_token_id": a}
    news = [alone(family, p, max_new_tokens=MAX_NEW, pad_token_id=a, logits_processor=[PenaliseSum()], **options)
            for p in ps]
    ids, mask = padded(ps, "right", pad=a)
    out = specdec.generate(target(family), ids, mask, max_new_tokens=MAX_NEW, pad_token_id=a,
                           logits_processor=LogitsProcessorList([PenaliseSum()]), scheduler=scheduler, batch_size=2,
                           window=4, adaptive=False, assistant_model=draft(family, "agree"), **options)
    assert torch.equal(out, expected(ids, news, a))


def test_engine_defaults_and_generation_config():
    # The controller on (its default), options from a GenerationConfig, model.generation_config as the base.
    family = "llama"
    ps, _ = plain(family)
    model = target(family)
    ids, mask = padded(ps, "left", pad=0)
    config = GenerationConfig(max_new_tokens=10, repetition_penalty=1.3, pad_token_id=0)
    out = specdec.generate(model, ids, mask, generation_config=config, assistant_model=draft(family, "agree"))
    with torch.no_grad():
        assert torch.equal(out, model.generate(ids, attention_mask=mask, generation_config=config))
    base = model.generation_config.max_new_tokens
    model.generation_config.max_new_tokens = 6
    try:
        out = specdec.generate(model, ids, mask, pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + 6
    finally:
        model.generation_config.max_new_tokens = base


def test_batch_one_without_mask_and_defaults():
    # The usual single-prompt call: no attention mask, no length given (transformers' default of 20 tokens).
    family = "gpt2"
    model = target(family)
    p = plain(family)[0][2]
    ids = torch.tensor([p])
    with torch.no_grad(), pytest.warns(UserWarning):
        ref = model.generate(ids)
    with pytest.warns(UserWarning):  # transformers' own warning about the default max_length
        out = specdec.generate(model, ids, assistant_model=draft(family, "agree"))
    assert torch.equal(out, ref) and out.shape[1] == len(p) + 20
