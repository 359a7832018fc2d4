"""The speculation controller on scripted costs and acceptances (no model): it must go plain where speculation
cannot pay, verify everything where drafts land and verification is cheap, follow the script when it changes,
and stay inside its exploration budget."""

import math
import random

import pytest

from specdec.scheduling.control import AcceptanceTable, ForwardCosts, SpeculationController, _clamp
from specdec.scheduling.estimates import KEPT_SAMPLES
from specdec.scheduling.rest import REST_STEPS

K = 4


def ngram_keys(batch, n=2):
    return [[("ngram", n, i) for i in range(1, K + 1)] for _ in range(batch)]


def simulate(ctrl, steps, cost, accept, batch=4, seed=0, keys=ngram_keys, hindsight=None):
    """Run `steps` planned steps; cost(N) is a forward's seconds, accept(b, i) draft i's acceptance chance.
    hindsight None: draw only the verified drafts' verdicts. True or False: draw how far the target's text
    follows each whole offer, and with True judge the unverified rest as a deterministic drafter does (the
    drafts after the verified ones, up to the first the text does not match)."""
    rng = random.Random(seed)
    widths = []
    for _ in range(steps):
        rows = list(range(batch))
        offered = keys(batch)
        plan = ctrl.plan(rows, offered)
        ctrl.observe_target(batch * plan.width, cost(batch * plan.width))
        accepted, judged = [], []
        for b in rows:
            c = plan.num_draft[b]
            limit = c if hindsight is None else len(offered[b])
            a = 0
            while a < limit and rng.random() < accept(b, a + 1):
                a += 1
            accepted.append(min(a, c))
            if a >= c and c < len(offered[b]):
                judged.append((b, offered[b][c:min(a + 1, len(offered[b]))], a - c))
        ctrl.record(plan, [offered[b][:plan.num_draft[b]] for b in rows], accepted)
        if hindsight:
            ctrl.judge(judged)
        widths.append(plan.width)
    return widths


def dear(n):  # verification of w columns costs w plain steps: speculation can only lose
    return 0.01 * n


def cheap(n):  # a GPU-like flat cost
    return 0.01


@pytest.mark.parametrize("batch", [1, 4, 8], ids=lambda b: f"B{b}")
def test_goes_plain_when_verification_is_dear_and_drafts_rarely_land(batch):
    ctrl = SpeculationController(K)
    widths = simulate(ctrl, 400, dear, lambda b, i: 0.1, batch=batch, seed=batch)
    assert widths[0] == 1  # the first step measures plain decoding
    tail = widths[100:]
    assert tail.count(1) / len(tail) >= 0.95, widths
    stats = ctrl.stats()
    assert stats["explore_steps"] <= ctrl.warmup_explore + ctrl.explore_share * 400


@pytest.mark.parametrize("batch", [1, 4, 8], ids=lambda b: f"B{b}")
def test_verifies_everything_when_drafts_always_land_and_verification_is_cheap(batch):
    ctrl = SpeculationController(K)
    widths = simulate(ctrl, 200, cheap, lambda b, i: 1.0, batch=batch, seed=batch)
    tail = widths[20:]
    assert tail.count(K + 1) / len(tail) >= 0.95, widths
    assert ctrl.stats()["mean_width"] > K


def test_follows_the_script_when_it_changes():
    ctrl = SpeculationController(K)
    state = {"cost": dear, "p": 0.05}
    widths = simulate(ctrl, 300, lambda n: state["cost"](n), lambda b, i: state["p"], seed=1)
    assert widths[-100:].count(1) >= 95
    state.update(cost=cheap, p=1.0)
    widths = simulate(ctrl, 600, lambda n: state["cost"](n), lambda b, i: state["p"], seed=2)
    assert widths[-100:].count(K + 1) >= 95, widths
    state.update(cost=dear, p=0.05)
    widths = simulate(ctrl, 600, lambda n: state["cost"](n), lambda b, i: state["p"], seed=3)
    assert widths[-100:].count(1) >= 95, widths
    assert ctrl.stats()["explore_steps"] <= ctrl.warmup_explore + ctrl.explore_share * ctrl.steps


def test_picks_the_middle_width_a_step_shaped_cost_favours():
    # This CPU's shape: up to 3 query tokens cost one plain step, 4 or more cost 1.6x. With drafts landing 60%
    # of the time at batch 1, width 3 (2 drafts, 1.96 tokens for 1.0x) beats width 5 (2.3 tokens for 1.6x).
    ctrl = SpeculationController(K)
    widths = simulate(ctrl, 300, lambda n: 0.05 if n <= 3 else 0.08, lambda b, i: 0.6, batch=1)
    tail = widths[50:]
    assert tail.count(3) / len(tail) >= 0.9, widths



def test_a_predicted_gain_under_the_margin_stays_plain():
    # Width 2 costs 1.5 plain steps and its one draft lands 55% of the time (well measured): 1.55 tokens for
    # 1.5, a 3% gain on paper, under SPECULATE_MARGIN. The best of noisy estimates is biased upwards, so this
    # stays plain; at 70% (a 13% gain) it speculates.
    for p, width in ((0.55, 1), (0.70, 2)):
        ctrl = SpeculationController(K)
        ctrl.clock = 10
        ctrl.observe_target(1, 0.010)
        ctrl.observe_target(2, 0.015)
        key = ("ngram", 2, 1)
        for i in range(1000):
            ctrl.acceptance.observe(key, i % 100 < 100 * p)
        assert ctrl.plan([0], [[key]]).width == width, p


def _drain_controller():
    """Batch 4, a plain step costing alpha = 5 ms + beta = 0.1 ms per row (the demo pair's shape: fixed costs
    dominate), every width measured; rows 0-2 offer drafts that always land, row 3 drafts that never do."""
    ctrl = SpeculationController(K)
    ctrl.clock = 10
    for n in (1, 2, 3, 4, 8, 12, 16, 20):
        ctrl.observe_target(n, 0.005 + 0.0001 * n)
    keys = [[("good", i) for i in range(1, K + 1)]] * 3 + [[("bad", i) for i in range(1, K + 1)]]
    for _ in range(200):
        for i in range(1, K + 1):
            ctrl.acceptance.observe(("good", i), True)
            ctrl.acceptance.observe(("bad", i), False)
    return ctrl, keys


