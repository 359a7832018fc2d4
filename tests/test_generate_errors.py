"""Everything specdec.generate refuses is a ValueError naming the option, raised before any forward of the target
or the draft (counted with forward hooks)."""

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.stopping_criteria import MaxLengthCriteria, StoppingCriteriaList
from transformers import WatermarkingConfig

import specdec
from engine_models import draft, target
from specdec.models import tiny_model

FAMILY = "llama"
IDS = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
MASK = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])

# id -> (keyword arguments, a fragment the message must contain)
REFUSED = {
    "beam-search": ({"num_beams": 2}, "num_beams"),
    "group-beam-search": ({"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.5}, "num_beams"),
    "contrastive": ({"penalty_alpha": 0.6, "top_k": 4}, "penalty_alpha"),
    "constrained": ({"force_words_ids": [[5]], "num_beams": 1}, "force_words_ids"),
    "dola": ({"dola_layers": "low"}, "dola_layers"),
    "attentions": ({"output_attentions": True, "return_dict_in_generate": True}, "output_attentions"),
    "hidden-states": ({"output_hidden_states": True, "return_dict_in_generate": True}, "output_hidden_states"),
    "max-time": ({"max_time": 5.0}, "max_time"),
    "stop-strings": ({"stop_strings": ["x"]}, "stop_strings"),
    "token-healing": ({"token_healing": True}, "token_healing"),
    "guidance": ({"guidance_scale": 1.5}, "guidance_scale"),
    "forced-eos": ({"forced_eos_token_id": 3}, "forced_eos_token_id"),
    "forced-bos": ({"forced_bos_token_id": 3}, "forced_bos_token_id"),
    "length-decay": ({"exponential_decay_length_penalty": (2, 1.1)}, "exponential_decay_length_penalty"),
    "encoder-penalty": ({"encoder_repetition_penalty": 1.2}, "encoder_repetition_penalty"),
    "watermark": ({"watermarking_config": WatermarkingConfig()}, "watermarking_config"),
    "mtp": ({"use_mtp": True}, "use_mtp"),
    "early-exit-and-assistant": ({"assistant_early_exit": 1}, "not assistant_model and assistant_early_exit"),
    "early-exit-whole-model": ({"assistant_early_exit": 2, "assistant_model": None},
                               r"assistant_early_exit=2: layers must be an int in 1\.\.1"),
    "early-exit-autoregressive": ({"assistant_early_exit": 1, "assistant_model": None, "scheduler": "autoregressive"},
                                  "assistant_early_exit, or pick"),
    "ensemble": ({"assistant_ensemble_weight": 0.5}, "assistant_ensemble_weight"),
    "greedy-copies": ({"num_return_sequences": 2}, "num_return_sequences"),  # transformers' own validation
    "stopping-criteria": ({"stopping_criteria": StoppingCriteriaList([MaxLengthCriteria(6)])}, "stopping_criteria"),
    "prefix-fn": ({"prefix_allowed_tokens_fn": lambda b, ids: [1]}, "prefix_allowed_tokens_fn"),
    "synced-gpus": ({"synced_gpus": True}, "synced_gpus"),
    "tokenizer": ({"tokenizer": object()}, "tokenizer"),
    "inputs": ({"inputs": IDS}, "inputs"),
    "model-input": ({"inputs_embeds": torch.zeros(2, 4, 64)}, "inputs_embeds"),
    "position-ids": ({"position_ids": torch.zeros(2, 4, dtype=torch.long)}, "position_ids"),
    "unknown": ({"frobnicate": 1}, "frobnicate"),
    "lookup-and-assistant": ({"prompt_lookup_num_tokens": 3}, "prompt_lookup_num_tokens"),
    "k-contradicts-lookup": ({"prompt_lookup_num_tokens": 3, "num_draft_tokens": 5, "assistant_model": None},
                             "num_draft_tokens"),
    "autoregressive-with-draft": ({"scheduler": "autoregressive"}, "autoregressive"),
    "bad-scheduler": ({"scheduler": "beam"}, "scheduler"),
    "bad-realign": ({"realign": "sideways"}, "realign"),
    "bad-backend": ({"backend": "abacus"}, "abacus"),
    "bad-batch-size": ({"batch_size": 0}, "batch_size"),
    "bad-seed": ({"seed": "x", "do_sample": True}, "seed"),
    "bad-temperature": ({"do_sample": True, "temperature": -1.0}, "temperature"),
    "bad-penalty": ({"repetition_penalty": -1.0}, "penalty"),
    "bad-bad-words": ({"bad_words_ids": [5]}, "bad_words_ids"),
    "too-long": ({"max_new_tokens": 100000}, "position limit"),
    "max-length-below-input": ({"max_length": 3, "max_new_tokens": None}, "max_length"),
    "zero-new-tokens": ({"max_new_tokens": 0}, "max_new_tokens"),
    "generation-config-beams": ({"generation_config": GenerationConfig(num_beams=3)}, "num_beams"),
}

BAD_INPUTS = {
    "no-input-ids": ({"input_ids": None}, "input_ids"),
    "one-dimensional": ({"input_ids": IDS[0]}, "input_ids"),
    "float-ids": ({"input_ids": IDS.float()}, "input_ids"),
    "mask-shape": ({"attention_mask": MASK[:, 1:]}, "attention_mask"),
    "mask-holes": ({"attention_mask": torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])}, "padding between tokens"),
    "mask-empty-row": ({"attention_mask": torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]])}, "all padding"),
    "mask-values": ({"attention_mask": MASK * 2}, "only 0 and 1"),
    "id-outside-vocab": ({"input_ids": IDS + 10000}, "outside the vocabulary"),
}


