"""How much to speculate: before each step, the verify width and each row's draft count that maximise the step's
expected new tokens per second, from online estimates of acceptance (per row and per draft feature) and of
forward costs (timed on the machine itself).

Why it is safe. The choice of widths uses only what is known before the target verifies the step: past outcomes,
the timings of past forwards, and the drafter's own proposal (an n-gram match's length, a draft model's own
probabilities for its drafts). Verification and sampling do not look at how the width was chosen, and any
width is exact: greedy output is the target's argmax chain whatever is drafted, and rejection sampling is
lossless for any draft count fixed before the target's verdict. A controller that peeked at the verdict (drafting
more where the target agrees) would bias sampling; this one cannot, by construction: `plan` and `keep_drafting`
run before the verify forward, and `record` only updates tables used by later steps.

The model, in a few lines:
    p[b, i]   = P(draft i of row b accepted | drafts 1..i-1 accepted)
              = row_factor[b] * rate(feature of draft i), a Beta posterior mean, shrunk along
                (feature, position) -> feature -> drafter -> 0.5 so that sparse keys borrow from their parents
    E_b(k)    = 1 + sum_{i<=k} prod_{j<=i} p[b, j]      expected tokens row b emits with k drafts
    cost(w)   = target(B * w) + draft forwards           seconds, learned per query-token count N = rows * columns
    choose w  = argmax sum_b v_b E_b(min(n_b, w - 1)) / cost(w);  w = 1 is a plain decoding step.
with v_b what one token of row b is worth in seconds of plain decoding (the code counts it in units of c(B) / B,
an average token, so v_b = 1 means tokens per second): c(B) / B for every row while other
prompts wait for room (a row that finishes sooner makes room for one: every token counts alike), where c(n) is a
plain step's cost with n rows. Once nothing waits (the batch drains), the run ends when its longest row does: a
plain step costs about alpha + beta * B, so a token of a row that is ahead of the longest only saves beta (the
cost of carrying that row one step), and a token of a longest row also advances the end of the run, worth
alpha shared among the rows tied for longest. With every row tied this is c(B) / B per row again; it differs
once rows are ragged, where "tokens per second" would count tokens that finish nothing sooner. (On the demo
pair at batch 8, alpha is 5 ms and beta 0.3 ms: tokens of rows ahead are worth a third of an average token.)
Costs are indexed by N because on both this CPU (BLAS blocking at small M) and a GPU (tiles) a forward over B rows
of w columns costs what one over B*w rows of 1 column does; measured: B=1,w=4 and B=4,w=1 both 93 ms for
SmolLM2-135M here. So plain steps at batch 8 also teach the cost of width 2 at batch 4.

Exploration: a width whose cost was never measured (or not for `refresh_steps` steps) is tried when even an
optimistic cost (no dearer than the largest measured smaller N) would beat the best known choice by
EXPLORE_GAIN, within a budget of `warmup_explore` steps plus `explore_share` of all steps; so is a width whose
drafts would win by as much if they landed as often as their evidence allows (AcceptanceTable.hope: one
posterior sd above the rate), during a drafter's first MIN_VERDICTS verdicts. While speculating,
a plain step is taken once its cost is `refresh_steps` old, within the same budget. A plain step chosen by a
wide margin stands for a few steps of the same rows and offers without being priced again (REST_GAP).
A deterministic drafter's offers that were not verified (plain steps, rows given fewer drafts) are judged by
the tokens that followed them and teach the acceptance table too (`judge`): a plain spell then ends as soon as
the text starts to repeat, without exploration steps to find out.
Draft-model costs start from a prior (a ratio of the target's cost from parameter counts); a stale one is hoped
no lower than that prior (`_draft_optimistic`): a draft as dear as the target can never pay (k drafts + a verify
cost more than k + 1 plain steps), so the controller goes plain at once and stays there.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Hashable, Sequence

from .early_stop import EarlyStop
from .estimates import AcceptanceTable, ForwardCosts
from .margins import (EXPLORE_GAIN, MIN_SECONDS, MIN_VERDICTS, PAYBACK_STEPS, PLAIN_FADE, PLAIN_FIRST,
                      SPECULATE_MARGIN, SWITCH_MARGIN)
from .plan import Plan
from .rest import PlainRest

NO_OFFER = ([], [1.0], (), 1.0)  # plan's (p, gains, keys, factor) of a row that offers no drafts: its one token


def _clamp(p: float) -> float:
    """min(0.995, max(0.0, p)) (NaN included: 0.0) without two builtin calls (plan runs it per row and draft)."""
    return p if 0.0 <= p <= 0.995 else (0.995 if p > 0.995 else 0.0)


@dataclass
class RowRecord:
    """How a sequence's drafts fared against what the tables predicted for them: its row factor."""
    accepted: float = 0.0
    expected: float = 0.0