def test_a_draining_batch_values_the_tokens_that_end_it_sooner():
    # While prompts wait, rows 0-2's landing drafts pay (16 tokens for 1.4x a plain step). Once nothing waits
    # and row 3 is the longest, their tokens only drop rows that cost 0.1 ms a step: the run still ends with
    # row 3, whose drafts never land, so plain decoding it is. With every row tied it is tokens per second again.
    ctrl, keys = _drain_controller()
    rows = [0, 1, 2, 3]
    assert ctrl.plan(rows, keys).width == K + 1
    assert ctrl.plan(rows, keys, remaining=[20, 20, 20, 20]).width == K + 1
    assert ctrl.plan(rows, keys, remaining=[10, 10, 10, 20]).width == 1
    # the longest row's own drafts landing pays again (its tokens are worth alpha + beta each)
    assert ctrl.plan(rows, [keys[3]] * 3 + [keys[0]], remaining=[10, 10, 10, 20]).width == K + 1


def test_token_worth_shares_the_fixed_cost_among_the_longest_rows():
    ctrl, _ = _drain_controller()
    full = 0.005 + 0.0004  # c(4): what a plain step at batch 4 costs; beta = 0.1 ms
    assert ctrl.token_worth([7, 7, 7, 7]) == pytest.approx([1.0] * 4)
    worth = ctrl.token_worth([3, 9, 9, 1])
    assert sum(worth) == pytest.approx(4.0)
    assert worth[0] == worth[3] == pytest.approx(0.0001 / (full / 4))
    assert worth[1] == worth[2] == pytest.approx((0.0001 + (full - 4 * 0.0001) / 2) / (full / 4))
    assert ctrl.token_worth([5]) == [1.0]
    fresh = SpeculationController(K)
    fresh.observe_target(4, 0.01)  # no other size measured: no slope, every token alike
    assert fresh.token_worth([1, 2, 3, 4]) == [1.0] * 4


def test_width_follows_the_proposal_strength_per_row():
    # unigram matches rarely land, 4-gram matches nearly always; one row of each at batch 2, cost ~ N
    ctrl = SpeculationController(K)

    def keys(batch):
        return [[("ngram", 1, i) for i in range(1, K + 1)], [("ngram", 4, i) for i in range(1, K + 1)]]

    widths = simulate(ctrl, 300, lambda n: 0.02 + 0.004 * n, lambda b, i: 0.05 if b == 0 else 0.97, batch=2,
                      keys=keys)
    assert ctrl.acceptance.rate(("ngram", 4, 1)) > 0.9 > 0.2 > ctrl.acceptance.rate(("ngram", 1, 1))
    assert widths[-100:].count(K + 1) >= 90


def test_rows_with_no_proposal_do_not_widen_the_step():
    ctrl = SpeculationController(K)
    widths = simulate(ctrl, 50, cheap, lambda b, i: 1.0, batch=3, keys=lambda batch: [[]] * batch)
    assert set(widths) == {1}


def test_draft_as_dear_as_the_target_is_never_run():
    # A draft model costing what the target does can never pay: k drafts + a verify > k + 1 plain steps.
    ctrl = SpeculationController(K, draft_cost_ratio=1.0)
    model_keys = lambda batch: [[("model", i) for i in range(1, K + 1)]] * batch  # noqa: E731
    widths = simulate(ctrl, 100, lambda n: 0.01 * (1 + 0.1 * n), lambda b, i: 1.0, batch=4, keys=model_keys)
    assert set(widths) == {1}


def test_cheap_draft_model_is_used_and_stops_early_on_low_confidence():
    ctrl = SpeculationController(K, draft_cost_ratio=0.05)
    model_keys = lambda batch: [[("model", i) for i in range(1, K + 1)]] * batch  # noqa: E731
    widths = simulate(ctrl, 100, cheap, lambda b, i: 0.9, batch=2, keys=model_keys)
    assert widths[-50:].count(K + 1) >= 45
    plan = ctrl.plan([0, 1], model_keys(2))
    position_keys = [("model", i) for i in range(1, K + 1)]
    for i in range(1, 200):  # teach it that a low-confidence first draft never lands
        ctrl.acceptance.observe(("model", 1, "low"), False)
    assert not ctrl.keep_drafting(plan, 1, [[("model", 1, "low")]] * 2, position_keys)
    assert ctrl.keep_drafting(plan, 1, [[("model", 1)]] * 2, position_keys)


@pytest.mark.parametrize("explore", [True, False], ids=["exploring", "believed"])
def test_an_exploration_drafts_to_the_width_it_chose(explore):
    # Low-confidence drafts never land: the believed costs say stop after one. An exploration of width 4 still
    # drafts 3, so the width it chose is what gets measured; a plan that is not exploring stops.
    ctrl = SpeculationController(K, draft_cost_ratio=0.05)
    model_keys = lambda batch: [[("model", i) for i in range(1, K + 1)]] * batch  # noqa: E731
    simulate(ctrl, 100, cheap, lambda b, i: 0.9, batch=2, keys=model_keys)
    plan = ctrl.plan([0, 1], model_keys(2))
    for _ in range(200):
        ctrl.acceptance.observe(("model", 1, "low"), False)
    plan.width, plan.explore = 4, explore
    position_keys = [("model", i) for i in range(1, K + 1)]
    drafted = [("model", 1, "low"), ("model", 2, "low"), ("model", 3, "low")]
    answers = [ctrl.keep_drafting(plan, d, [drafted[:d]] * 2, position_keys) for d in (1, 2, 3)]
    assert answers == ([True, True, False] if explore else [False, False, False])


def test_keep_drafting_follows_what_the_table_learns_between_calls_of_one_step():
    # keep_drafting keeps the step's row factors and position priors between calls: a change of the table
    # must still reach the next call with the same plan
    ctrl = SpeculationController(K, draft_cost_ratio=0.05)
    model_keys = lambda batch: [[("model", i) for i in range(1, K + 1)]] * batch  # noqa: E731
    simulate(ctrl, 100, cheap, lambda b, i: 0.9, batch=2, keys=model_keys)
    plan = ctrl.plan([0, 1], model_keys(2))
    position_keys = [("model", i) for i in range(1, K + 1)]
    drafted = [[("model", 1, "low")]] * 2
    assert ctrl.keep_drafting(plan, 1, drafted, position_keys)  # an unseen bin borrows ("model", 1)'s 0.9
    for _ in range(2000):
        for i in range(2, K + 1):
            ctrl.acceptance.observe(("model", i), False)  # the later positions never land after all
    assert not ctrl.keep_drafting(plan, 1, drafted, position_keys)


