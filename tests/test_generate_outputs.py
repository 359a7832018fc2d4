"""specdec.generate's other outputs: return_dict_in_generate with scores and logits, num_return_sequences and seeds
when sampling, and streamers (TextStreamer / TextIteratorStreamer at batch 1, transformers' error at batch > 1).
"""

import threading

import pytest
import torch
from transformers import TextIteratorStreamer, TextStreamer
from transformers.generation.streamers import BaseStreamer
from transformers.generation.utils import GenerateDecoderOnlyOutput

import specdec
from engine_models import draft, prompts, target
from test_generate_greedy import frequent, padded, plain

FAMILY = "llama"


class LetterTokenizer:
    """decode() for the streamers: one letter per id (nothing a streamer would hold back)."""

    def decode(self, ids, **kwargs):
        if isinstance(ids, int):
            ids = [ids]
        return "".join(chr(97 + int(i) % 26) for i in ids)


class Recording(TextStreamer):
    def __init__(self):
        super().__init__(LetterTokenizer())
        self.puts, self.ends, self.text = [], 0, ""

    def put(self, value):
        self.puts.append(value.clone())
        super().put(value)

    def end(self):
        self.ends += 1
        super().end()

    def on_finalized_text(self, text, stream_end=False):
        self.text += text


def _batch(eos):
    ps, _ = plain(FAMILY)
    return padded(ps, "left", pad=0), eos


def _assert_equal_up_to_rounding(ours, ref, length: int):
    """Equal up to the float32 rounding of dot products of `length` terms: a logit is such a sum, and a forward of
    another width sums it in another order (BLAS blocking). The bound is per row, length * eps * the row's largest
    logit: a logit near 0 is a cancellation of terms as large as the row's largest, so its absolute error
    scales with those (seen here: 1.07e-5 on a logit of 0.018 in a row whose largest is 7, 24 eps of it; with
    torch's default absolute 1e-5 that failed on some CPUs' BLAS and passed on others)."""
    bound = length * torch.finfo(torch.float32).eps * ref.abs().amax(dim=-1, keepdim=True)
    assert ((ours - ref).abs() <= bound).all(), (ours - ref).abs().amax(dim=-1)


@pytest.mark.parametrize("kind", ["assistant", "none"])
def test_scores_and_logits_match_model_generate(kind):
    model = target(FAMILY)
    eos = frequent(FAMILY)
    (ids, mask), _ = _batch(eos)
    options = dict(max_new_tokens=12, eos_token_id=eos, pad_token_id=0, repetition_penalty=1.3,
                   return_dict_in_generate=True, output_scores=True, output_logits=True)
    extra = {"assistant_model": draft(FAMILY, "agree")} if kind == "assistant" else {}
    out = specdec.generate(model, ids, mask, adaptive=False, **extra, **options)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, do_sample=False, **options)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.attentions is None and out.hidden_states is None
    steps = out.sequences.shape[1] - ids.shape[1]
    assert len(out.scores) == len(out.logits) == len(ref.scores) == steps
    new = out.sequences[:, ids.shape[1]:]
    done_before = torch.zeros(len(ids), dtype=torch.bool)
    finished = torch.zeros(new.shape, dtype=torch.bool)  # [row, step]: the row had finished before that step
    for t in range(steps):
        finished[:, t] = done_before
        live = ~done_before
        # rows still decoding: the distribution their token came from (ours from a wider verify forward: float
        # rounding may differ in the last bits)
        hidden = model.config.hidden_size
        _assert_equal_up_to_rounding(out.scores[t][live], ref.scores[t][live], hidden)
        _assert_equal_up_to_rounding(out.logits[t][live], ref.logits[t][live], hidden)
        assert (out.scores[t][live].argmax(-1) == new[live, t]).all()
        # rows already finished: all mass on the pad they hold
        if done_before.any():
            assert torch.isinf(out.scores[t][done_before]).sum() == done_before.sum() * (out.scores[t].shape[1] - 1)
            assert (out.scores[t][done_before, 0] == 0).all() and (out.logits[t][done_before, 0] == 0).all()
        done_before |= new[:, t] == eos
    assert done_before.any() and not done_before.all(), "EOS must finish some rows early"
    transition = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    assert torch.isfinite(transition).all()
    assert (transition[finished] == 0).all() and (transition[~finished] < 0).all()