class SpeculationController(PlainRest, EarlyStop):
    """Chooses verify widths and draft counts step by step; see the module docstring for the model.

    Args:
        max_draft: K, the most drafts per row in one step.
        draft_cost_ratio: for a draft model, the prior ratio of its forward cost to the target's at the same N
            (replaced by measurements once it runs); None for a drafter whose proposals cost nothing (n-gram).
        explore_share, warmup_explore: the exploration budget: at most warmup_explore + explore_share * steps
            steps of a generate call are spent measuring costs the controller has not seen. Six warm-up steps,
            not three: a drafter's first verdicts decide whether it is tried again soon, and with three the demo
            pair's early exit (position 1 lands ~80%) met two misses in three often enough to sit plain for most
            of a call (bench/controller_ab.py, english, 10 repeats: 1.215x against 1.144x at batch 1, 1.127x
            against 1.076x at batch 4; fixed K 1.267x and 1.121x). Drafts landing 3% of the time still stay
            within warmup_explore + 3 explorations in 600 steps (tests/test_control.py).
        refresh_steps: a cost not measured for this many steps may be re-measured (contexts grow, costs drift).
        enabled: False gives fixed K (every row drafts all it can, width K + 1): the ablation's baseline.
        draft_first_columns: the columns per row a draft model's first forward of a step takes besides any
            catch-up: 2 for a draft model with a lane of its own (ModelDrafter: prev and last), 1 for the
            target's early exit (EarlyExitDrafter: last only; the target's lane holds the rest).
    """

    def __init__(self, max_draft: int, *, draft_cost_ratio: float | None = None, explore_share: float = 0.03,
                 warmup_explore: int = 6, refresh_steps: int = 32, enabled: bool = True,
                 row_strength: float = 4.0, draft_first_columns: int = 2):
        if isinstance(draft_first_columns, bool) or draft_first_columns not in (1, 2) \
                or not isinstance(draft_first_columns, int):
            raise ValueError(f"draft_first_columns must be 1 or 2, got {draft_first_columns!r}")
        self.k = int(max_draft)
        self.first_columns = draft_first_columns
        self.enabled = enabled
        self.explore_share = explore_share
        self.warmup_explore = warmup_explore
        self.refresh_steps = refresh_steps
        self.row_strength = row_strength
        self.target_costs = ForwardCosts(fresh=refresh_steps, monotone=True)  # the target's decode steps
        # The target's prefills (observe_prefill) in a table of their own. A prefill's rows are fresh prompts with
        # no past, so it costs less per token than a step of the same N: on SmolLM2 at batch 4, a one-row
        # prefill over 44 tokens took 201 ms and a step over 4 x 5 = 20 tokens 300-340 ms. In one table, a
        # fresh prefill capped every smaller N (monotone), so width 5 was priced at 220 ms and chosen in 27-32
        # steps of a call whose width-5 forwards took 307-389 ms: 0.92x plain. They still price what no step
        # has measured, past the largest N a step has (_target_estimate): a draft model's catch-up.
        self.prefill_costs = ForwardCosts(fresh=refresh_steps, monotone=True)
        # What a step costs beyond its forwards (sampling, realignment, drafting's host work, bookkeeping), by
        # batch size, for plain and speculative steps apart: on a small model it is a fifth of a step.
        self.plain_overhead = ForwardCosts(fresh=refresh_steps)
        self.spec_overhead = ForwardCosts(fresh=refresh_steps)
        self._forward_seconds = 0.0  # forwards timed in the step under way
        self.draft_costs: ForwardCosts | None = None
        self.draft_ratio = None if draft_cost_ratio is None else float(draft_cost_ratio)
        if self.draft_ratio is not None:
            self.draft_costs = ForwardCosts(prior=lambda n: self._target_estimate(n) * self.draft_ratio,
                                            fresh=refresh_steps, monotone=True)
        self.acceptance = AcceptanceTable()
        self.rows: dict[Hashable, RowRecord] = {}
        self.steps = 0
        self.clock = 0
        self.explored = 0
        self.explore_spent = 0.0  # plain-step equivalents spent exploring
        self.plain_steps = 0
        self.width_hist = [0] * (self.k + 2)
        self.predicted_tokens = 0.0
        self.realised_tokens = 0
        self.predicted_seconds = 0.0
        self.judged_drafts = 0  # unverified drafts judged in hindsight (judge)
        self._rest: tuple | None = None  # (until clock, rows, keys priced): a plain step that stands (REST_GAP)
        self._drafting: list | None = None  # keep_drafting's stand for the step under way (_drafting_memo)
        # dormancy (rest.DORMANT_AFTER): plain plans in a row, of these rows; the dormant steps granted, left
        self._plain_run, self._dormant_rows, self._dormant_skip, self._dormant_left = 0, [], 0, 0
        self.dormant_steps = 0

    # ------------------------------------------------------------------------------------------- costs
    def observe_target(self, tokens: int, seconds: float) -> None:
        self.target_costs.observe(tokens, seconds, self.clock)
        self._forward_seconds += seconds

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """A target prefill over `tokens` query tokens (rows admitted x the longest prompt): not a step's
        forward, and not one of its costs (see prefill_costs)."""
        self.prefill_costs.observe(tokens, seconds, self.clock)

    def observe_draft(self, tokens: int, seconds: float) -> None:
        if self.draft_costs is not None:
            self.draft_costs.observe(tokens, seconds, self.clock)
        self._forward_seconds += seconds

    def _overhead(self, batch: int, speculative: bool) -> float:
        plain = self.plain_overhead.estimate(batch) or 0.0
        if not speculative:
            return plain
        spec = self.spec_overhead.estimate(batch)
        return plain if spec is None else spec

    def _target_estimate(self, tokens: int) -> float:
        """A target forward over `tokens` query tokens: the steps' table; past the largest N a step measured,
        the prefills' estimate where it is lower than the steps' linear extrapolation, and never below that
        largest step (a draft model's catch-up, a width never verified)."""
        costs = self.target_costs
        est = costs.estimate(tokens)
        known = costs._sorted
        if (not known or tokens > known[-1]) and self.prefill_costs._sorted:
            pre = self.prefill_costs.estimate(tokens)
            est = pre if est is None else max(costs.seconds[known[-1]], min(est, pre)) if known else pre
        return est if est is not None else MIN_SECONDS

    def _draft_estimate(self, tokens: int) -> float:
        return self.draft_costs.estimate(tokens) or MIN_SECONDS

    def _draft_optimistic(self, tokens: int) -> float:
        """A low but plausible cost of a draft forward over `tokens` query tokens, for exploring: its measured
        cost discounted by age (ForwardCosts.optimistic), but never below its parameter share of the target's
        current cost at that N (the prior). Draft costs are measured only while speculating, so after a plain
        spell they date from the last speculative one. Traced on the demo pair's layer-skip draft at batch 1: a
        draft forward timed at 2.49 ms in a slow spell of the machine (1.3-1.5 ms otherwise) was believed for
        700 plain steps, and with it no width could win; a draft as dear as the target (its prior) still can
        never pay."""
        costs = self.draft_costs
        floor = self.draft_ratio * self._target_estimate(tokens)
        smallest = costs.smallest()
        if smallest is None or smallest > tokens:
            # Never measured, and only larger N were (if any): the estimate from above is one early sample or two, and
            # believed it kept a draft at batch 1 from ever being tried wide (a width-2 step times only the first
            # draft forward, N = 2, at 3.85 ms in a noisy start; N = 1 costs 2.4 ms), so its hope is the prior.
            return floor
        own = costs.optimistic(tokens, self.clock, self.refresh_steps)
        return floor if own is None else max(own, floor)

    # ------------------------------------------------------------------------------------------- acceptance
    def _row_factor(self, row: Hashable) -> float:
        r = self.rows.get(row)
        if r is None:
            return 1.0
        return (r.accepted + self.row_strength) / (r.expected + self.row_strength)

    def probs(self, row: Hashable, keys: Sequence[tuple], factor: float | None = None) -> list[float]:
        """p[b, i] for row b's drafts with these keys; factor: the row's factor when the caller has it."""
        f = self._row_factor(row) if factor is None else factor
        rate = self.acceptance.rate  # cached per key until the table next changes
        return [_clamp(f * rate(key)) for key in keys]

    @staticmethod
    def _cumulative(probs: Sequence[float]) -> list[float]:
        """[E(0), E(1), ...]: E(k) = 1 + sum_{i<=k} prod_{j<=i} probs[j], the tokens a row emits with k drafts."""
        out, total, run = [1.0], 1.0, 1.0
        for p in probs:
            run *= p
            total += run
            out.append(total)
        return out

    # ------------------------------------------------------------------------------------------- decisions
    def _budget_left(self, cost: float = 1.0) -> bool:
        """Exploration is budgeted in plain-step equivalents: warmup_explore + explore_share * steps of them."""
        return self.explore_spent + cost <= self.warmup_explore + self.explore_share * self.steps

    def _stale(self, costs: ForwardCosts, tokens: int) -> bool:
        age = costs.age(tokens, self.clock)
        return age is None or age > self.refresh_steps

    def token_worth(self, remaining: Sequence[int]) -> list[float]:
        """v_b per row in units of an average token, c(B) / B (see the module docstring), once nothing waits for
        room; remaining: per row, the most tokens it has left. beta is the slope of the target's measured cost
        at N = B (towards the nearest measured smaller N, else the nearest larger one; unknown: every token
        alike)."""
        batch = len(remaining)
        if batch < 2:
            return [1.0] * batch
        full = self._target_estimate(batch) + self._overhead(batch, False)
        known = self.target_costs._sorted
        i = bisect.bisect_left(known, batch)
        near = known[i - 1] if i > 0 else next((n for n in known[i:] if n > batch), None)
        if near is None:
            return [1.0] * batch
        beta = (self._target_estimate(batch) - self._target_estimate(near)) / (batch - near)
        beta = min(full / batch, max(0.0, beta))
        longest = max(remaining)
        tied = sum(r == longest for r in remaining)
        alpha = (full - batch * beta) / tied
        return [(beta + alpha if r == longest else beta) / (full / batch) for r in remaining]

    def plan(self, rows: Sequence[Hashable], keys: Sequence[Sequence[tuple]], *, catch_up: int = 0,
             horizon: float = math.inf, remaining: Sequence[int] | None = None) -> Plan:
        """The step's width and per-row draft counts.

        rows: a stable id per batch row (the sequence it decodes), for its row factor.
        keys: per row, the feature keys of the drafts it can offer, in order (an n-gram proposal: one key per
            proposed token; a draft model, before drafting: K position keys). len(keys[b]) caps row b's count.
        catch_up: a draft model's columns to feed before it can draft (it skipped steps, or has not prefilled);
            its cost is spread over `horizon` steps (the steps the batch has left), since it is paid once.
        remaining: per row, the most tokens it has left, when nothing waits for room (the batch drains); None
            while prompts wait. Tokens are then valued by what they shorten the run (token_worth).
        """
        # A step's forwards are those timed from here to record: a prefill of rows admitted after the last step
        # (timed too, for the cost tables) is not this step's, and counted as one it left the step after every
        # admission with no overhead at all (at batch 1, one step per prompt: the plain overhead read as 0).
        self._forward_seconds = 0.0
        batch = len(rows)
        if self._rest is not None and self._resting(rows, keys):
            return self._finish(Plan(1, [0] * batch, float(batch), self._target_estimate(batch)), rows, keys)
        offer, cap = [], self.k  # plain loops in plan, keep_drafting and record: see keep_drafting
        for k in keys:
            offer.append(min(len(k), cap))
        if not self.enabled:
            width = max(offer, default=0) + 1
            return self._finish(Plan(width, [min(n, width - 1) for n in offer], 0.0, 0.0), rows, keys)
        # first measure what a plain step costs, a few times (a process's first steps run cold)
        top = max(offer, default=0) if self.clock >= PLAIN_FIRST and self.target_costs.seconds else 0
        if top == 0:
            return self._finish(Plan(1, [0] * batch, float(batch), self._target_estimate(batch)), rows, keys)
        # Plan runs every step, just after a forward has evicted the interpreter's working set from the caches:
        # in situ it costs 3-4x what it does in a tight loop (on the demo pair at batch 8, 100 us against 28),
        # so it does as little per row as it can. Rows with the same keys and row factor share their
        # probabilities (a draft model offers every row the same key list: one lookup for the batch), and
        # rows that also offer as many drafts and are worth the same are summed as one group with a count.
        shared: dict = {}
        rated: dict = {}  # id(key list) -> the rates of its first K keys: rows with other factors share them
        probs, factors, groups = [], [], {}
        worth = self.token_worth(remaining) if remaining is not None else None
        records, strength, rate, cap = self.rows, self.row_strength, self.acceptance.rate, self.k
        for b, (r, k) in enumerate(zip(rows, keys)):
            rec = records.get(r)  # the row factor (_row_factor) and probs, inlined: this loop runs per row
            f = 1.0 if rec is None else (rec.accepted + strength) / (rec.expected + strength)
            memo = (f, id(k))
            entry = shared.get(memo) if k else NO_OFFER  # a row offering nothing expects its one token
            if entry is None:
                rates = rated.get(id(k))
                if rates is None:
                    rates = rated[id(k)] = []
                    for key in k[:cap]:
                        rates.append(rate(key))
                p = []
                for x in rates:
                    q = f * x
                    p.append(q if 0.0 <= q <= 0.995 else (0.995 if q > 0.995 else 0.0))  # _clamp
                entry = shared[memo] = (p, self._cumulative(p), k, f)  # gains[c]: its expected tokens, c drafts
            probs.append(entry[0])
            factors.append(f)
            group = (memo, offer[b], 1.0 if worth is None else worth[b])
            member = groups.get(group)
            if member is None:
                groups[group] = [1, entry]
            else:
                member[0] += 1
        # expected tokens per draft count c: sum_b gains[b][min(offer[b], c)], and what they are worth (in
        # units of an average token: the same as tokens while prompts wait)
        totals = [0.0] * (top + 1)
        values = totals if worth is None else [0.0] * (top + 1)
        for (memo, o, v), (count, entry) in groups.items():
            g = entry[1]
            for c in range(top + 1):
                t = count * g[c if c < o else o]
                totals[c] += t
                if worth is not None:
                    values[c] += v * t
        model = self.draft_costs is not None
        may_explore = self._budget_left()
        draft_stale = False
        if model:
            known = self._draft_forwards(batch, catch_up, self._draft_estimate)
            if may_explore:
                # Never measured at all: its prior is no hope. Measured, but not at N = batch (only the first,
                # wider forward of width-2 steps): hoped like a stale cost, or that N is never measured.
                age = self.draft_costs.age(batch, self.clock)
                draft_stale = age > self.refresh_steps if age is not None else bool(self.draft_costs.seconds)
                if draft_stale:
                    hoped = self._draft_forwards(batch, catch_up, self._draft_optimistic)
        overhead = (self._overhead(batch, False), self._overhead(batch, True))
        thin = may_explore and self.acceptance.verdicts < MIN_VERDICTS
        if thin:  # a new drafter: its acceptance is hoped for (AcceptanceTable.hope)
            hoped_values = self._hoped_values(groups, top)
        over_stale = may_explore and self._stale(self.spec_overhead, batch)
        over_hope = overhead[1]  # a stale overhead is hoped low, as a stale forward is
        if over_stale:
            over_hope = self.spec_overhead.optimistic(batch, self.clock, self.refresh_steps) or over_hope
        best = best_opt = best_spec = plain_s = None
        clock, refresh, target_seen = self.clock, self.refresh_steps, self.target_costs.last_seen
        measured = self.target_costs.seconds  # _target_estimate's answer where N was measured (always > 0)
        target_by_width = []
        for width in range(1, top + 2):
            tokens, value = totals[width - 1], values[width - 1]
            drafts = width - 1 if model else 0
            draft_s, extra = self._draft_seconds(known, drafts, catch_up, horizon) if drafts else (0.0, 0.0)
            n = batch * width
            draft_s += overhead[width > 1]
            target_s = measured.get(n) or self._target_estimate(n)
            target_by_width.append(target_s)
            est = target_s + draft_s
            # Any speculative width must beat plain by SPECULATE_MARGIN: the best of several noisy estimates is
            # biased upwards (on the demo pair's layer-skip draft at batch 2, 5.0 tokens predicted per step,
            # 4.4-4.6 realised), and near break-even a wrong "speculate" costs more than a wrong "plain".
            # Waking a draft model that fell behind costs a catch-up forward whatever the estimates say: the
            # margin grows to SWITCH_MARGIN as that forward's extra cost nears a plain step's, so noise in the
            # costs does not flap a dear catch-up on. A lag of a column or two (one plain step that re-measured
            # plain decoding, or one noisy sample) costs next to nothing to feed, yet the full margin there kept
            # the demo pair's layer-skip draft plain after such steps wherever it predicted a 5-10% gain (traced:
            # each step of those spells chose a speculative width when re-planned without the margin).
            margin = 1.0
            if width > 1:
                switch = SWITCH_MARGIN * min(1.0, extra / max(plain_s, MIN_SECONDS))  # extra: 0 without a lag
                margin = 1 + max(SPECULATE_MARGIN, switch)
            option = (value / est / margin, width, tokens, est, value)
            if best is None or option[0] > best[0]:
                best = option
            if width > 1 and (best_spec is None or option[0] > best_spec[0]):
                best_spec = option
            if plain_s is None:
                plain_s, plain_option = est, option + (1.0,)
            seen = target_seen.get(n)  # _stale, inlined
            stale_target = seen is None or clock - seen > refresh
            stale_draft = bool(drafts) and draft_stale
            hoped_value = hoped_values[width - 1] if thin else value
            if may_explore and (stale_target or stale_draft or (over_stale and width > 1) or hoped_value > value):
                # A stale cost is hoped low (ForwardCosts.optimistic, _draft_optimistic, a stale overhead), a
                # fresh one believed. A new drafter's drafts are hoped to land as often as their evidence
                # allows (thin, MIN_VERDICTS). Not later: on faded evidence after a plain spell, with stale
                # costs hoped as low as a plain step's on top, drafts landing 3% of the time were explored on
                # the whole budget (20 steps in 600 at batch 1); and hoped for at the believed costs, the
                # layer-skip draft at batch 1 spent a fifth more steps exploring for less (english 1.232x
                # against 1.337x, code 1.164x against 1.267x, 6 paired repeats).
                opt = (self.target_costs.optimistic(n, clock, refresh) or MIN_SECONDS if stale_target
                       else target_s)
                if width == 1:
                    opt += draft_s
                else:
                    opt += over_hope + (self._draft_seconds(hoped, drafts, catch_up, horizon)[0] if stale_draft
                                        else draft_s - overhead[1])
                # what exploring costs, in plain steps: the step, and all of a catch-up it needs (a draft model's
                # prefill is paid now, whatever it is amortised over if speculation then pays)
                cand = (hoped_value / opt, width, tokens, est, value,
                        1.0 + extra / max(plain_s, MIN_SECONDS))
                if best_opt is None or cand[0] > best_opt[0]:
                    best_opt = cand
        explore = (best_opt is not None and best_opt[0] > best[0] * (1 + EXPLORE_GAIN) and best_opt[1] != best[1]
                   and self._budget_left(best_opt[5]))
        choice = best_opt if explore else best
        if not explore and best[1] > 1 and self._stale(self.target_costs, batch) and self._budget_left(1.0):
            # What speculation must beat is re-measured too: a plain cost measured in a slow spell of the machine
            # (its speed drifts by a quarter over seconds) would otherwise keep a losing width on for good, since
            # nothing else measures a plain step. It costs at most the gain of one step.
            explore, choice = True, plain_option
        if explore:
            self.explore_spent += choice[5]
        elif choice[1] == 1:
            self._rest = self._rest_after(plain_option[0], best_spec, best_opt, rows, keys, probs, values, top,
                                          may_explore, worth)
        counts, chosen, drafts = [], [], choice[1] - 1
        for n, p in zip(offer, probs):
            c = n if n < drafts else drafts
            counts.append(c)
            chosen.append(p[:c])
        plan = Plan(choice[1], counts, choice[2], choice[3], explore=explore, probs=chosen, worth=worth,
                    predicted_value=choice[4],
                    priced=(self.acceptance.version, factors, probs, keys, target_by_width) if model else None)
        return self._finish(plan, rows, keys)

    def _hoped_values(self, groups: dict, top: int) -> list[float]:
        """plan's values by draft count with every row's drafts hoped to land as often as their evidence allows
        (AcceptanceTable.hope): what an exploration may find. groups: plan's {(memo, offer, worth): [count,
        (p, gains, keys, factor)]}."""
        hope, cap, cache = self.acceptance.hope, self.k, {}
        out = [0.0] * (top + 1)
        for (memo, o, v), (count, entry) in groups.items():
            g = cache.get(memo)
            if g is None:
                keys, f = entry[2], entry[3]
                g = cache[memo] = self._cumulative([_clamp(f * hope(key)) for key in keys[:cap]])
            for c in range(top + 1):
                out[c] += v * count * g[c if c < o else o]
        return out

    def _draft_forwards(self, batch: int, catch_up: int, cost) -> tuple[float, float, float]:
        """A draft model's forwards for a step, by cost(N): (the first, carrying the catch-up columns; the first
        without them; each later one)."""
        first = self.first_columns
        return cost(batch * (catch_up + first)), cost(batch * first), cost(batch)

    @staticmethod
    def _draft_seconds(forwards, drafts: int, catch_up: int, horizon: float) -> tuple[float, float]:
        """(seconds of drafting `drafts` tokens per row, with the catch-up amortised; the catch-up's extra cost).
        The catch-up columns ride on the first draft forward; their extra cost is charged once per horizon."""
        first, first_caught_up, rest = forwards
        draft_s = first + (drafts - 1) * rest
        extra = draft_s - (first_caught_up + (drafts - 1) * rest) if catch_up else 0.0
        return draft_s - extra * (1 - 1 / max(1.0, min(horizon, PAYBACK_STEPS))), extra

    def _finish(self, plan: Plan, rows, keys) -> Plan:
        self.steps += 1
        self.clock += 1  # never reset: the age of what was measured, across runs
        self.explored += plan.explore
        self.predicted_tokens += plan.predicted_tokens
        self.predicted_seconds += plan.predicted_seconds
        plan.rows = list(rows)
        self._note_plain(plan, plan.rows)
        return plan

    def record(self, plan: Plan, keys: Sequence[Sequence[tuple]], accepted: Sequence[int],
               seconds: float | None = None) -> None:
        """The step's outcome: row b verified len(keys[b]) drafts (features keys[b]) and accepted accepted[b];
        seconds: the step's wall time (prefills excluded), whose part beyond the timed forwards is overhead."""
        width = 1 + max(map(len, keys), default=0)
        self.width_hist[min(width, len(self.width_hist) - 1)] += 1
        if width == 1:  # a plain step: one token per row, nothing verified, no acceptance to learn
            self.plain_steps += 1
            self.realised_tokens += len(accepted)
            if self.enabled and seconds is not None:
                self.plain_overhead.observe(len(keys), max(MIN_SECONDS, seconds - self._forward_seconds), self.clock)
            self._forward_seconds = 0.0
            self.acceptance.tick(PLAIN_FADE)
            return
        self.realised_tokens += sum(accepted) + len(accepted)
        reached = []  # drafts whose verdict was seen (plain loops: see keep_drafting)
        for k, a in zip(keys, accepted):
            reached.append(min(a + 1, len(k)))
        if self.enabled:  # fixed K keeps only the stats (the acceptance table is one): no costs, no row factors
            if seconds is not None:
                self.spec_overhead.observe(len(keys), max(MIN_SECONDS, seconds - self._forward_seconds), self.clock)
            # what the tables predicted for every row before this step's outcomes are learned
            records, strength = self.rows, self.row_strength
            keyrate, cached = self.acceptance.rate, self.acceptance.rates  # see keep_drafting
            for row, k, a, n in zip(plan.rows, keys, accepted, reached):
                if n:
                    rec = records.get(row)  # the row factor before this step (_row_factor, probs: inlined)
                    f = 1.0 if rec is None else (rec.accepted + strength) / (rec.expected + strength)
                    expected = 0
                    for i in range(n):
                        key = k[i]
                        p = cached.get(key)
                        p = f * (keyrate(key) if p is None else p)
                        expected += p if 0.0 <= p <= 0.995 else (0.995 if p > 0.995 else 0.0)
                    if rec is None:
                        rec = records[row] = RowRecord()
                    rec.accepted += min(a, n)
                    rec.expected += expected
        self._forward_seconds = 0.0
        self.acceptance.observe_rows(keys, reached, accepted)
        self.acceptance.tick(1.0)

    def judge(self, outcomes: Sequence[tuple[Hashable, Sequence[tuple], int]]) -> None:
        """Drafts the target never verified, judged by the tokens that followed them (a deterministic drafter's
        hindsight, e.g. NgramDrafter.judged): (row, keys up to the first miss, how many matched) each. They
        teach the acceptance table and the row factors as verified drafts do: for a deterministic draft the
        emitted token equals it with the probability verification would have accepted it. Only tokens already
        emitted are used, so what later steps draft stays independent of their own verdicts."""
        if not self.enabled or not outcomes:
            return
        expected = [sum(self.probs(row, keys)) for row, keys, _ in outcomes]  # all before any is learned
        keys, reached, accepted, records = [], [], [], self.rows
        for (row, k, a), e in zip(outcomes, expected):
            rec = records.get(row)
            if rec is None:
                rec = records[row] = RowRecord()
            rec.accepted += a
            rec.expected += e
            keys.append(k)
            reached.append(len(k))
            accepted.append(a)
        self.acceptance.observe_rows(keys, reached, accepted)
        self.judged_drafts += sum(reached)

    def begin_run(self) -> None:
        """A new generate() call: its sequence ids are new, and its stats start at zero. What was learned about
        costs and acceptance carries over."""
        self.rows.clear()
        self.steps = self.explored = self.plain_steps = 0
        self.explore_spent = 0.0
        self.width_hist = [0] * (self.k + 2)
        self.predicted_tokens = self.predicted_seconds = 0.0
        self.realised_tokens = self.judged_drafts = self.dormant_steps = 0
        self._rest = None
        self._plain_run = self._dormant_skip = self._dormant_left = 0

    def forget(self, row: Hashable) -> None:
        """A sequence finished: drop its row record."""
        self.rows.pop(row, None)

    def stats(self) -> dict:
        steps = self.steps
        recorded = sum(self.width_hist)
        mean_width = sum(w * n for w, n in enumerate(self.width_hist)) / recorded if recorded else 0.0
        return {
            "adaptive": self.enabled,
            "width_histogram": list(self.width_hist[1:]),  # steps per verify width 1 .. K + 1
            "mean_width": mean_width,
            "plain_steps": self.plain_steps,
            "dormant_steps": self.dormant_steps,  # plain steps run without an offer or a plan (rest.DORMANT_AFTER)
            "explore_steps": self.explored,
            "judged_drafts": self.judged_drafts,
            "predicted_tokens_per_step": self.predicted_tokens / steps if steps else 0.0,
            "realised_tokens_per_step": self.realised_tokens / steps if steps else 0.0,
            # what the acceptance table has learned: key -> [P(accepted | the drafts before accepted), weight]
            "acceptance_table": {"/".join(map(str, key)): [round(self.acceptance.rate(key), 4), round(c[1], 1)]
                                 for key, c in sorted(self.acceptance.counts.items(), key=lambda kc: str(kc[0]))},
        }
