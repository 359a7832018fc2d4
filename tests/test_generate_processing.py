"""ProcessorScoring against transformers' own processors called the way plain decoding calls them: once per
(row, position), with that position's exact prefix [1, L] (its history, then the drafts before it).

Blocks are ragged (unused draft slots hold -1), histories repeat tokens (a 20-token vocabulary), and both the
verification shape [B, w, V] and the draft model's [B, V] with an offset are scored. Every comparison is exact.
"""

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    EpsilonLogitsWarper, EtaLogitsWarper, InfNanRemoveLogitsProcessor, LogitNormalization, LogitsProcessor,
    LogitsProcessorList, MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor, MinPLogitsWarper,
    NoBadWordsLogitsProcessor, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor, SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, TypicalLogitsWarper)

from engine_models import target
from specdec.processing import ProcessorScoring, from_generation_config
from specdec.sampling import Prefixes

V = 20
EOS = 3


class PrefixRule(LogitsProcessor):
    """A user's processor that reads the whole prefix: bans (sum of ids) % V, rewards the last token by its
    position. Unknown to specdec, so it is called per (row, position)."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for i, row in enumerate(input_ids.tolist()):
            scores[i, sum(row) % V] = -float("inf")
            scores[i, row[-1]] += 0.1 * len(row)
        return scores


def _block(seed, b=5, w=4, ragged=True):
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 2, 7, 12, 3][:b]
    hist = [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]
    prompt = [max(1, n - int(torch.randint(0, 4, (), generator=g))) for n in lengths]
    drafts = torch.randint(0, V, (b, w - 1), generator=g)
    if ragged:
        for row, n in enumerate([w - 1, 0, 1, w - 1, 2][:b]):
            drafts[row, n:] = -1
    logits = torch.randn(b, w, V, generator=g) * 2
    return hist, prompt, drafts, logits


def _prefixes(hist, prompt, extra, offset=0):
    return Prefixes(list(range(len(hist))), lambda s: hist[s], lambda s: prompt[s], extra, offset)


def _expected(make, hist, prompt, drafts, logits, offset=0, frame=None):
    """make(row) -> the processors for that row (the length rules know the row's prompt), applied per position."""
    b, w, _ = logits.shape
    out = logits.clone()
    for r in range(b):
        for j in range(w):
            d = drafts[r, :offset + j].tolist() if drafts is not None else []
            if any(t < 0 for t in d):
                continue  # an unused draft slot: nothing reads this position
            ids = hist[r] + d
            if frame is not None:  # min_length counts a padded batch's width: pad the row to it
                ids = [0] * (frame - prompt[r]) + ids
            out[r, j] = make(r)(torch.tensor([ids]), logits[r, j][None].clone())[0]
    return out


def _mask_unread(scores, drafts, offset=0):
    """Positions past a row's drafts are never read: zero them on both sides of a comparison."""
    scores = scores.clone()
    for r in range(scores.shape[0]):
        for j in range(scores.shape[1]):
            if any(t < 0 for t in drafts[r, :offset + j].tolist()):
                scores[r, j] = 0
    return scores


ROW_WISE = {
    "temperature": lambda: TemperatureLogitsWarper(0.7),
    "top-k": lambda: TopKLogitsWarper(5),
    "top-p": lambda: TopPLogitsWarper(0.8),
    "min-p": lambda: MinPLogitsWarper(0.1),
    "typical": lambda: TypicalLogitsWarper(0.9),
    "epsilon": lambda: EpsilonLogitsWarper(0.02),
    "eta": lambda: EtaLogitsWarper(0.02),
    "normalise": lambda: LogitNormalization(),
    "inf-nan": lambda: InfNanRemoveLogitsProcessor(),
    "suppress": lambda: SuppressTokensLogitsProcessor([4, 9]),
}
ID_RULES = {
    "no-repeat-1": lambda: NoRepeatNGramLogitsProcessor(1),
    "no-repeat-2": lambda: NoRepeatNGramLogitsProcessor(2),
    "no-repeat-3": lambda: NoRepeatNGramLogitsProcessor(3),
    "bad-words": lambda: NoBadWordsLogitsProcessor([[4], [5, 6], [1, 2, 3], [EOS]], EOS),
    "sequence-bias": lambda: SequenceBiasLogitsProcessor([[[7], -2.0], [[2, 3], 1.5], [[1, 1, 9], 3.0]]),
    "repetition-1.4": lambda: RepetitionPenaltyLogitsProcessor(1.4),
    "repetition-0.7": lambda: RepetitionPenaltyLogitsProcessor(0.7),
}


@pytest.mark.parametrize("name", sorted(ROW_WISE) + sorted(ID_RULES))
@pytest.mark.parametrize("seed", [0, 1])
def test_each_processor_per_position(name, seed):
    make = {**ROW_WISE, **ID_RULES}[name]
    hist, prompt, drafts, logits = _block(seed)
    scoring = ProcessorScoring([make()], do_sample=True)
    filled = "repetition" in name or name == "no-repeat-1"
    assert scoring.describe()[0][1] == ("rows" if name in ROW_WISE else "filled" if filled else "ids")
    got = scoring.process(logits, _prefixes(hist, prompt, drafts))
    want = _expected(lambda r: make(), hist, prompt, drafts, logits)
    torch.testing.assert_close(_mask_unread(got, drafts), _mask_unread(want, drafts), rtol=0, atol=0)


def _length_rules(min_length=9, min_new=3):
    def make(r, prompt):
        return LogitsProcessorList([MinLengthLogitsProcessor(min_length, EOS),
                                    MinNewTokensLengthLogitsProcessor(prompt[r], min_new, EOS),
                                    SuppressTokensAtBeginLogitsProcessor([EOS, 11], prompt[r])])
    return make


@pytest.mark.parametrize("frame", [None, 14])
def test_length_rules_per_position(frame):
    hist, prompt, drafts, logits = _block(2)
    rules = _length_rules()
    # as generate builds them for a batch of width `frame`: the classes' own lengths are rebuilt per row here
    built = rules(0, [frame or 1] * 5)
    scoring = ProcessorScoring(built, do_sample=False, frame_length=frame)
    assert [kind for _, kind in scoring.describe()] == ["lengths"] * 3
    got = scoring.process(logits, _prefixes(hist, prompt, drafts))

    def make(r):
        procs = rules(r, prompt)
        if frame is not None:  # the padded row is frame - prompt longer: the prompt-relative rules shift too
            procs = LogitsProcessorList([procs[0], MinNewTokensLengthLogitsProcessor(frame, 3, EOS),
                                         SuppressTokensAtBeginLogitsProcessor([EOS, 11], frame)])
        return procs
    want = _expected(make, hist, prompt, drafts, logits, frame=frame)
    torch.testing.assert_close(_mask_unread(got, drafts), _mask_unread(want, drafts), rtol=0, atol=0)
    assert torch.isinf(got).any(), "no length rule fired"


def test_a_users_processor_is_called_per_position_with_its_prefix():
    hist, prompt, drafts, logits = _block(3)
    rule = PrefixRule()
    scoring = ProcessorScoring([rule, TopKLogitsWarper(6)], do_sample=True, user=[rule])
    assert scoring.describe() == [("PrefixRule", "each"), ("TopKLogitsWarper", "rows")]
    got = scoring.process(logits, _prefixes(hist, prompt, drafts))
    want = _expected(lambda r: LogitsProcessorList([PrefixRule(), TopKLogitsWarper(6)]), hist, prompt, drafts,
                     logits)
    torch.testing.assert_close(_mask_unread(got, drafts), _mask_unread(want, drafts), rtol=0, atol=0)


def test_a_users_length_rules_see_the_rows_own_prefix():
    # Built by the caller, a length rule's numbers are the caller's: it gets the per-position call.
    rule = MinNewTokensLengthLogitsProcessor(2, 4, EOS)
    scoring = ProcessorScoring([rule], user=[rule])
    assert scoring.describe() == [("MinNewTokensLengthLogitsProcessor", "each")]
    hist, prompt, drafts, logits = _block(4)
    got = scoring.process(logits, _prefixes(hist, prompt, drafts))
    want = _expected(lambda r: MinNewTokensLengthLogitsProcessor(2, 4, EOS), hist, prompt, drafts, logits)
    torch.testing.assert_close(_mask_unread(got, drafts), _mask_unread(want, drafts), rtol=0, atol=0)


def test_everything_at_once_on_the_draft_side():
    # The draft model scores one position at a time: [B, V] with `offset` drafts already made.
    hist, prompt, drafts, logits = _block(5, ragged=False)
    rule = PrefixRule()
    procs = [RepetitionPenaltyLogitsProcessor(1.3), NoRepeatNGramLogitsProcessor(2),
             NoBadWordsLogitsProcessor([[5, 6], [8]], EOS), rule, TemperatureLogitsWarper(0.8), TopKLogitsWarper(8),
             MinPLogitsWarper(0.05)]
    scoring = ProcessorScoring(procs, do_sample=True, user=[rule])
    for offset in range(drafts.shape[1] + 1):
        one = logits[:, 0]
        got = scoring.process(one, _prefixes(hist, prompt, drafts[:, :offset] if offset else None, offset))
        fresh = lambda r: LogitsProcessorList(  # noqa: E731
            [RepetitionPenaltyLogitsProcessor(1.3), NoRepeatNGramLogitsProcessor(2),
             NoBadWordsLogitsProcessor([[5, 6], [8]], EOS), PrefixRule(), TemperatureLogitsWarper(0.8),
             TopKLogitsWarper(8), MinPLogitsWarper(0.05)])
        want = _expected(fresh, hist, prompt, drafts, one[:, None], offset=offset)[:, 0]
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(scoring.probs(one, _prefixes(hist, prompt, drafts[:, :offset], offset)),
                                   want.softmax(-1), rtol=0, atol=0)


def test_from_generation_config_uses_transformers_order():
    model = target("llama")
    scoring = from_generation_config(model, do_sample=True, temperature=0.7, top_k=9, top_p=0.9, min_p=0.05,
                                     repetition_penalty=1.2, no_repeat_ngram_size=3, bad_words_ids=[[5]],
                                     eos_token_id=EOS, min_new_tokens=2)
    names = [name for name, _ in scoring.describe()]
    assert names == ["RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor", "NoBadWordsLogitsProcessor",
                     "MinNewTokensLengthLogitsProcessor", "TemperatureLogitsWarper", "TopKLogitsWarper",
                     "TopPLogitsWarper", "MinPLogitsWarper"]
    greedy = from_generation_config(model, GenerationConfig(do_sample=False, temperature=0.5, top_k=3))
    assert greedy.describe() == [] and not greedy.do_sample  # warpers apply only when sampling, as in generate


def test_histories_are_cached_by_content():
    # One scoring object may serve two runs whose sequence ids and lengths coincide.
    scoring = ProcessorScoring([RepetitionPenaltyLogitsProcessor(2.0)])
    logits = torch.ones(1, 1, V)
    a = scoring.process(logits, _prefixes([[1, 2]], [1], None))
    b = scoring.process(logits, _prefixes([[5, 6]], [1], None))
    assert a[0, 0, 1] == 0.5 and b[0, 0, 1] == 1.0 and b[0, 0, 5] == 0.5


def test_refused_processor_options():
    model = target("llama")
    for option, value in [("guidance_scale", 1.5), ("forced_eos_token_id", 3), ("forced_bos_token_id", 1),
                          ("exponential_decay_length_penalty", (2, 1.1))]:
        with pytest.raises(ValueError, match=option):
            from_generation_config(model, **{option: value})