def test_sampling_scores_num_return_sequences_and_seeds():
    model = target(FAMILY)
    (ids, mask), _ = _batch(None)
    options = dict(do_sample=True, top_k=8, min_p=0.05, repetition_penalty=1.2, max_new_tokens=10,
                   num_return_sequences=3, return_dict_in_generate=True, output_scores=True, pad_token_id=0,
                   assistant_model=draft(FAMILY, "agree"), adaptive=False)
    torch.manual_seed(0)
    a = specdec.generate(model, ids, mask, **options)
    torch.manual_seed(0)
    b = specdec.generate(model, ids, mask, **options)
    c = specdec.generate(model, ids, mask, seed=5, **options)
    d = specdec.generate(model, ids, mask, seed=5, **options)
    assert a.sequences.shape == (3 * len(ids), ids.shape[1] + 10)
    assert torch.equal(a.sequences[:, :ids.shape[1]], ids.repeat_interleave(3, dim=0))
    assert torch.equal(a.sequences, b.sequences) and torch.equal(c.sequences, d.sequences)
    assert not torch.equal(a.sequences, c.sequences)
    new = a.sequences[:, ids.shape[1]:]
    for t, scores in enumerate(a.scores):
        chosen = scores.gather(1, new[:, t:t + 1])
        assert torch.isfinite(chosen).all(), "a sampled token outside the processed support"
        assert (torch.isfinite(scores).sum(-1) <= 8).all()  # top_k=8 applied
    assert len({tuple(r) for r in new.tolist()}) > len(ids), "copies of one prompt should differ"


@pytest.mark.parametrize("kind", ["assistant", "lookup", "none"])
def test_text_streamer_at_batch_one(kind):
    model = target(FAMILY)
    p = prompts((9,), seed=3)[0]
    ids = torch.tensor([[0, 0] + p])
    mask = torch.tensor([[0, 0] + [1] * len(p)])
    extra = {"assistant": {"assistant_model": draft(FAMILY, "agree")}, "lookup": {"prompt_lookup_num_tokens": 3},
             "none": {}}[kind]
    ours, theirs = Recording(), Recording()
    out = specdec.generate(model, ids, mask, max_new_tokens=16, pad_token_id=0, streamer=ours, adaptive=False,
                           **extra)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=16, pad_token_id=0, do_sample=False,
                             streamer=theirs)
    assert torch.equal(out, ref)
    assert torch.equal(ours.puts[0], ids) and ours.ends == 1  # the prompt first, as given; end() once
    streamed = torch.cat([v.reshape(-1) for v in ours.puts[1:]])
    assert torch.equal(streamed, out[0, ids.shape[1]:])
    assert ours.text == theirs.text
    if kind == "assistant":
        assert max(v.numel() for v in ours.puts[1:]) > 1, "accepted drafts arrive several tokens at a time"


def test_text_iterator_streamer_in_a_thread():
    model = target(FAMILY)
    ids = torch.tensor([prompts((6,), seed=4)[0]])
    streamer = TextIteratorStreamer(LetterTokenizer(), skip_prompt=True, timeout=60)
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=specdec.generate(
        model, ids, max_new_tokens=20, streamer=streamer, assistant_model=draft(FAMILY, "agree"))))
    worker.start()
    text = "".join(streamer)
    worker.join()
    assert text == LetterTokenizer().decode(result["out"][0, ids.shape[1]:].tolist())


def _forwards(*models):
    calls = []
    hooks = [m.register_forward_pre_hook(lambda *a: calls.append(1)) for m in models]
    return calls, hooks


def test_streamer_at_batch_above_one_is_transformers_error():
    model, helper = target(FAMILY), draft(FAMILY, "agree")
    (ids, mask), _ = _batch(None)
    with torch.no_grad(), pytest.raises(ValueError) as theirs:
        model.generate(ids, attention_mask=mask, max_new_tokens=4, pad_token_id=0, streamer=Recording())
    calls, hooks = _forwards(model, helper)
    try:
        with pytest.raises(ValueError) as ours:
            specdec.generate(model, ids, mask, max_new_tokens=4, pad_token_id=0, streamer=Recording(),
                             assistant_model=helper)
        with pytest.raises(ValueError, match="batch size 1"):  # any other streamer: our own error
            specdec.generate(model, ids, mask, max_new_tokens=4, pad_token_id=0, streamer=BaseStreamer())
        with pytest.raises(ValueError, match="batch size 1"):  # copies of one prompt are a batch too
            specdec.generate(model, ids[:1], mask[:1], max_new_tokens=4, pad_token_id=0, streamer=Recording(),
                             do_sample=True, num_return_sequences=2)
    finally:
        for h in hooks:
            h.remove()
    assert str(ours.value) == str(theirs.value) == "TextStreamer only supports batch size 1"
    assert calls == []