def _draft_model_controller(accept):
    """Batch 1, a draft model a tenth of the target's cost whose drafts land with chance `accept`; feeding 99
    columns of catch-up (N = 101) costs more than a plain step (12 ms against 10), and less per token than the
    draft's small forwards (a monotone table caps it there)."""
    ctrl = SpeculationController(K, draft_cost_ratio=0.1)
    ctrl.clock = 10
    for n in range(1, K + 2):
        ctrl.target_costs.observe(n, 0.010 + 0.0005 * (n - 1), ctrl.clock)
    for n in range(1, 8):
        ctrl.draft_costs.observe(n, 0.001 * (1 + 0.05 * (n - 1)), ctrl.clock)
    ctrl.draft_costs.observe(101, 0.012, ctrl.clock)
    for i in range(1, K + 1):
        for j in range(1000):
            ctrl.acceptance.observe(("model", i), j < 1000 * accept)
    return ctrl


@pytest.mark.parametrize("accept,catch_up,speculates", [(0.24, 1, True), (0.38, 99, False), (0.38, 1, True)],
                         ids=["cheap-lag-small-gain", "dear-lag", "cheap-lag"])
def test_the_margin_for_waking_a_draft_model_follows_its_catch_up_cost(accept, catch_up, speculates):
    # A lag of one column (one plain step) costs next to nothing to feed: a 7% predicted gain is taken, where a
    # flat 10% margin kept the demo pair's layer-skip draft plain for dozens of steps after each plain step. A
    # catch-up as dear as a plain step still needs the full margin: 7% (after its amortised cost) is not enough.
    ctrl = _draft_model_controller(accept)
    keys = [[("model", i) for i in range(1, K + 1)]]
    plan = ctrl.plan([0], keys, catch_up=catch_up, horizon=50)
    assert not plan.explore
    assert (plan.width > 1) == speculates, plan
    if speculates:
        gain = plan.predicted_tokens / plan.predicted_seconds * ctrl.target_costs.estimate(1)
        assert gain < 1.1 if accept < 0.3 else gain > 1.1, gain


def _stale_draft_controller(ratio, draft_seconds):
    """Batch 1: plain decoding (10 ms) timed fresh at step 500, wider target forwards and the draft model timed at
    `draft_seconds` a forward 490 steps before (only speculative steps time a draft model), drafts landing 80%."""
    ctrl = SpeculationController(K, draft_cost_ratio=ratio)
    ctrl.clock = 10
    for n in range(1, K + 2):
        ctrl.target_costs.observe(n, 0.010 + 0.0005 * (n - 1), ctrl.clock)
    for n in range(1, 8):
        ctrl.draft_costs.observe(n, draft_seconds, ctrl.clock)
    for i in range(1, K + 1):
        for j in range(1000):
            ctrl.acceptance.observe(("model", i), j % 10 < 8)
    ctrl.clock = 500
    ctrl.target_costs.observe(1, 0.010, ctrl.clock)
    return ctrl


@pytest.mark.parametrize("target_fresh", [False, True], ids=["target-stale", "target-fresh"])
def test_a_draft_model_timed_in_a_slow_spell_is_tried_again(target_fresh):
    # The draft model was timed at 8 ms in a slow spell (it costs 1 ms: a tenth of the target) and the controller
    # went plain. Believed, that cost makes every width lose (3.4 tokens for 42 ms at width 5); hoped down to its
    # parameter share of the target's cost, width 5 would win by far: explored, whether or not the target's wider
    # forwards were timed lately (plain steps of a larger batch time them too).
    keys = [[("model", i) for i in range(1, K + 1)]]
    ctrl = _stale_draft_controller(0.1, 0.008)
    if target_fresh:
        for n in range(2, K + 2):
            ctrl.target_costs.observe(n, 0.010 + 0.0005 * (n - 1), ctrl.clock)
    plan = ctrl.plan([0], keys)
    assert plan.explore and plan.width > 1, plan
    ctrl = _stale_draft_controller(0.1, 0.008)  # the same books with the draft timed just now: plain, no exploring
    for n in range(1, 8):
        ctrl.draft_costs.observe(n, 0.008, ctrl.clock)
    plan = ctrl.plan([0], keys)
    assert plan.plain and not plan.explore, plan


def test_a_stale_draft_as_dear_as_the_target_is_not_hoped_cheaper_than_it():
    # A float16 copy's prior is the target's own cost. Timed at 15 ms long ago, its age alone would hope it down
    # to nothing; the floor (its parameter share of the target's current cost) keeps it unexplored.
    ctrl = _stale_draft_controller(1.0, 0.015)
    widths = []
    for _ in range(50):  # each plain step times plain decoding again, as a decode loop's would
        widths.append(ctrl.plan([0], [[("model", i) for i in range(1, K + 1)]]).width)
        ctrl.target_costs.observe(1, 0.010, ctrl.clock)
    assert set(widths) == {1}, widths


def _draft_timed_only_at_two(ratio):
    """Batch 1, everything fresh: the target at 10 ms + 0.5 ms a column, drafts landing 80%, and the draft model
    timed only at N = 2 (8 ms: a noisy early sample), as after width-2 steps, which run only the first draft
    forward (the last token and one draft)."""
    ctrl = SpeculationController(K, draft_cost_ratio=ratio)
    ctrl.clock = 10
    for n in range(1, K + 2):
        ctrl.target_costs.observe(n, 0.010 + 0.0005 * (n - 1), ctrl.clock)
    ctrl.draft_costs.observe(2, 0.008, ctrl.clock)
    for i in range(1, K + 1):
        for j in range(100):
            ctrl.acceptance.observe(("model", i), j % 10 < 8)
    return ctrl


def test_a_draft_forward_never_timed_at_its_own_n_is_hoped_at_its_prior():
    # Believed, N = 1 costs what N = 2 was timed at (8 ms): plain wins (width 2: 18.5 ms for 1.8 tokens), and
    # hoped at 0.8 of that (ForwardCosts.optimistic) width 5 still does not win by the exploration's 10%, so
    # N = 1 is never timed. Hoped at its prior (a tenth of the target's cost), width 5 would win by far:
    # explored once, and then believed as timed.
    keys = [[("model", i) for i in range(1, K + 1)]]
    ctrl = _draft_timed_only_at_two(0.1)
    plan = ctrl.plan([0], keys)
    assert plan.explore and plan.width > 2, plan
    ctrl = _draft_timed_only_at_two(0.1)
    ctrl.draft_costs.observe(1, 0.008, ctrl.clock)  # timed: it is as dear as it looked
    plan = ctrl.plan([0], keys)
    assert plan.plain and not plan.explore, plan
    ctrl = _draft_timed_only_at_two(1.0)  # a draft as dear as the target: its prior is no hope
    plan = ctrl.plan([0], keys)
    assert plan.plain and not plan.explore, plan


