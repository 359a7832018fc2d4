"""Dormancy (specdec.scheduling.rest.DORMANT_AFTER): a long plain spell of a drafter without a draft model runs
whole steps as plain decoding, with no offer, plan, timing or record. On scripted books: when it begins, how its
runs double to the cap, what ends it; in the engine: those steps are plain decoding's own, greedy and sampled."""

import pytest
import torch

from engine_models import SPEC_SCHEDULERS, decoder, prompts, reference, target
from specdec import SpeculativeDecoder
from specdec.drafting.ngram import NgramDrafter
from specdec.scheduling.control import Plan, SpeculationController
from specdec.scheduling.loop import DecodeLoop
from specdec.scheduling.rest import DORMANT_AFTER, DORMANT_MAX
from test_control import K, _plain_whatever_is_offered, ngram_keys


def _fresh_costs(ctrl, batch):
    """Every width measured this step: no cost turns stale, so no exploration breaks a scripted spell."""
    for n in range(1, batch * (K + 1) + 1):
        ctrl.observe_target(n, 0.01 if n <= batch else 0.014 + 0.00025 * (n - 2 * batch))


def _steps(ctrl, rows, steps, keys=None):
    """Run `steps` steps the way the decode loop does ("d": dormant, "p": planned plain, "s": speculative)."""
    out = []
    keys = ngram_keys(len(rows), n=1) if keys is None else keys
    for _ in range(steps):
        if ctrl.dormant(rows):
            out.append("d")
            continue
        plan = ctrl.plan(rows, keys)
        _fresh_costs(ctrl, len(rows))
        ctrl.record(plan, [k[:c] for k, c in zip(keys, plan.num_draft)], [0] * len(rows))
        out.append("p" if plan.width == 1 else "s")
    return "".join(out)


def _doubling(plans_before: int, runs: int) -> str:
    """The pattern of a spell: plans_before plans, then a dormant run of 1, 2, 4 .. DORMANT_MAX after each plan."""
    out, skip = "p" * plans_before, 0
    for _ in range(runs):
        skip = min(DORMANT_MAX, 2 * skip or 1)
        out += "d" * skip + "p"
    return out


@pytest.mark.parametrize("batch", [1, 4, 8], ids=lambda b: f"B{b}")
def test_a_long_plain_spell_goes_dormant_in_doubling_runs(batch):
    ctrl = _plain_whatever_is_offered(batch)
    rows = list(range(batch))
    before = {"clock": ctrl.clock, "plain": ctrl.plain_steps}
    want = _doubling(DORMANT_AFTER, 6)
    got = _steps(ctrl, rows, len(want))
    assert got == want
    stats = ctrl.stats()
    # a dormant step is booked as the plain step it is: the clock (ages, budget), the histogram, the tokens
    assert stats["dormant_steps"] == want.count("d") > 0
    assert ctrl.clock - before["clock"] == len(want) == ctrl.plain_steps - before["plain"]
    assert stats["width_histogram"][0] == len(want) and stats["realised_tokens_per_step"] == batch


def test_other_rows_are_priced_at_once_and_start_the_doubling_again():
    batch = 4
    ctrl = _plain_whatever_is_offered(batch)
    rows = list(range(batch))
    assert _steps(ctrl, rows, DORMANT_AFTER + 4) == _doubling(DORMANT_AFTER, 2)[:DORMANT_AFTER + 4]
    new = [0, 1, 2, 9]  # a row retired, a prompt admitted: its offers are priced on its first step
    assert _steps(ctrl, new, 1 + 1 + 2) == "p" + "d" + "p" + "d"
    assert _steps(ctrl, rows, 1) == "p"  # and back: priced, not dormant on the old rows' grant


def test_a_speculative_or_exploring_plan_ends_it():
    batch = 4
    ctrl = _plain_whatever_is_offered(batch)
    rows = list(range(batch))
    _steps(ctrl, rows, len(_doubling(DORMANT_AFTER, 3)))
    assert ctrl.dormant(rows)
    while ctrl.dormant(rows):
        pass
    for j in range(200):  # 3-gram drafts now land: the next planned step speculates, and dormancy ends
        for i in range(1, K + 1):
            ctrl.acceptance.observe(("ngram", 3, i), True)
    assert _steps(ctrl, rows, 1, ngram_keys(batch, n=3)) == "s"
    assert _steps(ctrl, rows, DORMANT_AFTER + 1) == _doubling(DORMANT_AFTER, 1)[:DORMANT_AFTER + 1]
    # an exploration (here a plain one, re-measuring plain decoding while speculating) ends it as well
    ctrl._note_plain(Plan(1, [0] * batch, float(batch), 0.01, explore=True), rows)
    assert not ctrl.dormant(rows)
    assert _steps(ctrl, rows, DORMANT_AFTER) == "p" * DORMANT_AFTER


