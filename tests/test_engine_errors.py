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
    # issue 9: every bad argument type is a ValueError naming the argument, before any forward
    ("top-k-bool", [[1]], {"do_sample": True, "top_k": True}, "top_k"),
    ("top-k-bool-greedy", [[1]], {"top_k": True}, "top_k"),
    ("top-k-float", [[1]], {"do_sample": True, "top_k": 2.5}, "top_k"),
    ("top-k-str", [[1]], {"do_sample": True, "top_k": "5"}, "top_k"),
    ("top-p-bool", [[1]], {"do_sample": True, "top_p": True}, "top_p"),
    ("top-p-str", [[1]], {"do_sample": True, "top_p": "0.9"}, "top_p"),
    ("top-p-none", [[1]], {"do_sample": True, "top_p": None}, "top_p"),
    ("temperature-str", [[1]], {"do_sample": True, "temperature": "hot"}, "temperature"),
    ("temperature-str-greedy", [[1]], {"temperature": "hot"}, "temperature"),
    ("temperature-none", [[1]], {"do_sample": True, "temperature": None}, "temperature"),
    ("temperature-bool", [[1]], {"do_sample": True, "temperature": True}, "temperature"),
    ("temperature-nan", [[1]], {"do_sample": True, "temperature": float("nan")}, "temperature"),
    ("temperature-inf", [[1]], {"do_sample": True, "temperature": float("inf")}, "temperature"),
    ("temperature-negative", [[1]], {"do_sample": True, "temperature": -0.5}, "temperature"),
    # a temperature that float32 logits cannot be divided by: the bound is float32's smallest normal number
    ("temperature-1e-300", [[1]], {"do_sample": True, "temperature": 1e-300}, r"temperature.*1\.1754944e-38"),
    ("temperature-below-float32-normal", [[1]], {"do_sample": True, "temperature": 1e-38}, "float32"),
    ("do-sample-str", [[1]], {"do_sample": "yes"}, "do_sample"),
    ("do-sample-none", [[1]], {"do_sample": None}, "do_sample"),
    ("do-sample-int", [[1]], {"do_sample": 1}, "do_sample"),
    ("seed-float", [[1]], {"seed": 1.5}, "seed"),
    ("seed-str", [[1]], {"seed": "1"}, "seed"),
    ("seed-bool", [[1]], {"seed": True}, "seed"),
    ("seed-too-large", [[1]], {"seed": 2 ** 64}, "seed"),
    ("eos-float", [[1]], {"eos_token_id": 3.0}, "eos_token_id"),
    ("eos-list-with-float", [[1]], {"eos_token_id": [1, 2.0]}, "eos_token_id"),
    ("eos-str", [[1]], {"eos_token_id": "3"}, "eos_token_id"),
    ("eos-bool", [[1]], {"eos_token_id": True}, "eos_token_id"),
    ("eos-nested", [[1]], {"eos_token_id": [[1]]}, "eos_token_id"),
    ("eos-2d-tensor", [[1]], {"eos_token_id": torch.tensor([[1]])}, "eos_token_id"),
    ("max-new-float", [[1]], {"max_new_tokens": 4.0}, "max_new_tokens"),
    ("max-new-str", [[1]], {"max_new_tokens": "4"}, "max_new_tokens"),
    ("max-new-bool", [[1]], {"max_new_tokens": True}, "max_new_tokens"),
    ("max-new-none", [[1]], {"max_new_tokens": None}, "max_new_tokens"),
    ("batch-float", [[1]], {"batch_size": 2.0}, "batch_size"),
    ("batch-none", [[1]], {"batch_size": None}, "batch_size"),
    ("batch-bool", [[1]], {"batch_size": True}, "batch_size"),
    ("progress-not-callable", [[1]], {"progress": 3}, "progress"),
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
    ("k-bool", {"num_draft_tokens": True}, ValueError, "num_draft_tokens"),
    ("k-str", {"num_draft_tokens": "4"}, ValueError, "num_draft_tokens"),
    ("k-none", {"num_draft_tokens": None}, ValueError, "num_draft_tokens"),
    ("window-float", {"scheduler": "exspec", "window": 4.0}, ValueError, "window"),
    ("window-zero", {"scheduler": "exspec", "window": 0}, ValueError, "window"),
    ("window-bool", {"window": True}, ValueError, "window"),
    ("realign-unknown", {"realign": "twist"}, ValueError, "realign"),
    ("realign-list", {"realign": ["shift"]}, ValueError, "realign"),
    ("realign-none", {"realign": None}, ValueError, "realign"),
    ("compact-threshold-str", {"realign": "mask", "compact_threshold": "0.1"}, ValueError, "compact_threshold"),
    ("compact-threshold-bool", {"compact_threshold": True}, ValueError, "compact_threshold"),
    ("compact-threshold-nan", {"compact_threshold": float("nan")}, ValueError, "compact_threshold"),
    ("compact-threshold-zero", {"compact_threshold": 0.0}, ValueError, "compact_threshold"),
    ("backend-int", {"backend": 3}, ValueError, "backend"),
    ("backend-list", {"backend": ["torch"]}, ValueError, "backend"),
    ("scheduler-list", {"scheduler": ["eqspec"]}, ValueError, "scheduler"),
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


@pytest.mark.parametrize("temperature", [torch.finfo(torch.float32).tiny, 1e-30, 1e-6])
def test_smallest_accepted_temperatures_sample_the_greedy_limit(models, temperature):
    # From the bound up, logits / temperature is computed without overflow (specdec.sampling.processed_probs):
    # a temperature this small makes every distribution one-hot at the argmax, so sampling is greedy decoding.
    target, draft = models
    prompts = [[1, 2, 3], [5], [7, 9]]
    greedy = SpeculativeDecoder(target, draft, num_draft_tokens=3).generate(prompts, max_new_tokens=6,
                                                                            eos_token_id=[])
    sampled = SpeculativeDecoder(target, draft, num_draft_tokens=3).generate(
        prompts, max_new_tokens=6, eos_token_id=[], do_sample=True, temperature=temperature, seed=0)
    assert sampled.sequences == greedy.sequences


def test_numpy_and_tensor_scalars_are_accepted(models):
    np = pytest.importorskip("numpy")
    target, draft = models
    res = SpeculativeDecoder(target, draft, num_draft_tokens=3).generate(
        [[1, 2]], max_new_tokens=np.int64(3), batch_size=np.int32(2), do_sample=True, temperature=np.float32(0.7),
        top_k=np.int64(5), top_p=np.float64(0.9), seed=np.int64(3), eos_token_id=torch.tensor([V - 1]))
    assert len(res.sequences[0]) <= 3