def test_fixed_k_when_disabled():
    ctrl = SpeculationController(K, enabled=False)
    widths = simulate(ctrl, 20, dear, lambda b, i: 0.0)
    assert set(widths) == {K + 1}


def test_costs_interpolate_and_resist_outliers():
    costs = ForwardCosts()
    costs.observe(1, 1.0)
    costs.observe(5, 2.0)
    assert costs.estimate(3) == pytest.approx(1.5)
    assert costs.optimistic(3) == 1.0
    assert costs.estimate(20) == pytest.approx(2.0 * 4)  # linear beyond the largest measured
    costs.observe(1, 1.2)
    costs.observe(1, 1000.0)  # a stall, and a slower sample: the least of the kept samples ignores both
    assert costs.estimate(1) == 1.0
    costs.observe(1, 0.1, step=500)  # re-measured long after: believed at once
    assert costs.estimate(1) == 0.1
    costs.observe(1, 5.0, step=1000)  # dearer, and the cheap sample is past `fresh`: believed at once too
    assert costs.estimate(1) == 5.0


@pytest.mark.parametrize("samples", [(3.0,), (3.0, 1.0), (1.0, 2.0, 3.0), (3.0, 1.0, 2.0), (2.0, 3.0, 1.0),
                                     (1.0, 3.0, 2.0), (2.0, 2.0, 1.0), (1.0, 5.0, 4.0, 3.0, 2.0, 6.0),
                                     (0.5, 4.0, 3.0, 2.0, 6.0, 7.0, 8.0)], ids=lambda v: "-".join(map(str, v)))
def test_a_cost_is_the_least_of_its_last_kept_samples(samples):
    costs = ForwardCosts()
    for step, v in enumerate(samples):
        costs.observe(2, v, step=step)
    assert costs.estimate(2) == min(samples[-KEPT_SAMPLES:])


def test_a_cost_forgets_samples_older_than_fresh():
    costs = ForwardCosts(fresh=10)
    costs.observe(2, 1.0, step=0)
    costs.observe(2, 3.0, step=10)  # the first sample is still within `fresh`
    assert costs.estimate(2) == 1.0
    costs.observe(2, 4.0, step=11)  # now it is not: the least of the fresh ones
    assert costs.estimate(2) == 3.0


def test_acceptance_shrinks_to_parents_and_fades():
    table = AcceptanceTable(decay=0.5)
    assert table.rate(("ngram", 2, 1)) == 0.5  # the root prior; read now so that a stale cached rate would show
    for _ in range(20):
        table.observe(("ngram", 2, 1), True)
    assert table.rate(("ngram", 2, 1)) > 0.9
    assert table.rate(("ngram", 2, 3)) > 0.8  # an unseen position borrows from its n-gram size
    table.now += 30
    assert table.rate(("ngram", 2, 1)) == pytest.approx(0.5, abs=0.01)  # faded back to the root prior


def test_stale_costs_grow_cheaper_with_age_down_to_the_smaller_forward():
    costs = ForwardCosts(fresh=32)
    costs.observe(4, 1.0, step=0)
    costs.observe(1, 0.5, step=40)
    assert costs.optimistic(4, step=10, fresh=32) == pytest.approx(0.8)  # one discount while young
    assert costs.optimistic(4, step=64, fresh=32) == pytest.approx(0.64)  # one per `fresh` steps of age
    costs.observe(1, 0.5, step=200)
    assert costs.optimistic(4, step=200, fresh=32) == 0.5  # never below the smaller forward's fresh cost
    assert costs.optimistic(2, step=200, fresh=32) == 0.5  # never measured: that bound at once


@pytest.mark.parametrize("monotone", [True, False], ids=["monotone", "raw"])
def test_a_fresh_cost_caps_the_smaller_forwards_and_never_raises_a_larger_one(monotone):
    costs = ForwardCosts(monotone=monotone, fresh=10)
    costs.observe(2, 3.0, step=0)  # a slow spell
    costs.observe(6, 2.0, step=1)
    costs.observe(4, 2.5, step=2)
    costs.observe(3, 1.0, step=3)  # fewer tokens cost no more: N = 2 is capped; N = 4 at N = 3's cost per token
    if monotone:
        assert [costs.estimate(n) for n in (2, 3, 4, 6)] == pytest.approx([1.0, 1.0, 4 / 3, 2.0])
    else:
        assert [costs.estimate(n) for n in (2, 3, 4, 6)] == [3.0, 1.0, 2.5, 2.0]
    costs.observe(2, 1.5, step=4)  # re-measured: the least of its own samples (1.5, 3.0), still capped by N = 3
    assert costs.estimate(2) == (1.0 if monotone else 1.5)
    assert costs.estimate(3) == 1.0
    assert costs.age(3, 4) == 1  # a capped cost keeps its own age: it is still explored when stale
    costs.observe(2, 1.4, step=20)  # the caps are 17 steps old and 10 is fresh: they bound nothing now
    assert [costs.estimate(n) for n in (2, 3, 4, 6)] == [1.4, 1.0, 2.5, 2.0]
    costs.observe(6, 0.5, step=21)  # a fresh cheap wide forward caps every narrower one
    assert [costs.estimate(n) for n in (2, 3, 4, 6)] == ([0.5] * 4 if monotone else [1.4, 1.0, 2.5, 0.5])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_monotone_costs_answer_the_suffix_minimum_of_their_own(seed):
    # Between full recomputations a new cost only walks its caps (down by N, up per token): on random samples
    # (every one fresh) the answers must still be, for each N, the least own cost at N or above (own: the least
    # of N's kept samples), and no more per token than that of any smaller N.
    rng = random.Random(seed)
    costs, raw = ForwardCosts(monotone=True, fresh=10 ** 6), {}
    for step in range(400):
        n = rng.choice([1, 2, 3, 4, 5, 8, 10, 15, 40, 120])
        v = rng.uniform(0.5, 2.0) * n ** 0.5
        costs.observe(n, v, step=step)
        raw.setdefault(n, []).append(v)
        own = {m: min(vs[-KEPT_SAMPLES:]) for m, vs in raw.items()}
        suffix = {m: min(c for k, c in own.items() if k >= m) for m in own}
        want = {m: min([suffix[m]] + [suffix[k] / k * m for k in suffix if k < m]) for m in suffix}
        assert {m: costs.estimate(m) for m in own} == pytest.approx(want, rel=1e-12), step


