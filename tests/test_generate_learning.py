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


def test_fixed_k_skips_what_only_decisions_use():
    """adaptive=False times no forwards and bins no draft confidences (nothing prices drafts), yet keeps its
    stats: every step at full width, an acceptance table keyed by draft position."""
    from specdec import SpeculativeDecoder
    model = tiny_model("llama", vocab_size=64, seed=33)
    draft = agreeing_draft(model, seed=34)
    dec = SpeculativeDecoder(model, draft, num_draft_tokens=3, adaptive=False)
    r = dec.generate([[3, 4, 5, 6], [7, 8, 9]], max_new_tokens=9)
    assert not dec.controller.target_costs.seconds and not dec.controller.draft_costs.seconds
    assert r.stats["width_histogram"] == [0, 0, 0, r.stats["steps"]]
    assert max(len(key.split("/")) for key in r.stats["acceptance_table"]) == 2  # (drafter, position): no bins
    adaptive = SpeculativeDecoder(model, draft, num_draft_tokens=3)
    r = adaptive.generate([[3, 4, 5, 6], [7, 8, 9]], max_new_tokens=9)
    assert adaptive.controller.target_costs.seconds


def test_the_controller_hears_what_rows_have_left_once_nothing_waits():
    """While prompts wait for room every token counts alike (remaining=None); once the batch drains, plan gets
    each row's tokens left, which fall as the rows decode."""
    from specdec import SpeculativeDecoder
    from specdec.scheduling.control import SpeculationController

    seen = []

    class Spy(SpeculationController):
        def plan(self, rows, keys, *, remaining=None, **kwargs):
            seen.append((list(rows), None if remaining is None else list(remaining)))
            return super().plan(rows, keys, remaining=remaining, **kwargs)

    torch.manual_seed(35)
    model = tiny_model("llama", vocab_size=64, seed=35)
    dec = SpeculativeDecoder(model, agreeing_draft(model, seed=36), num_draft_tokens=2, controller=Spy(2))
    out = dec.generate([[3, 4, 5], [6, 7], [8, 9, 10, 11]], max_new_tokens=5, batch_size=2, eos_token_id=[])
    assert [len(s) for s in out.sequences] == [5, 5, 5]
    assert seen[0] == ([0, 1], None)  # prompt 2 waits
    drained = [(rows, left) for rows, left in seen if left is not None]
    assert drained and all(2 in rows for rows, _ in drained)  # prompt 2 is in: nothing waits any more
    assert all(0 < n <= 5 for _, left in drained for n in left)
    assert [left[rows.index(2)] for rows, left in drained] == sorted([left[rows.index(2)] for rows, left in drained],
                                                                       reverse=True)
