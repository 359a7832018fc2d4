"""The target's prefills are timed into a table of their own (SpeculationController.prefill_costs): a prefill's
rows have no past, so it costs less per token than a decode step of the same N, and in the steps' monotone table
a fresh one capped every smaller step N (SmolLM2 at batch 4: width 5 priced at 220 ms, run at 307-389 ms)."""

import pytest

from engine_models import prompts, reference, target
from specdec import SpeculativeDecoder
from specdec.drafting.ngram import NgramDrafter
from specdec.scheduling.control import SpeculationController
from test_control import K


def test_a_prefill_does_not_cap_what_a_step_costs():
    ctrl = SpeculationController(K)
    ctrl.clock = 10
    ctrl.observe_target(4, 0.150)
    ctrl.observe_target(20, 0.300)  # batch 4, width 5
    ctrl.observe_prefill(44, 0.200)  # one row of 44 prompt tokens, no past: cheaper, though larger
    assert ctrl._target_estimate(20) == pytest.approx(0.300)  # one table answered 0.200
    assert ctrl._target_estimate(12) == pytest.approx(0.150 + 0.150 * 8 / 16)  # between two steps
    assert 44 not in ctrl.target_costs.seconds and ctrl.prefill_costs.seconds == {44: 0.200}


@pytest.mark.parametrize("steps, n, want", [
    ({}, 44, 0.200),  # no step measured: the prefill
    ({20: 0.300}, 88, 0.400),  # past the largest step: the prefills' extrapolation, below the steps' (1.32 s)
    ({20: 0.300}, 30, 0.300),  # past it, but no cheaper than the largest step (the prefill's 0.200)
    ({20: 0.010}, 88, 0.044),  # the steps' extrapolation where it is the lower
], ids=["no-step", "prefill-lower", "floor-largest-step", "steps-lower"])
def test_past_every_step_the_prefills_price_a_forward(steps, n, want):
    ctrl = SpeculationController(K)
    ctrl.clock = 10
    for tokens, seconds in steps.items():
        ctrl.observe_target(tokens, seconds)
    ctrl.observe_prefill(44, 0.200)
    assert ctrl._target_estimate(n) == pytest.approx(want)


def test_the_engine_times_prefills_into_their_own_table():
    model = target("llama")
    ps = prompts((5, 30, 2, 11, 17), seed=31)
    dec = SpeculativeDecoder(model, NgramDrafter(), num_draft_tokens=K)
    res = dec.generate(ps, max_new_tokens=24, batch_size=3, eos_token_id=[])
    assert res.sequences == reference("llama", ps, 24)
    ctrl = dec.controller
    # every step's N is rows x width, rows <= 3; a prefill's is rows admitted x the longest of their prompts
    assert ctrl.target_costs.seconds and max(ctrl.target_costs.seconds) <= 3 * (K + 1), ctrl.target_costs.seconds
    assert 3 * 30 in ctrl.prefill_costs.seconds and set(ctrl.prefill_costs.seconds) <= {90, 11, 17, 22, 34}, \
        ctrl.prefill_costs.seconds