@pytest.mark.parametrize("monotone", [True, False], ids=["monotone", "raw"])
def test_a_width_timed_in_a_slow_spell_is_priced_by_a_fresh_wider_one(monotone):
    # One draft per row (width 2 at most), landing 60% of the time. Width 2 (N = 2) was timed once at 20 ms in a
    # slow spell; N = 3 costs 12 ms now. Width 2 pays at anything below ~14 ms (1.6 tokens against plain's 1 in
    # 10 ms), and a forward over fewer tokens costs no more: it is priced at 12 ms. Without that bound it looked
    # dear, and hoped at 0.76 of its old cost 40 steps on (15 ms) it did not look cheap enough to explore: plain
    # until its age discounted it further (traced on the demo pair at batch 1: 400 steps, width 3 beside it).
    ctrl = SpeculationController(K)  # monotone by default
    if not monotone:
        ctrl.target_costs.monotone = False
    ctrl.observe_target(2, 0.020)
    ctrl.clock = 40
    ctrl.observe_target(1, 0.010)
    ctrl.observe_target(3, 0.012)
    for j in range(200):
        ctrl.acceptance.observe(("ngram", 2, 1), j % 5 < 3)
    plan = ctrl.plan([0], [[("ngram", 2, 1)]])
    assert plan.width == (2 if monotone else 1) and not plan.explore, plan


def _two_verdicts_or_a_hundred(ctrl, thin: bool):
    """Bigram drafts seen landing half the time: on two verdicts (a drafter's first) or on a hundred."""
    for j in range(2 if thin else 100):
        ctrl.acceptance.observe(("ngram", 2, 1), j % 2 == 0)


@pytest.mark.parametrize("thin", [True, False], ids=["two-verdicts", "a-hundred"])
def test_thin_evidence_is_explored_at_its_hope(thin, monkeypatch):
    # Batch 1, every cost fresh: a plain step 10 ms, a second column +5 ms. At the rate seen (1/2) width 2 only
    # ties plain, but on two verdicts the rate may well be 0.72 or more (one posterior sd), where width 2
    # gains 15%: worth one exploration. On a hundred verdicts the same rate is believed, and plain stands.
    ctrl = SpeculationController(K)
    ctrl.clock = 10
    for n in range(1, K + 2):
        ctrl.observe_target(n, 0.010 * (1 + 0.5 * (n - 1)))
    _two_verdicts_or_a_hundred(ctrl, thin)
    keys = ngram_keys(1)
    plan = ctrl.plan([0], keys)
    assert (plan.width, plan.explore) == ((2, True) if thin else (1, False)), plan
    if thin:  # and it is the hope that explores: at the rate itself, nothing would
        import specdec.scheduling.estimates as estimates
        monkeypatch.setattr(estimates, "HOPE_SIGMAS", 0.0)
        ctrl = SpeculationController(K)
        ctrl.clock = 10
        for n in range(1, K + 2):
            ctrl.observe_target(n, 0.010 * (1 + 0.5 * (n - 1)))
        _two_verdicts_or_a_hundred(ctrl, thin)
        plan = ctrl.plan([0], keys)
        assert plan.plain and not plan.explore, plan


@pytest.mark.parametrize("thin", [True, False], ids=["two-verdicts", "a-hundred"])
def test_a_new_drafter_is_hoped_for_in_acceptance_and_stale_costs_at_once(thin):
    # Widths timed 40 steps ago (a second column +9 ms on a 10 ms plain step), plain fresh. Hoped cheaper with
    # age (14.4 ms for width 2) at the rate seen (1/2), width 2 gains 4%; at the rate hoped (0.72) and the cost
    # believed (19 ms), it loses. Neither alone is worth an exploration, both together are (19%): allowed only
    # while the drafter has had fewer than MIN_VERDICTS verdicts. Later it would explore drafts that almost
    # never land on the whole budget (test_drafts_that_almost_never_land_are_not_worth_exploring).
    ctrl = SpeculationController(K)
    for n in range(2, K + 2):
        ctrl.observe_target(n, 0.010 * (1 + 0.9 * (n - 1)))
    ctrl.clock = 40
    ctrl.observe_target(1, 0.010)
    _two_verdicts_or_a_hundred(ctrl, thin)
    plan = ctrl.plan([0], ngram_keys(1))
    assert (plan.width, plan.explore) == ((2, True) if thin else (1, False)), plan


@pytest.mark.parametrize("plain", [True, False], ids=["plain-step", "speculative-step"])
def test_a_prefill_before_a_step_is_not_counted_as_the_steps_forward(plain):
    # Rows are admitted (a prefill, timed for the cost table) between one step's record and the next step's plan;
    # the step's overhead is its time beyond its own forwards. Counting the prefill as one of them left the first
    # step after every admission with no overhead at all: at batch 1, once per prompt.
    ctrl = SpeculationController(K)
    ctrl.clock = 10
    ctrl.observe_target(90, 0.050)  # the prefill
    plan = ctrl.plan([0], [[]] if plain else ngram_keys(1))
    ctrl.observe_target(1 if plain else 3, 0.010)
    keys = [[]] if plain else [[("ngram", 2, 1), ("ngram", 2, 2)]]
    ctrl.record(plan, keys, [0], seconds=0.012)
    overhead = ctrl.plain_overhead if plain else ctrl.spec_overhead
    assert overhead.estimate(1) == pytest.approx(0.002)


@pytest.mark.parametrize("age", [300, 10], ids=["stale", "fresh"])
def test_a_speculative_step_overhead_measured_cold_is_hoped_lower_with_age(age):
    # Drafts land 80% of the time and a column costs 3 ms on a 10 ms plain step: width 3 gains a third if a
    # speculative step costs nothing beyond its forwards. Its overhead was timed at 20 ms, as in a process's
    # first speculative steps (cold paths). Fresh, that is believed and plain stands; 300 steps old, it is hoped
    # lower like a stale forward (x0.8 per 32 steps): 2.5 ms, and width 3 is worth re-measuring.
    ctrl = SpeculationController(K)
    ctrl.spec_overhead.observe(1, 0.020, 0)
    ctrl.clock = age
    for n in range(1, K + 2):
        ctrl.observe_target(n, 0.010 * (1 + 0.3 * (n - 1)))
    for i in range(1, K + 1):
        for j in range(100):
            ctrl.acceptance.observe(("ngram", 2, i), j % 5 != 0)
    plan = ctrl.plan([0], ngram_keys(1))
    assert (plan.width > 1, plan.explore) == ((True, True) if age > ctrl.refresh_steps else (False, False)), plan