@pytest.mark.parametrize("kind", ["draft model", "fixed K"])
def test_a_draft_model_or_fixed_k_is_never_dormant(kind):
    batch = 2
    if kind == "draft model":  # its plain steps price a lag, and an early exit learns off them
        ctrl = SpeculationController(K, draft_cost_ratio=0.9)
        for n in range(1, batch * (K + 2) + 1):
            ctrl.observe_draft(n, 0.02)
    else:
        ctrl = SpeculationController(K, enabled=False)
    for i in range(1, K + 1):
        for j in range(200):
            ctrl.acceptance.observe(("ngram", 1, i), False)
    rows, keys = list(range(batch)), [[] for _ in range(batch)]  # no offers: every plan is plain
    assert _steps(ctrl, rows, 3 * DORMANT_AFTER, keys) == "p" * 3 * DORMANT_AFTER


def _taught_ngram_decoder(model, scheduler, drafter=None, explore=True):
    """An adaptive n-gram decoder whose table has seen every n-gram draft miss: it decodes plainly but for an
    exploration or two (none with explore=False: no budget for them)."""
    extra = {} if explore else {"controller": SpeculationController(K, explore_share=0.0, warmup_explore=0)}
    dec = decoder(model, drafter or NgramDrafter(), scheduler, window=4, num_draft_tokens=K, control="adaptive",
                  **extra)
    for n in range(1, 5):
        for i in range(1, K + 1):
            for _ in range(400):
                dec.controller.acceptance.observe(("ngram", n, i), False)
    return dec


class _CountOffers(NgramDrafter):
    def __init__(self):
        super().__init__()
        self.offers = 0

    def offer(self, batch, k):
        self.offers += 1
        return super().offer(batch, k)


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_dormant_steps_decode_greedily_and_skip_the_drafter(scheduler, monkeypatch):
    model = target("llama")
    ps = prompts((3, 40, 1, 17, 9), seed=21)
    drafter = _CountOffers()
    # no exploration budget: every plan is plain whatever the machine's timings, so the dormant runs are the
    # schedule's alone (with one, a loaded machine's timings moved the explorations and the count: 22 of 93)
    dec = _taught_ngram_decoder(model, scheduler, drafter, explore=False)
    verify, timed = DecodeLoop.verify, []

    def counted(self, batch, proposal):  # a timed verify forward leaves a timing for the controller
        before = len(self.clock._pending)
        out = verify(self, batch, proposal)
        timed.append(len(self.clock._pending) > before)
        return out

    monkeypatch.setattr(DecodeLoop, "verify", counted)
    res = dec.generate(ps, max_new_tokens=48, batch_size=3, eos_token_id=[])
    assert res.sequences == reference("llama", ps, 48)
    stats = res.stats
    assert len(timed) == stats["steps"] and timed.count(False) == stats["dormant_steps"]  # the others are timed
    assert stats["dormant_steps"] > stats["steps"] // 3, (stats["dormant_steps"], stats["steps"])
    assert stats["plain_steps"] == stats["steps"]
    assert drafter.offers == stats["steps"] - stats["dormant_steps"]


def test_dormant_steps_sample_as_plain_decoding_does():
    # every step plain, dormant or not: the generator is drawn exactly as plain decoding draws it, so a seeded
    # sampled run is plain decoding's own, token for token
    model = target("qwen2")
    ps = prompts((5, 30, 2, 11), seed=22)
    plain = SpeculativeDecoder(model, None, scheduler="autoregressive")
    dec = _taught_ngram_decoder(model, "eqspec", explore=False)
    kw = dict(max_new_tokens=40, batch_size=2, eos_token_id=[], do_sample=True, temperature=1.0, seed=7)
    want = plain.generate(ps, **kw).sequences
    res = dec.generate(ps, **kw)
    assert res.stats["dormant_steps"] > 0 and res.stats["plain_steps"] == res.stats["steps"]
    assert res.sequences == want
