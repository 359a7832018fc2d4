"""The speculation controller's two online estimates: what a forward costs by its query-token count
(ForwardCosts) and how likely a draft is accepted by its feature key (AcceptanceTable). Both are plain
bookkeeping with no decisions in them; specdec.scheduling.control decides from what they answer."""

from __future__ import annotations

import bisect
import math

# How much an old cost measurement is trusted less, per `fresh` steps of age (ForwardCosts.optimistic).
STALE_DISCOUNT = 0.8
# How far above its posterior mean a draft's acceptance is hoped when exploring, in posterior standard deviations
# (AcceptanceTable.hope).
HOPE_SIGMAS = 1.0
# How many recent samples a measured cost keeps (ForwardCosts.observe): it answers their least.
KEPT_SAMPLES = 5
# How many steps a monotone ForwardCosts goes between full recomputations of its caps (a cap by a cost that has
# turned stale since is dropped then): between them a new cost only lowers caps, walking down from its N.
CAP_REFRESH = 8


class ForwardCosts:
    """Seconds of one forward pass of a model, by the number of query tokens N it carries (rows x new columns).

    Each measured N keeps its last KEPT_SAMPLES samples within `fresh` steps and answers the least of them. Noise
    on a shared machine only ever adds time (a stall, a slow spell of the other core), so the fastest of the
    recent samples is the forward's own cost, and every width is judged by the same statistic. A median let slow spells lock
    the controller out: traced on the demo pair's early exit at batch 1, the draft forward (1.6-1.9 ms) was
    believed at 4.4 ms after three samples in a slow spell, and widths 3-5 at 10.7 ms (8 ms measured before
    and after), while plain decoding, measured every plain step, was priced at its fast pace: plain for 17
    steps until those costs turned stale. Samples older than `fresh` steps are dropped when a new one arrives,
    so a cost that rose (longer contexts, another load on the machine) is believed within `fresh` steps of
    being re-measured, and one that fell at once.
    Unmeasured N are interpolated linearly between measured neighbours and extrapolated beyond the largest
    measured N as cost(N_max) * (N / N_max) ** growth (linear by default: a prefill-sized catch-up costs about
    its tokens on a CPU; pessimism there only makes exploring rarer). `prior(N)` answers when nothing is measured.

    monotone: a forward over more query tokens never costs less (true of BLAS blocking on a CPU and of tiles on a
    GPU, up to noise), so a fresh cost at a larger N caps the answer at every smaller N: the table answers, for
    each N, the least of its own cost and the costs of larger N measured within `fresh` steps. Noise only adds
    time, so the least evidence is the truest, and a bound is only ever lowered by it. Traced on the demo pair's
    layer-skip draft at batch 1: width 2 timed once at 18.6 ms in a slow spell, beside fresh widths 3 and 5 at
    13.9 and 14.9 ms, kept width 2 out of reach for 400 steps (only a stale cost is explored, and a width is only
    re-measured by being chosen); capped at 13.9 ms it is priced as it would be measured now. Until 2026-12-06 a
    new cost also raised larger N to it, which let a slow spell at a small N overrule the larger N's own fresh
    samples: traced on the demo pair's early exit at batch 1 (English), widths 3-5 all answered 12.0 ms, a slow
    spell's width 3, while widths 4 and 5 measured 7.3-9.0 and 8.2-12.7 ms; width 5 was never verified again.
    A monotone table also never answers more per token than a fresh smaller N costs (a forward over more tokens
    is no less efficient: BLAS blocks and GPU tiles fill up), cost(N) <= cost(M) * N / M for M < N. That bounds
    the sizes measured once in a slow spell and rarely again, a draft model's catch-ups above all: traced on the
    demo pair's layer-skip draft at batch 4 (English), a catch-up over 401 tokens timed once at 49.5 ms beside
    24.4 ms over 359 was believed for every later batch, whose catch-ups then looked twice their cost (the
    draft stayed plain for most of each batch, 0.96-0.99x plain where fixed K read 1.04x).
    """

    def __init__(self, prior=None, growth: float = 1.0, fresh: int = 64, monotone: bool = False):
        self.prior = prior
        self.growth = growth
        self.fresh = fresh
        self.monotone = monotone
        self.samples: dict[int, list[tuple[int, float]]] = {}
        self.own: dict[int, float] = {}  # the least of N's own kept samples
        self.seconds: dict[int, float] = {}  # what the table answers: own, capped by fresh larger N if monotone
        self.last_seen: dict[int, int] = {}
        self._sorted: list[int] = []
        self._capped_at = -math.inf  # the step of the last full _recap

    def observe(self, tokens: int, seconds: float, step: int = 0) -> None:
        if tokens < 1 or not seconds > 0 or not math.isfinite(seconds):
            return
        old, fresh = self.samples.get(tokens), self.fresh
        kept = []  # the last KEPT_SAMPLES - 1 samples within `fresh` steps, then this one (a loop: no call)
        low = seconds
        if old:
            for s in old:
                if step - s[0] <= fresh:
                    kept.append(s)
            del kept[:1 - KEPT_SAMPLES]
            for s in kept:
                if s[1] < low:
                    low = s[1]
        kept.append((step, seconds))
        self.samples[tokens] = kept
        own, answer = self.own, self.seconds
        before = own.get(tokens)
        own[tokens] = low
        if before is None:
            self._sorted = sorted(own)
        self.last_seen[tokens] = step
        if not self.monotone:
            answer[tokens] = low
        elif before is None or before < low or step - self._capped_at >= CAP_REFRESH:  # new, or its least left
            self._recap(step)
        else:  # a cost that fell or held only lowers caps: from N down, until an answer is already as low
            known = self._sorted
            i = bisect.bisect_left(known, tokens)
            if answer.get(tokens, math.inf) > low:
                answer[tokens] = low
            low = answer[tokens]
            j = i
            while i > 0:
                i -= 1
                n = known[i]
                if answer[n] <= low:
                    break
                answer[n] = low
            per_token, last = low / tokens, len(known) - 1
            while j < last:  # and per token, up from N
                j += 1
                n = known[j]
                if answer[n] <= per_token * n:
                    break
                answer[n] = per_token * n

    def _recap(self, step: int) -> None:
        """Every answer from scratch: the suffix minimum over fresh costs, from the largest N down."""
        own, last_seen, answer, fresh, cap = self.own, self.last_seen, self.seconds, self.fresh, math.inf
        for n in reversed(self._sorted):
            c = own[n]
            answer[n] = c if c < cap else cap
            if c < cap and step - last_seen[n] <= fresh:
                cap = c
        per_token = math.inf  # then no dearer per token than a fresh smaller N (see the class docstring)
        for n in self._sorted:
            c = answer[n]
            if c > per_token * n:
                answer[n] = c = per_token * n
            if step - last_seen[n] <= fresh and c < per_token * n:
                per_token = c / n
        self._capped_at = step

    def known(self, tokens: int) -> bool:
        return tokens in self.seconds

    def smallest(self) -> int | None:
        """The smallest measured N, or None when nothing is measured."""
        return self._sorted[0] if self._sorted else None

    def age(self, tokens: int, step: int) -> int | None:
        seen = self.last_seen.get(tokens)
        return None if seen is None else step - seen

    def estimate(self, tokens: int) -> float | None:
        """Best guess in seconds, or None when nothing (not even a prior) is known."""
        if tokens in self.seconds:
            return self.seconds[tokens]
        known = self._sorted
        if not known:
            return self.prior(tokens) if self.prior is not None else None
        i = bisect.bisect_left(known, tokens)  # tokens itself is not measured: known[i - 1] < tokens < known[i]
        lo = known[i - 1] if i > 0 else None
        hi = known[i] if i < len(known) else None
        if lo is not None and hi is not None:
            t = (tokens - lo) / (hi - lo)
            return self.seconds[lo] + t * (self.seconds[hi] - self.seconds[lo])
        if lo is not None:
            return self.seconds[lo] * (tokens / lo) ** self.growth
        return self.seconds[hi]  # below every measured N: no cheaper than nothing, no dearer than the smallest

    def optimistic(self, tokens: int, step: int = 0, fresh: int | None = None) -> float | None:
        """A low but plausible cost for N = tokens. Never measured: what the largest smaller N measured within
        the last `fresh` steps costs (a forward over more tokens is rarely cheaper), or STALE_DISCOUNT of the
        interpolated estimate if that is lower. Measured: its own cost discounted by STALE_DISCOUNT for every
        `fresh` steps since (a cost measured long ago, or cold at the start of a run, may have been too high,
        the more so the older it is), but no lower than that smaller N's. So a width once measured dear becomes
        worth re-measuring only slowly, the dearer it was the later, and eventually any width is."""
        own = self.estimate(tokens)
        seen = self.last_seen.get(tokens)
        if own is not None:
            own *= STALE_DISCOUNT ** (1.0 if seen is None or not fresh else max(1.0, (step - seen) / fresh))
        # the largest smaller N measured within `fresh` steps (a plain loop: plan asks this for every width)
        known, last_seen = self._sorted, self.last_seen
        i = bisect.bisect_left(known, tokens)
        lower = None
        while i > 0:
            i -= 1
            if fresh is None or step - last_seen[known[i]] <= fresh:
                lower = known[i]
                break
        if lower is None:
            return own
        bound = self.seconds[lower]
        if own is None:
            return bound
        return max(own, bound) if seen is not None else min(own, bound)


