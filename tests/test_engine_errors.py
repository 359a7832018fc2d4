"""Bad input is a ValueError that says what is wrong (and which prompt), raised before anything is decoded."""

import copy

import pytest
import torch

from specdec import SpeculativeDecoder
from specdec.models import tiny_model

V = 128
LIMIT = 48


@pytest.fixture(scope="module")
def models():
    target = tiny_model("llama", vocab_size=V, max_positions=LIMIT, seed=1)
    draft = tiny_model("gpt2", vocab_size=V, max_positions=LIMIT, seed=2)
    return target, draft


class ForwardCounter:
    """Counts forward calls of both models: a rejected call must not have run any."""

    def __init__(self, *models):
        self.calls = 0
        self.handles = [m.register_forward_pre_hook(self._hook) for m in models]

    def _hook(self, module, args):
        self.calls += 1

    def close(self):
        for h in self.handles:
            h.remove()


GENERATE_CASES = [
    # id, prompts, kwargs, message fragment
    ("empty-prompt", [[1, 2], [3], []], {}, "prompt 2 is empty"),
    ("id-too-large", [[1, 2], [3, V]], {}, "prompt 1 has token ids outside the vocabulary"),
    ("negative-id", [[-1]], {}, "prompt 0 has token ids outside"),
    ("float-ids", [[1.0, 2.0]], {}, "prompt 0 must be a sequence of int"),
    ("beyond-position-limit", [[1] * 10, [2] * 40], {"max_new_tokens": 9}, "prompt 1 has 40 tokens"),
    ("exactly-at-limit-then-one-more", [[1] * 40], {"max_new_tokens": LIMIT - 39}, "prompt 0"),
    ("negative-max-new", [[1]], {"max_new_tokens": -1}, "max_new_tokens"),
    ("zero-batch", [[1]], {"batch_size": 0}, "batch_size"),
    ("string-without-tokenizer", ["hello"], {}, "prompt 0 is a string but no tokenizer"),
    ("not-a-list", "hello", {}, "prompts must be a list"),
    ("zero-temperature", [[1]], {"do_sample": True, "temperature": 0.0}, "temperature"),
    ("top-p-zero", [[1]], {"do_sample": True, "top_p": 0.0}, "top_p"),
    ("negative-top-k", [[1]], {"do_sample": True, "top_k": -1}, "top_k"),
    ("eos-outside-vocab", [[1]], {"eos_token_id": V}, "eos_token_id"),
]


@pytest.mark.parametrize("prompts,kwargs,fragment", [pytest.param(*c[1:], id=c[0]) for c in GENERATE_CASES])
def test_generate_rejects_before_decoding(models, prompts, kwargs, fragment):
    target, draft = models
    dec = SpeculativeDecoder(target, draft, num_draft_tokens=3)
    counter = ForwardCounter(target, draft)
    try:
        with pytest.raises(ValueError, match=fragment):
            dec.generate(prompts, **{"max_new_tokens": 4, **kwargs})
        assert counter.calls == 0
    finally:
        counter.close()


def test_position_limit_is_inclusive(models):
    target, draft = models
    torch.manual_seed(0)
    res = SpeculativeDecoder(target, draft, num_draft_tokens=4).generate([[1] * 40], max_new_tokens=LIMIT - 40)
    assert len(res.sequences[0]) == LIMIT - 40


CONSTRUCTOR_CASES = [
    ("k-zero", {"num_draft_tokens": 0}, ValueError, "num_draft_tokens"),
    ("k-negative", {"num_draft_tokens": -2}, ValueError, "num_draft_tokens"),
    ("k-float", {"num_draft_tokens": 2.0}, ValueError, "num_draft_tokens"),
    ("unknown-scheduler", {"scheduler": "fastest"}, ValueError, "scheduler"),
    ("unknown-backend", {"backend": "cuda-magic"}, ValueError, "backend"),
    ("eqspec-without-draft", {"draft": None}, ValueError, "draft"),
]


@pytest.mark.parametrize("kwargs,exc,fragment", [pytest.param(*c[1:], id=c[0]) for c in CONSTRUCTOR_CASES])
def test_constructor_rejects(models, kwargs, exc, fragment):
    target, draft = models
    args = {"draft": draft, **kwargs}
    with pytest.raises(exc, match=fragment):
        SpeculativeDecoder(target, **args)


def test_vocabulary_mismatch_names_both_sizes(models):
    target, _ = models
    other = tiny_model("qwen2", vocab_size=V + 3, seed=3)
    with pytest.raises(ValueError, match=rf"\({V + 3}\).*\({V}\)"):
        SpeculativeDecoder(target, other)


def test_models_on_different_devices(models):
    target, draft = models
    on_meta = copy.deepcopy(draft).to("meta")
    with pytest.raises(ValueError, match="cpu.*meta"):
        SpeculativeDecoder(target, on_meta)


def test_empty_prompt_list_gives_an_empty_result(models):
    target, draft = models
    counter = ForwardCounter(target, draft)
    try:
        res = SpeculativeDecoder(target, draft).generate([], max_new_tokens=5)
        assert res.sequences == [] and res.stats["new_tokens"] == 0
        assert counter.calls == 0
    finally:
        counter.close()