@pytest.fixture
def forwards():
    model, helper = target(FAMILY), draft(FAMILY, "agree")
    calls = []
    hooks = [m.register_forward_pre_hook(lambda *a: calls.append(1)) for m in (model, helper)]
    yield model, helper, calls
    for h in hooks:
        h.remove()


@pytest.mark.parametrize("name", sorted(REFUSED) + sorted(BAD_INPUTS))
def test_refused_before_any_forward(forwards, name):
    model, helper, calls = forwards
    options, fragment = {**REFUSED, **BAD_INPUTS}[name]
    call = {"input_ids": IDS, "attention_mask": MASK, "max_new_tokens": 4, "pad_token_id": 0,
            "assistant_model": helper, **options}
    with pytest.raises(ValueError, match=fragment):
        specdec.generate(model, **call)
    assert calls == [], f"{len(calls)} forwards ran before the refusal"


def test_refused_models(forwards):
    model, helper, calls = forwards
    other_vocab = tiny_model("llama", vocab_size=100, hidden_size=32, num_layers=1, seed=1)
    with pytest.raises(ValueError, match="vocabulary"):
        specdec.generate(model, IDS, MASK, max_new_tokens=4, assistant_model=other_vocab)
    with pytest.raises(ValueError, match="assistant_model or a drafter|draft must be"):
        specdec.generate(model, IDS, MASK, max_new_tokens=4, assistant_model="a draft")
    assert calls == []


def test_ignored_options_change_nothing():
    # Options that only tune transformers' own caching, compilation or assisted-generation schedule.
    model, helper = target(FAMILY), draft(FAMILY, "agree")
    base = specdec.generate(model, IDS, MASK, max_new_tokens=6, pad_token_id=0, assistant_model=helper)
    tuned = specdec.generate(model, IDS, MASK, max_new_tokens=6, pad_token_id=0, assistant_model=helper,
                             use_cache=False, cache_implementation="static", num_assistant_tokens=3,
                             num_assistant_tokens_schedule="heuristic", assistant_confidence_threshold=0.2,
                             early_stopping=True, length_penalty=2.0, temperature=0.5)  # greedy: no warpers
    assert torch.equal(base, tuned)
