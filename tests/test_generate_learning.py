"""specdec.generate builds a decoder per call; what the speculation controller learned carries over between
calls on the same target and drafter (costs, acceptance), and never across drafters."""

import torch

import specdec
from specdec import hf_generate
from specdec.models import agreeing_draft, tiny_model


def test_controller_knowledge_carries_over_between_calls():
    model = tiny_model("llama", vocab_size=64, seed=31)
    draft = agreeing_draft(model, seed=32)
    batch = {"input_ids": torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]]), "attention_mask": torch.ones(2, 4,
                                                                                                   dtype=torch.long)}
    first = specdec.generate(model, **batch, assistant_model=draft, max_new_tokens=6)
    learned = hf_generate._LEARNED[model]
    controllers = {id(entry[0]) for entry in learned.values()}
    assert len(controllers) == 1
    (controller,) = [entry[0] for entry in learned.values()]
    seen = dict(controller.target_costs.seconds)
    assert seen, "the first call measured forward costs"
    second = specdec.generate(model, **batch, assistant_model=draft, max_new_tokens=6)
    assert torch.equal(first, second)
    assert {id(entry[0]) for entry in learned.values()} == controllers  # the same controller, not a new one
    specdec.generate(model, **batch, prompt_lookup_num_tokens=3, max_new_tokens=6)
    assert len({id(entry[0]) for entry in learned.values()}) == 2  # another drafter: its own controller