@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"B{b}")
def test_drafts_that_almost_never_land_are_not_worth_exploring(batch):
    # 3% acceptance can add at most ~3% tokens to a step, below EXPLORE_GAIN, and plain steps age the evidence
    # slowly: after the warm-up budget the controller hardly re-measures widths for them (it used to spend
    # its whole budget, 20 steps in 600 at batch 1). test_follows_the_script_when_it_changes checks that a
    # real change is still found.
    ctrl = SpeculationController(K)
    simulate(ctrl, 600, lambda n: 0.01 * (1 + 0.3 * (n / batch - 1)), lambda b, i: 0.03, batch=batch, seed=5)
    assert ctrl.stats()["explore_steps"] <= ctrl.warmup_explore + 3, ctrl.stats()


def test_a_plain_cost_measured_in_a_slow_spell_is_measured_again():
    # Batch 2. A plain step was measured in a slow spell (16 ms; it really costs 10). Width 2 (13 ms for 2.6
    # tokens: drafts landing 30% of the time) beats that stale cost, not the real one. A forward over 1 token is
    # measured fresh every step (9.8 ms: as a batch's last row or a draft would), so the stale plain cost never
    # looks optimistically cheap enough to explore (2 tokens / 9.8 ms is not 10% above width 2). Nothing but a
    # plain step measures a plain step: without re-measuring it when it is old, width 2 would run for good.
    ctrl = SpeculationController(K)
    ctrl.clock = 10
    ctrl.target_costs.observe(2, 0.016, ctrl.clock)
    for n in (4, 6, 8, 10):  # every width: 13 ms per 4 query tokens
        ctrl.target_costs.observe(n, 0.013 * n / 4, ctrl.clock)
    for i in range(1, K + 1):
        for j in range(200):
            ctrl.acceptance.observe(("ngram", 2, i), j % 10 < 3)
    cost = {1: 0.0098, 2: 0.010}
    rng = random.Random(0)
    widths = []
    for step in range(400):
        ctrl.observe_target(1, cost[1])
        keys = ngram_keys(2)
        plan = ctrl.plan([0, 1], keys)
        ctrl.observe_target(2 * plan.width, cost.get(2 * plan.width, 0.013 * plan.width / 2))
        accepted = []
        for b in range(2):
            a = 0
            while a < plan.num_draft[b] and rng.random() < 0.3:
                a += 1
            accepted.append(a)
        ctrl.record(plan, [keys[b][:plan.num_draft[b]] for b in range(2)], accepted)
        widths.append(plan.width)
    assert widths[0] == 2  # speculating against the stale plain cost
    # plain is measured again once its cost is refresh_steps old, and wins (the stale optimism alone took 233)
    assert widths.index(1) <= ctrl.refresh_steps + 2 and widths[-100:].count(1) >= 90, widths


def _plain_by_a_wide_margin(batch=4):
    """A controller whose books say speculation with unigram drafts loses by far: they land 5% of the time and a
    second column costs 40% more; 4-gram drafts land 97% of the time, and one row of them would pay at batch 4."""
    ctrl = SpeculationController(K)
    for i in range(1, K + 1):
        for j in range(200):
            ctrl.acceptance.observe(("ngram", 1, i), j % 20 == 0)
            ctrl.acceptance.observe(("ngram", 4, i), j % 40 != 0)
    ctrl.clock = 10
    for n in range(1, batch * (K + 1) + 1):  # every width measured (fresh for 32 steps): nothing to explore
        ctrl.observe_target(n, 0.01 if n <= batch else 0.014 + 0.00025 * (n - 2 * batch))
    return ctrl


def _count_pricing(ctrl):
    """A list that grows whenever a plan prices drafts (looks up their acceptance rates)."""
    calls = []
    priced = ctrl.acceptance.rate
    ctrl.acceptance.rate = lambda *a, **k: calls.append(1) or priced(*a, **k)
    return calls


@pytest.mark.parametrize("batch", [1, 4, 8], ids=lambda b: f"B{b}")
def test_a_plain_step_won_by_a_wide_margin_stands_a_few_steps_without_pricing(batch):
    ctrl = _plain_by_a_wide_margin(batch)
    calls = _count_pricing(ctrl)
    weak = ngram_keys(batch, n=1)
    widths, priced = [], []
    for _ in range(3 * REST_STEPS):
        before = len(calls)
        widths.append(ctrl.plan(list(range(batch)), weak).width)
        priced.append(len(calls) > before)
        ctrl.observe_target(batch, 0.01)
    assert set(widths) == {1}
    # one full plan every REST_STEPS steps, the rest stand
    assert priced == ([True] + [False] * (REST_STEPS - 1)) * 3, priced


@pytest.mark.parametrize("change", ["stronger offer", "longer offer", "other rows"])
def test_a_rest_ends_at_once_when_the_offer_or_the_rows_change(change):
    batch = 4
    ctrl = _plain_by_a_wide_margin(batch)
    short = [[("ngram", 1, 1)] for _ in range(batch)]
    assert ctrl.plan(list(range(batch)), short).width == 1
    assert ctrl._rest is not None
    calls = _count_pricing(ctrl)
    rows, keys = list(range(batch)), short
    if change == "stronger offer":  # one row finds a 4-gram match, which lands: speculate now, not in 3 steps
        keys = short[:-1] + [ngram_keys(1, n=4)[0]]
    elif change == "longer offer":
        keys = short[:-1] + [ngram_keys(1, n=1)[0]]
    else:
        rows = [0, 1, 2, 9]
    plan = ctrl.plan(rows, keys)
    assert calls, "the step was not priced"
    if change == "stronger offer":
        assert plan.width > 1 and plan.num_draft[-1] > 0


def test_a_rest_ends_where_a_priced_width_turns_stale():
    # width 2's cost was measured 28 steps before the rest began: it turns stale (refresh_steps = 32) 5 steps
    # later, in the middle of what would be a rest, and the plan there is priced (an exploration may be due)
    batch = 4
    ctrl = _plain_by_a_wide_margin(batch)
    ctrl.target_costs.last_seen[2 * batch] = ctrl.clock - 28
    stale_at = ctrl.clock - 28 + ctrl.refresh_steps + 1
    assert stale_at < ctrl.clock + REST_STEPS
    calls = _count_pricing(ctrl)
    weak = ngram_keys(batch, n=1)
    priced = {}
    for _ in range(REST_STEPS + 2):
        clock, before = ctrl.clock, len(calls)
        assert ctrl.plan(list(range(batch)), weak).width == 1
        priced[clock] = len(calls) > before
        ctrl.observe_target(batch, 0.01)
    assert [c for c, p in priced.items() if p] == [10, stale_at], priced


