"""When a plain step stands: a plain plan chosen by a wide margin is kept for a few steps of the same rows and
offers without being priced again (REST_GAP), and a long plain spell of a drafter without a draft model goes
dormant (DORMANT_AFTER): whole steps run as plain decoding with no offer and no plan. A mixin of
SpeculationController: it reads the controller's tables and clock; plan begins a rest (_rest_after) and asks
whether one stands (_resting), _finish counts plain plans towards dormancy (_note_plain), and the decode loop
asks `dormant` before it asks the drafter for anything."""

from __future__ import annotations

import math

from .margins import EXPLORE_GAIN, MIN_SECONDS, PLAIN_FADE, SPECULATE_MARGIN

# A plain step chosen by a wide margin (plain's rate at least REST_GAP above the best speculative width's, and
# REST_EXPLORE_GAP above what any exploration could hope for) stands for up to REST_STEPS - 1 steps of the same
# rows (fewer where a cost turns stale or the exploration budget refills), unless a row offers drafts the plan
# did not price (an n-gram drafter's: that add more than the plain step's slack, _rest_after).
# Planning costs about 100 us in situ (cold caches after a forward): 1% of a step on the demo pair. Within a
# few steps of a wide margin nothing it learns (the plain cost, a slow fade of the acceptance table) can close
# the gap, so the saving costs at most a few steps' delay.
REST_GAP = 0.2
REST_STEPS = 8
# The gap a rest needs over an exploration, which delayed by a rest costs only the delay of what it would
# measure. On the demo pair's layer-skip draft in a plain spell at batch 4, the hoped-for exploration sat 5-6%
# short of its trigger for hundreds of steps (pinned there by the floors of its hoped costs), and under a gap of
# REST_GAP each of those steps was priced in full: 110 us, 1% of a step.
REST_EXPLORE_GAP = 0.03


# Dormancy. Where an n-gram drafter cannot pay (the demo pair's byte-level text, every cell all plain), a priced
# or resting plain step still costs its offer (a lookup per row), a plan, a timed forward and a record: 1.5-2% of
# a plain step there (75 us a step at batch 1, 150 at batch 4, in situ), which alone put those cells under
# 0.97x plain. After DORMANT_AFTER plain plans in a row, none of them an exploration, the steps between two
# plans run as plain decoding with none of that (the drafter still reads the tokens, so its index and its
# hindsight stay whole): 1 step, then 2, 4, up to DORMANT_MAX between two plans of the same rows, each plan a
# full step (its offers priced, its forward timed). Any other plan ends it; other rows (a prompt admitted, one
# retired) start again at one step, so a new prompt's offers are priced on its first step and soon after.
# What it costs: a row whose text starts to repeat is priced up to DORMANT_MAX steps late. A draft model is
# never dormant: its plain steps cost a lag to price (and an early exit reads its hindsight off them).
DORMANT_AFTER = 16
DORMANT_MAX = 8