class AcceptanceTable:
    """P(a draft is accepted | every draft before it in its row was), per feature key, as Beta posterior means
    shrunk hierarchically: a key (a, b, c) borrows `strength` pseudo-counts from (a, b), which borrows from (a,),
    which borrows from the root prior. Evidence fades by `decay` per step that verified drafts, so the table
    follows a drafter whose luck changes (a new topic, a batch of different prompts) within a few hundred steps,
    and by decay ** PLAIN_FADE (specdec.scheduling.control) per plain step. Slower there because a plain step
    brings no evidence: at the full rate, a drafter that rarely lands would fade back to the optimistic root
    prior within a hundred plain steps and be tried again and again. tests/test_control.py's scripts, at batch
    1: 20 exploration steps in 600 at 3% acceptance with the full rate, 5 with 0.3; and a change to cheap
    verification and landing drafts after 300 such steps is found 116 steps later (308 with the full rate, whose
    budget was spent; never with 0.1)."""

    def __init__(self, root: float = 0.5, strength: float = 2.0, decay: float = 0.99):
        self.root = root
        self.strength = strength
        self.decay = decay
        self._now = 0.0  # the age clock: +1 per verified step, +PLAIN_FADE per plain step
        self.counts: dict[tuple, list[float]] = {}  # key -> [accepted, verified, age clock of the last update]
        # key -> the counts of its prefixes key[:1], key[:2], ..., key, once all exist (entries are only ever
        # updated in place): observe_row walks it instead of slicing and looking up every prefix
        self._chains: dict[tuple, list[list[float]]] = {}
        self._hopes: dict[tuple, float] = {}  # hope(), cached as rate() is
        # rate() until the next observation or tick (plan, keep_drafting and record ask for the same few keys
        # many times a step, and read it before calling rate: a hit then costs no call). Cleared, never rebound.
        self.rates: dict[tuple, float] = {}
        self.version = 0  # +1 whenever a rate may change (an observation, a tick): for callers' own caches
        self.accepted = 0  # accepted drafts observed: a rate may have risen
        self.verdicts = 0  # drafts observed, accepted or not (never faded)

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now = value
        self.rates.clear()
        self._hopes.clear()
        self.version += 1

    def tick(self, steps: float) -> None:
        """Age the evidence by `steps` verified steps (the `now` setter, without a property's extra call)."""
        self._now += steps
        self.rates.clear()
        self._hopes.clear()
        self.version += 1

    def _faded(self, c: list[float]) -> list[float]:
        if c[2] != self._now:
            f = self.decay ** (self._now - c[2])
            c[0] *= f
            c[1] *= f
            c[2] = self._now
        return c

    def rate(self, key: tuple) -> float:
        p = self.rates.get(key)
        if p is not None:
            return p
        # The posterior of key's parent, then key's own counts on top: the walk from the root prior down the
        # prefixes that have counts, one level at a time, each level's answer cached. A draft model's binned key
        # ("model", i, bin) then costs one level once plan has priced its position ("model", i).
        if len(key) > 1:
            p = self.rates.get(key[:-1])
            if p is None:
                p = self.rate(key[:-1])
        else:
            p = self.root
        c = self.counts.get(key)
        if c is not None:
            now = self._now
            if c[2] != now:  # _faded, inlined (as in observe_row): rate runs for every key a step prices
                f = self.decay ** (now - c[2])
                c[0] *= f
                c[1] *= f
                c[2] = now
            p = (c[0] + self.strength * p) / (c[1] + self.strength)
        self.rates[key] = p
        return p

    def hope(self, key: tuple) -> float:
        """An optimistic rate for exploring: rate(key) plus HOPE_SIGMAS of its posterior's spread, which is wide
        where the key has little (faded) evidence of its own and narrows as it gathers some. The controller asks
        it only during a drafter's first verdicts (margins.MIN_VERDICTS): on the demo pair's layer-skip draft at
        batch 1 (75% of drafts land), one early miss left position 1 at 1/2 on 2 verdicts, where no width paid,
        and no cost was stale enough to explore: plain for two whole calls (1500 steps). Hoped at 1/2 + 0.22 it
        is tried again within the exploration budget."""
        h = self._hopes.get(key)
        if h is not None:
            return h
        p, weight = self.rate(key), self.strength
        for depth in range(len(key), 0, -1):  # the evidence of the most specific key that has any
            c = self.counts.get(key[:depth])
            if c is not None:
                weight += c[1]  # rate() has faded it
                break
        h = self._hopes[key] = min(1.0, p + HOPE_SIGMAS * math.sqrt(p * (1.0 - p) / (weight + 1.0)))
        return h

    def observe(self, key: tuple, accepted: bool) -> None:
        self.observe_row((key,), 1, int(accepted))

    def observe_row(self, keys, reached: int, accepted: int) -> None:
        """The verdicts on the first `reached` drafts of one row (features `keys`), of which the first `accepted`
        landed: observe(keys[i], i < accepted) for each, with the caches cleared once."""
        self.observe_rows((keys,), (reached,), (accepted,))

    def observe_rows(self, keys, reached, accepted) -> None:
        """observe_row(keys[b], reached[b], accepted[b]) for every row b of a step, with the caches cleared once
        (record's hot path: one call a step)."""
        if not any(n > 0 for n in reached):
            return
        self.rates.clear()
        self._hopes.clear()
        self.version += 1
        counts, chains, now, decay = self.counts, self._chains, self._now, self.decay
        for row_keys, n, a in zip(keys, reached, accepted):
            if n <= 0:
                continue
            for i in range(n):
                key = row_keys[i]
                chain = chains.get(key)
                if chain is None:
                    chain = chains[key] = [counts.setdefault(key[:depth], [0.0, 0.0, now])
                                           for depth in range(1, len(key) + 1)]
                landed = i < a
                for c in chain:
                    if c[2] != now:  # _faded, inlined
                        f = decay ** (now - c[2])
                        c[0] *= f
                        c[1] *= f
                        c[2] = now
                    c[0] += landed
                    c[1] += 1
            self.accepted += a if a < n else n
            self.verdicts += n
