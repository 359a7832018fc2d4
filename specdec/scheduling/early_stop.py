"""A draft model's early stop: after each draft forward, whether drafting further still pays at the rate the
step's plan expected (SpeculationController.keep_drafting). It runs after every draft forward, cold, so it
computes a step's fixed part once (_drafting_memo) and each later call extends it by one draft. A mixin of
SpeculationController: it reads the controller's tables."""

from __future__ import annotations

from typing import Sequence

from .plan import Plan


class EarlyStop:
    """The early-stop rule of SpeculationController (keep_drafting)."""

    def keep_drafting(self, plan: Plan, drafted: int, keys: Sequence[Sequence[tuple]],
                      position_keys: Sequence[tuple]) -> bool:
        """A draft model has drafted `drafted` tokens per row; keys[b] are the features of row b's drafts so far
        (its own probability for each, binned), position_keys[i] the feature of a draft at position i + 1
        before it is drafted. Go on while drafting further (up to K, even past the plan) still pays at the
        rate the plan expected; else stop (the engine then verifies `drafted` drafts per row)."""
        if not self.enabled:
            return drafted < plan.width - 1
        if drafted >= self.k:
            return False
        if plan.explore and drafted < plan.width - 1:
            # An exploration measures the width it chose: cut short by the believed costs that made that width
            # look dear, it would re-measure a narrower one (traced on the demo pair's early exit at batch 1,
            # English: width 5 explored, never verified in 300 steps).
            return True
        batch = len(plan.rows)
        # Row b's expected tokens grow by P_b * G_b(m) with m more drafts: P_b, the chance its drafts so far all
        # land (their own keys), times G_b(m) = sum_{i<=m} prod_{j<=i} q_b[drafted + j], the position priors of
        # the drafts to come (with the row's factor). The row factors, the priors and so every G stand for the
        # whole step (the tables change only in record): computed on the step's first call, as is P_b, which
        # each later call extends by the one new draft (the draft model asks after every draft).
        memo = self._drafting
        if memo is None or memo[0] is not plan or memo[1] != self.acceptance.version or (
                memo[8] is not position_keys and memo[2] != list(position_keys[:self.k])):
            memo = self._drafting = self._drafting_memo(plan, list(position_keys[:self.k]), position_keys)
        # Plain loops, no comprehensions: on Python 3.11 each comprehension is a call of its own, and this runs
        # right after a draft forward has evicted the interpreter's working set (there, ~6x its cost in a loop).
        factors, ahead_probs, worth, rate, chance, estimates = memo[3], memo[4], memo[5], memo[6], memo[7], memo[9]
        done, land, seen = chance
        # extend the last call's chances only where this call continues it (the same drafts, one more each)
        if done != drafted - 1:
            done = 0
        else:
            for k, p in zip(keys, seen):
                if k[:done] != p:
                    done = 0
                    break
        if done == 0:
            land = [1.0] * batch
        keyrate, cached = self.acceptance.rate, self.acceptance.rates  # rate()'s cache, read first: a hit is no call
        for i in range(done, drafted):
            landed = []
            for x, f, k in zip(land, factors, keys):
                key = k[i]
                p = cached.get(key)
                p = f * (keyrate(key) if p is None else p)
                landed.append(x * (p if 0.0 <= p <= 0.995 else (0.995 if p > 0.995 else 0.0)))  # _clamp
            land = landed
        seen = []
        for k in keys:
            seen.append(k[:drafted])
        memo[7] = (drafted, land, seen)
        # gains[m - 1] = sum_b v_b P_b G_b(m), in row order
        gains = [0] * (self.k - drafted)
        for v, x, q in zip(worth, land, ahead_probs):
            vx, run, total = v * x, 1.0, 0.0
            for m, p in enumerate(q[drafted:]):
                run *= p
                total += run
                gains[m] += vx * total
        now_seconds = estimates[drafted]
        draft_s = ((self.draft_costs.estimate(batch) if self.draft_costs else 0.0) or 0.0)
        for more in range(1, self.k - drafted + 1):
            gain = gains[more - 1]
            extra = more * draft_s + estimates[drafted + more] - now_seconds
            if extra > 0 and gain / extra > rate:
                return True
            if extra <= 0 and gain > 0:
                return True
        return False

    def _drafting_memo(self, plan: Plan, ahead: list, position_keys) -> list:
        """keep_drafting's stand for a step: [plan, table version, position keys, row factors, per row the
        position priors q of the drafts ahead (with its factor), token worth, the plan's rate, (drafts counted,
        P per row, their keys), the position keys as passed, the target's estimated cost at width d + 1 by d].
        The target's costs do not change while a step drafts (only its own forward is timed then). What plan
        priced is reused where the table has not changed since and every row offered the drafts ahead (a draft
        model's position keys): the same numbers, computed once a step instead of twice."""
        batch, k = len(plan.rows), self.k
        priced = plan.priced
        factors = ahead_probs = None
        if priced is not None and priced[0] == self.acceptance.version and len(priced[4]) == k + 1:
            same, checked = True, None
            for keys in priced[3]:
                if keys is not checked:  # a draft model offers every row the same list: compared once
                    if keys[:k] != ahead:
                        same = False
                        break
                    checked = keys
            if same:
                factors, ahead_probs, estimates = priced[1], priced[2], priced[4]
        if factors is None:
            records, strength, keyrate = self.rows, self.row_strength, self.acceptance.rate
            factors, ahead_probs, shared = [], [], {}
            for r in plan.rows:
                rec = records.get(r)  # _row_factor, inlined
                f = 1.0 if rec is None else (rec.accepted + strength) / (rec.expected + strength)
                factors.append(f)
                q = shared.get(f)
                if q is None:
                    q = shared[f] = []
                    for key in ahead:  # probs, inlined
                        p = f * keyrate(key)
                        q.append(p if 0.0 <= p <= 0.995 else (0.995 if p > 0.995 else 0.0))
                ahead_probs.append(q)
            measured, estimates = self.target_costs.seconds, []
            for d in range(k + 1):
                n = batch * (d + 1)
                estimates.append(measured.get(n) or self._target_estimate(n))
        value = plan.predicted_value if plan.worth is not None else plan.predicted_tokens
        rate = value / plan.predicted_seconds if plan.predicted_seconds > 0 else 0.0
        worth = plan.worth or [1.0] * batch
        return [plan, self.acceptance.version, ahead, factors, ahead_probs, worth, rate,
                (0, [1.0] * batch, []), position_keys, estimates]