class PlainRest:
    """The rest and dormancy rules of SpeculationController (see REST_GAP, DORMANT_AFTER)."""

    def dormant(self, rows) -> bool:
        """Whether this step of these rows runs as plain decoding without a plan (see DORMANT_AFTER). If it
        does, the step is booked here as the plain step it is (the controller's clock, budget and stats), and
        the caller neither offers, plans, times nor records it."""
        if not self._dormant_left:
            return False
        if list(rows) != self._dormant_rows:  # new rows' offers are priced (and _note_plain restarts the doubling)
            self._dormant_left = 0
            return False
        self._dormant_left -= 1
        batch = len(rows)
        self.steps += 1
        self.clock += 1
        self.plain_steps += 1
        self.dormant_steps += 1
        self.width_hist[1] += 1
        self.predicted_tokens += batch
        self.realised_tokens += batch
        self.acceptance.tick(PLAIN_FADE)
        return True

    def _note_plain(self, plan, rows) -> None:
        """Count a plan towards dormancy (DORMANT_AFTER): plain plans in a row, none exploring, for a drafter
        without a draft model; from the DORMANT_AFTER-th on, each grants a doubling run of dormant steps to
        the same rows (other rows start again at one)."""
        if plan.width != 1 or plan.explore or self.draft_costs is not None or not self.enabled:
            self._plain_run = self._dormant_skip = self._dormant_left = 0
            return
        if rows != self._dormant_rows:  # rows: the plan's own list
            self._dormant_rows, self._dormant_skip = rows, 0
        self._plain_run += 1
        if self._plain_run >= DORMANT_AFTER:
            self._dormant_skip = self._dormant_left = min(DORMANT_MAX, 2 * self._dormant_skip or 1)

    def _rest_after(self, plain_rate, best_spec, best_opt, rows, keys, probs, values, top, may_explore, worth):
        """The rest that a plain step chosen by a wide margin begins (see REST_GAP), or None: (the clock it ends
        at, its rows, the offers priced, the slack (None: none) and what a new offer is measured by, the
        acceptance table's count of accepted drafts).

        It ends after REST_STEPS, or sooner where a fresh cost of a priced width turns stale or the exploration
        budget refills, since either may make an exploration due. A drafter without a draft model (n-gram)
        offers other keys every step, and each would end a rest: there the rest also stands while what new
        offers add to the expected value of each width fits in the slack the plain step won by (_rest_slack),
        until a draft is seen accepted (a row factor may have risen)."""
        if best_spec is not None and plain_rate < best_spec[0] * (1 + REST_GAP):
            return None
        if best_opt is not None and plain_rate < best_opt[0] / (1 + EXPLORE_GAIN) * (1 + REST_EXPLORE_GAP):
            return None
        batch = len(rows)
        slack = None if self.draft_costs is not None else self._rest_slack(rows, probs, values, top, plain_rate,
                                                                             worth, may_explore)
        until = self._rest_until(batch, range(2, (self.k if slack else top) + 2), may_explore,
                                 self.clock + REST_STEPS)
        # the offers as passed (no caller mutates them; _resting recognises a shared list by identity)
        return until, list(rows), [k if len(k) <= self.k else k[:self.k] for k in keys], slack, self.acceptance.accepted

    def _rest_until(self, batch: int, widths, may_explore: bool, until: int) -> int:
        """The clock a rest ends at, at most `until`: sooner where a fresh cost of one of these widths
        (or the draft's at N = batch, plan's draft_stale) turns stale, or the exploration budget refills, since
        either can make an exploration due."""
        clock, refresh = self.clock, self.refresh_steps
        seen = self.target_costs.last_seen
        stamps = [seen.get(batch * w) for w in widths]
        if self.draft_costs is not None:
            stamps.append(self.draft_costs.last_seen.get(batch))
        for s in stamps:
            if s is not None and clock - s <= refresh:
                until = min(until, s + refresh + 1)
        if not may_explore and self.explore_share > 0:  # the first step whose plan may explore again
            due = (self.explore_spent + 1 - self.warmup_explore) / self.explore_share - self.steps
            until = min(until, clock + max(1, math.ceil(due)))
        return until

    def _rest_slack(self, rows, probs, values, top, plain_rate, worth, may_explore):
        """(per draft count c = 1..K, how much more expected value (tokens, weighed by worth) a plan could see
        and still rest at width c + 1; per row its factor, worth and expected tokens by draft count as priced),
        or None where no width has slack. Margins as in plan: a speculative width must beat plain by
        SPECULATE_MARGIN and the rest's REST_GAP, an exploration its hoped cost by EXPLORE_GAIN and
        REST_EXPLORE_GAP. For a drafter without a draft model: the forwards are the target's alone."""
        batch, k, clock, refresh, costs = len(rows), self.k, self.clock, self.refresh_steps, self.target_costs
        overhead = self._overhead(batch, True)
        slack = []
        for width in range(2, k + 2):
            n = batch * width
            cap = (self._target_estimate(n) + overhead) * (1 + SPECULATE_MARGIN) / (1 + REST_GAP)
            if may_explore and self._stale(costs, n):
                opt = (costs.optimistic(n, clock, refresh) or MIN_SECONDS) + overhead
                cap = min(cap, opt * (1 + EXPLORE_GAIN) / (1 + REST_EXPLORE_GAP))
            room = cap * plain_rate - values[min(width - 1, top)]
            if room <= 0:
                return None
            slack.append(room)
        worth = [1.0] * batch if worth is None else worth
        return slack, [self._row_factor(r) for r in rows], worth, [self._cumulative(p) for p in probs]

    def _resting(self, rows, keys) -> bool:
        """Whether the plain step that began a rest still stands for these rows and offers (see _rest_after): the
        same rows, every row offering a prefix of what was priced (a draft model offers the same position keys
        every step; an n-gram row without a match offers nothing), or offers adding no more than the slack."""
        until, rested, priced, slack, accepted = self._rest
        if self.clock >= until or len(rows) != len(rested) or list(rows) != rested:
            self._rest = None
            return False
        extra = None
        for b, (k, p) in enumerate(zip(keys, priced)):
            n = min(len(k), self.k)
            if n and k is not p and (n > len(p) or list(k[:n]) != p[:n]):  # shared key lists: the same offer
                if slack is None or self.acceptance.accepted != accepted:
                    self._rest = None
                    return False
                room, factors, worth, gains = slack
                if extra is None:
                    extra = [0.0] * self.k
                now = self._cumulative(self.probs(None, k[:n], factors[b]))
                old, v = gains[b], worth[b]
                for c in range(1, self.k + 1):
                    more = now[min(c, n)] - old[min(c, len(old) - 1)]
                    if more > 0:
                        extra[c - 1] += v * more
                        if extra[c - 1] > room[c - 1]:
                            self._rest = None
                            return False
        return True