def _plain_whatever_is_offered(batch=4):
    """Books on which no offer of the kinds seen could pay: every key seen lands at most 6% of the time."""
    ctrl = SpeculationController(K)
    for n in (1, 2, 4):
        for i in range(1, K + 1):
            for j in range(200):
                ctrl.acceptance.observe(("ngram", n, i), j % 20 == 0 or (n == 4 and j % 100 == 1))
    ctrl.clock = 10
    for n in range(1, batch * (K + 1) + 1):
        ctrl.observe_target(n, 0.01 if n <= batch else 0.014 + 0.00025 * (n - 2 * batch))
    return ctrl


def _count_full_plans(ctrl):
    """A list that grows whenever a plan is worked out in full (a rest returns before pricing overheads)."""
    calls = []
    overhead = ctrl._overhead
    ctrl._overhead = lambda *a, **k: calls.append(1) or overhead(*a, **k)
    return calls


def test_a_rest_stands_for_new_offers_that_could_not_pay():
    # n-gram offers change every step (new matches, other lengths). Where every row offering K drafts at the
    # table's rates could not pay, they do not end the rest; a draft seen accepted does (a row's factor may
    # have risen), and so does a key of a kind the table has never seen (it rates as the root prior, 0.5).
    batch = 4
    ctrl = _plain_whatever_is_offered(batch)
    rows = list(range(batch))
    assert ctrl.plan(rows, ngram_keys(batch, n=1)).width == 1
    assert ctrl._rest is not None and ctrl._rest[3] is not None
    full = _count_full_plans(ctrl)
    for n in (2, 4, 1):
        assert ctrl.plan(rows, [[], *ngram_keys(batch - 1, n=n)]).width == 1
    assert not full, "a new offer within the limits ended the rest"
    ctrl.judge([(0, [("ngram", 1, 1)], 0)])  # a miss: the rest stands
    ctrl.plan(rows, ngram_keys(batch, n=3))
    assert not full
    ctrl.judge([(0, [("ngram", 1, 1)], 1)])  # a hit
    ctrl.plan(rows, ngram_keys(batch, n=3))
    assert full, "a draft seen accepted did not end the rest"
    full.clear()
    assert ctrl._rest is not None
    ctrl.plan(rows, [[("other", 1, 1)]] * batch)
    assert full, "a key of an unseen kind did not end the rest"


def test_a_rest_counts_what_every_new_offer_adds_against_the_slack_plain_won_by():
    # 3-gram drafts land half the time: one row offering them adds less than the slack plain won by at batch 4
    # (0.45 expected tokens at width 2 against 0.7); two rows add more, and the step is priced again
    batch = 4
    ctrl = _plain_whatever_is_offered(batch)
    for j in range(40):
        for i in range(1, K + 1):
            ctrl.acceptance.observe(("ngram", 3, i), j % 2 == 0)
    rows, weak, half = list(range(batch)), ngram_keys(batch, n=1), ngram_keys(batch, n=3)
    assert ctrl.plan(rows, weak).width == 1 and ctrl._rest[3] is not None
    full = _count_full_plans(ctrl)
    ctrl.plan(rows, [half[0], *weak[1:]])
    assert not full, "one row's new offer within the slack ended the rest"
    ctrl.plan(rows, [half[0], half[1], *weak[2:]])
    assert full, "two rows' new offers beyond the slack did not end the rest"


def test_a_draft_model_rest_covers_only_what_was_priced():
    # a draft model's position keys are the same every step; its rest has no limits (they would not count the
    # draft forwards' cost), so another key list ends it
    batch = 2
    ctrl = SpeculationController(K, draft_cost_ratio=0.3)
    positions = [[("model", i) for i in range(1, K + 1)]] * batch
    for i in range(1, K + 1):
        for j in range(200):
            ctrl.acceptance.observe(("model", i), j % 20 == 0)
    ctrl.clock = 10
    for n in range(1, batch * (K + 2) + 1):
        ctrl.observe_target(n, 0.01 if n <= batch else 0.02)
        ctrl.observe_draft(n, 0.005)
    rows = list(range(batch))
    assert ctrl.plan(rows, positions).width == 1
    assert ctrl._rest is not None and ctrl._rest[3] is None
    full = _count_full_plans(ctrl)
    ctrl.plan(rows, positions)
    assert not full
    ctrl.plan(rows, [[("model", 9)]] * batch)
    assert full


def test_a_rest_covers_rows_offering_less_than_was_priced():
    batch = 4
    ctrl = _plain_by_a_wide_margin(batch)
    weak = ngram_keys(batch, n=1)
    ctrl.plan(list(range(batch)), weak)
    calls = _count_pricing(ctrl)
    less = [[], weak[1][:2], weak[2], []]
    assert ctrl.plan(list(range(batch)), less).width == 1 and not calls


@pytest.mark.parametrize("hindsight", [True, False], ids=["hindsight", "blind"])
def test_hindsight_ends_a_plain_spell_as_soon_as_drafts_land(hindsight):
    # 300 steps where speculation cannot pay set a plain spell; then drafts always land and verification is
    # cheap. Judging the unverified offers sees that within a few steps (then widens as the stale costs of wide
    # forwards are re-measured); without it, the acceptance table learns nothing in a plain spell and only its
    # slow fade (AcceptanceTable) brings an exploration, 100+ steps later.
    ctrl = SpeculationController(K)
    state = {"cost": dear, "p": 0.05}
    widths = simulate(ctrl, 300, lambda n: state["cost"](n), lambda b, i: state["p"], seed=1,
                      hindsight=hindsight)
    assert widths[-100:].count(1) >= 95
    state.update(cost=cheap, p=1.0)
    widths = simulate(ctrl, 40, lambda n: state["cost"](n), lambda b, i: state["p"], seed=2,
                      hindsight=hindsight)
    if hindsight:
        assert next(i for i, w in enumerate(widths) if w > 1) <= 10 and widths[10:].count(1) <= 2, widths
    else:
        assert widths.count(1) == len(widths), widths


def test_hindsight_keeps_drafts_that_never_land_from_being_explored():
    # Drafts that never land, verification dear: a blind controller's table fades towards its prior in a
    # plain spell and spends exploration steps re-trying them; judged offers keep it informed (no exploration
    # after the warm-up).
    explored = {}
    for hindsight in (True, False):
        ctrl = SpeculationController(K)
        simulate(ctrl, 1500, dear, lambda b, i: 0.0, batch=1, seed=5, hindsight=hindsight)
        explored[hindsight] = ctrl.stats()["explore_steps"]
    assert explored[True] <= SpeculationController(K).warmup_explore < explored[False], explored


def test_judged_drafts_teach_the_table_and_the_row_factor():
    ctrl = SpeculationController(K)
    key1, key2 = ("ngram", 3, 1), ("ngram", 3, 2)
    before = ctrl.acceptance.rate(key1)
    ctrl.judge([(7, [key1, key2], 2), (7, [key1], 1), (8, [key1], 0)])
    assert ctrl.acceptance.counts[key1][:2] == [2.0, 3.0] and ctrl.acceptance.counts[key2][:2] == [1.0, 1.0]
    assert ctrl.acceptance.rate(key1) != before
    assert ctrl.rows[7].accepted == 3 and ctrl.rows[8].accepted == 0
    assert ctrl.stats()["judged_drafts"] == 4
    fixed = SpeculationController(K, enabled=False)
    fixed.judge([(7, [key1], 1)])
    assert not fixed.acceptance.counts and fixed.stats()["judged_drafts"] == 0


@pytest.mark.parametrize("p", [-1.0, -0.0, 0.0, 0.3, 0.995, 0.9951, 2.0, math.inf, -math.inf, math.nan],
                         ids=lambda p: f"p={p}")
def test_draft_probabilities_are_clamped_as_min_max_would(p):
    # plan's inlined clamp must keep every decision what min(0.995, max(0.0, p)) made it, NaN included
    assert _clamp(p) == min(0.995, max(0.0, p))


@pytest.mark.parametrize("first_columns,speculates", [(1, True), (2, False)], ids=["early-exit", "own-lane"])
def test_a_drafts_first_forward_is_priced_at_its_own_width(first_columns, speculates):
    # A draft model with a lane of its own starts a step with two columns per row (prev and last); the target's
    # early exit with one (the target's lane holds the rest). Batch 1, drafts landing 80% at position 1 and never
    # after: width 2 gives 1.8 tokens. Its first draft forward costs 1 ms over one column, 2 ms over two (as dear
    # per token: a small-M product), so width 2 (15.6 ms of target, plain 10 ms) pays for the early exit (1.8
    # tokens in 16.6 ms) and not for the own lane (in 17.6 ms: short of plain's rate plus its 5% margin).
    ctrl = SpeculationController(K, draft_cost_ratio=0.1, draft_first_columns=first_columns)
    ctrl.clock = 10
    for n in range(1, K + 2):
        ctrl.target_costs.observe(n, 0.010 + 0.0056 * (n - 1), ctrl.clock)
    ctrl.draft_costs.observe(1, 0.001, ctrl.clock)
    ctrl.draft_costs.observe(2, 0.002, ctrl.clock)
    for j in range(1000):
        ctrl.acceptance.observe(("model", 1), j % 10 < 8)
        for i in range(2, K + 1):
            ctrl.acceptance.observe(("model", i), False)
    plan = ctrl.plan([0], [[("model", i) for i in range(1, K + 1)]])
    assert not plan.explore
    assert plan.width == (2 if speculates else 1), plan


@pytest.mark.parametrize("value", [0, 3, 1.0, None])
def test_draft_first_columns_is_checked(value):
    with pytest.raises(ValueError, match="draft_first_columns must be 1 or 2"):
        SpeculationController(K, draft_first_columns=value)



def test_keep_drafting_extends_only_the_drafts_it_has_seen():
    # keep_drafting extends the last call's chance that a row's drafts land by the one new draft; a call whose
    # earlier drafts differ from the last call's (another proposal) must start again from its own keys, and every
    # call must answer what a controller seeing only that call answers.
    def taught():
        ctrl = SpeculationController(K, draft_cost_ratio=0.05)
        model_keys = lambda batch: [[("model", i) for i in range(1, K + 1)]] * batch  # noqa: E731
        simulate(ctrl, 100, cheap, lambda b, i: 0.9, batch=1, keys=model_keys)
        for _ in range(500):
            ctrl.acceptance.observe(("model", 1, "hi"), True)
            ctrl.acceptance.observe(("model", 1, "lo"), False)
        return ctrl, ctrl.plan([0], model_keys(1))

    position_keys = [("model", i) for i in range(1, K + 1)]
    calls = [(1, [("model", 1, "hi")]), (2, [("model", 1, "lo"), ("model", 2)]),
             (3, [("model", 1, "lo"), ("model", 2), ("model", 3)]), (1, [("model", 1, "hi")]),
             (2, [("model", 1, "hi"), ("model", 2)])]
    ctrl, plan = taught()
    answers = []
    for drafted, keys in calls:
        answers.append(ctrl.keep_drafting(plan, drafted, [keys], position_keys))
        alone, alone_plan = taught()
        assert answers[-1] == alone.keep_drafting(alone_plan, drafted, [keys], position_keys), (drafted, keys)
    assert answers == [True, False, False, True, True], answers


def test_a_catch_up_timed_in_a_slow_spell_is_priced_per_token_by_a_smaller_one():
    # Traced on the demo pair's layer-skip draft at batch 4: a catch-up over 401 tokens timed once at 49.5 ms,
    # beside 24.4 ms over 359, was believed for every later batch (catch-ups that size are rare, so it was never
    # re-measured). A forward over more tokens costs no more per token: 401 is capped at 359's rate, and the
    # extrapolation beyond it follows the capped cost.
    costs = ForwardCosts(monotone=True, fresh=32)
    costs.observe(359, 0.0244, step=0)
    costs.observe(401, 0.0495, step=1)
    assert costs.estimate(401) == pytest.approx(0.0244 / 359 * 401)
    assert costs.estimate(802) == pytest.approx(0.0244 / 359 * 802)
    costs.observe(8, 0.0025, step=2)  # a draft forward, dearer per token (0.31 ms against 0.068): caps nothing
    assert costs.estimate(401) == pytest.approx(0.0244 / 359 * 401)
    costs.observe(401, 0.0260, step=40)  # re-measured long after, the smaller ones stale: its own cost again
    assert costs.estimate(401) == pytest.approx(0.0260)
