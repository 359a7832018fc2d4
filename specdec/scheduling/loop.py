"""The decode loop: one loop for every scheduler; EQSPEC and EXSPEC are batch sources plugged into it.

    settle        admit waiting prompts into the source (prefill; each new row's first token)
    while the source has rows:
        batch     source.next_batch(): the step's rows, right-aligned in their KV lanes
        draft     the controller plans the verify width; the drafter proposes up to width - 1 tokens per row
        verify    one target forward over [last, d_1 .. d_{w-1}] per row (w = 1: a plain decoding step)
        sample    sk.verify_greedy / sk.rejection_sample: tokens [B, w] and a_b per row, read back in one sync
        commit    the source keeps each row's a_b + 1 target columns (and the drafter's), realigned
        emit      append tokens, finish rows at EOS / max_new_tokens, retire them, settle again

Between steps the target's lane holds every token of a row except the newest, `last`. The batch source
interface (admit, next_batch, commit, retire) is all the loop knows of a scheduler, and the drafter protocol
(specdec.drafting.base) all it knows of a drafter.

With a tensor-parallel target every rank runs this loop (`ranks`: specdec.scheduling.distributed): rank 0's
plan, early stops, first tokens and step outcomes reach the others in one small int64 broadcast each, so
every rank runs the same forwards.

An optional observer (specdec.hf_generate's streamer and output_scores) sees what plain decoding would show:
observer.tokens(seq, tokens) with each row's tokens as they are kept (after an EOS / max_new_tokens cut), and,
when observer.wants_scores, observer.scores(seqs, logits, scores) with the raw and processed target
distributions [B, w, V] each kept token was chosen from, before the tokens of that step.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Protocol, Sequence

import torch

import specdec_kernels as sk

from ..drafting.base import Drafter, Proposal
from ..kv.batch import StepBatch
from ..sampling import Prefixes, SamplingConfig, greedy, sample
from ..timing import ForwardClock, PhaseTimer
from .control import SpeculationController


class BatchSource(Protocol):
    """A scheduler as the decode loop sees it."""

    commit_phase: str  # the timer phase its commit is charged to ("realign" when it moves KV rows)

    def room(self) -> int:
        """How many more sequences it can take now."""

    def admit(self, seqs: list[int], prompts: list[list[int]], pick) -> torch.Tensor:
        """Prefill the target for new sequences; pick(logits [n, V], their seqs) gives their first tokens,
        returned in the order of `seqs`."""

    def next_batch(self, waiting: int) -> StepBatch:
        """The rows of the next step (`waiting`: prompts not admitted yet, for the pick policy)."""

    def commit(self, batch: StepBatch, target_drop: list[int], draft_drop: list[int] | None,
               last: torch.Tensor) -> None:
        """Row b keeps all but its last target_drop[b] target columns (draft_drop[b] of the draft lane's);
        its newest token is last[b]."""

    def retire(self, seqs: Sequence[int]) -> None:
        """These sequences are finished: free their rows."""

    def stats(self) -> dict:
        ...


class DecodeLoop:
    def __init__(self, *, target, source: BatchSource, drafter: Drafter | None,
                 controller: SpeculationController | None, prompts: list[list[int]], max_new: int, eos: list[int],
                 sampling: SamplingConfig, generator: torch.Generator, backend: str | None, timer: PhaseTimer,
                 k: int, progress=None, observer=None):
        self.target, self.source, self.drafter, self.controller = target, source, drafter, controller
        self.ranks = None  # the decoder sets TensorParallelRanks for a sharded target (rank 0 decides)
        self.observer = observer
        self.keep_scores = bool(getattr(observer, "wants_scores", False))
        self.prompts, self.max_new, self.k = prompts, max_new, k
        self.eos, self.eos_set = eos, frozenset(eos)
        self.sampling, self.generator, self.backend = sampling, generator, backend
        self.timer, self.progress = timer, progress
        self.device = timer._device
        self.clock = ForwardClock(self.device)
        # Forward timings and draft confidences feed decisions only: fixed K (a disabled controller) skips both
        self.adaptive = controller is not None and controller.enabled
        # the timings reach the controller in collect_timings, which counts what it does with them
        self._observe_target = controller.observe_target if self.adaptive else None
        # a controller older than its prefill table (bench/controller_ab.py --rev) takes prefills as steps
        self._observe_prefill = getattr(controller, "observe_prefill", self._observe_target) if self.adaptive \
            else None
        observe_draft = controller.observe_draft if self.adaptive else None
        if hasattr(drafter, "timed"):
            drafter.timed = (lambda tokens: self.clock.measure(tokens, observe_draft)) if self.adaptive else None
        if hasattr(drafter, "prefill_timer"):
            drafter.prefill_timer = lambda: self.timer.within("draft_prefill")
        if hasattr(drafter, "confidence"):
            drafter.confidence = self.adaptive
        self.hindsight = self.adaptive and hasattr(drafter, "judged")
        if hasattr(drafter, "hindsight"):
            drafter.hindsight = self.hindsight
        # a draft model that reads its first draft off a plain step's target forward (EarlyExitDrafter)
        self.watch_plain = self.hindsight and hasattr(drafter, "watch_plain")
        # steps the controller lets run as plain decoding unplanned and untimed (rest.DORMANT_AFTER)
        self._dormant = getattr(controller, "dormant", None) if self.adaptive else None
        self._untimed = False
        self.out: list[list[int]] = [[] for _ in prompts]
        self.finished = [False] * len(prompts)
        self.waiting = list(range(len(prompts)))[::-1]  # pop() takes the next prompt in input order
        self.live: set[int] = set()
        self.steps = self.drafted = self.accepted = self.row_steps = self.ragged_steps = 0
        self.accept_hist = [0] * (k + 1)
        self.cuts = {"eos": 0, "max_new_tokens": 0}
        self.control_seconds = 0.0
        # a draft's feature before it is drafted; one list for the run (keep_drafting recognises it by identity)
        self.position_keys = [("model", i) for i in range(1, k + 1)]
        self._fed = self._drafter_counters()  # the drafter outlives this run: report this run's share

    def collect_timings(self) -> None:
        """Hand the forwards timed since the last call to the controller (ForwardClock.collect), its own time
        counted in control_seconds (left out before 2026-12-05, the demo table read 1.0-1.1% for what was
        1.2-1.5%)."""
        t = time.perf_counter()
        self.clock.collect()
        self.control_seconds += time.perf_counter() - t

    def _drafter_counters(self) -> tuple[int, int]:
        return (getattr(self.drafter, "catch_up_columns", 0), getattr(self.drafter, "resumed_columns", 0))

    # ------------------------------------------------------------------------------------------- the loop
    def run(self) -> None:
        self.timer.start()
        if self.prompts and self.max_new > 0:
            with self.timer.phase("schedule"):
                self.settle()
            while self.live:
                self.step()
        self.timer.stop()

    def step(self) -> None:
        self.steps += 1
        with self.timer.phase("schedule"):
            batch = self.source.next_batch(len(self.waiting))
            batch.history, batch.prompt_length = self.history, self.prompt_length
        # The controller's step time starts here: next_batch may evict finished rows from the caches (a copy of
        # every lane, paid once whatever the width). Counted as a step's overhead it was believed for every
        # later plain step of that batch size: on SmolLM2 at batch 7, 3.4 s against a 0.19 s forward, which
        # made the float16 copy look worth drafting.
        started = self.clock.now()
        with self.timer.phase("draft"):
            plan, proposal = self.draft(batch)
        with self.timer.phase("verify"):
            logits = self.verify(batch, proposal)
        with self.timer.phase("sample"):
            tokens, accepted, bins = self.sample(batch, proposal, logits)
        emitted, last = tokens[0], tokens[1]
        with self.timer.phase(self.source.commit_phase):
            draft_drop = self.drafter.commit(batch, proposal, emitted) if self.drafter is not None else None
            width = 1 if proposal is None else proposal.width + 1
            self.source.commit(batch, [width - 1 - a for a in accepted], draft_drop, last)
        with self.timer.phase("schedule"):
            self.record(batch, plan, proposal, emitted, accepted, bins, self.clock.now() - started)
            self.settle()

    # ------------------------------------------------------------------------------------------- phases
    def draft(self, batch: StepBatch):
        """(plan, proposal); proposal None for a plain step."""
        if self.drafter is None:
            return None, None
        if self._dormant is not None and self.ranks is None:  # each rank's controller would sleep on its own
            t = time.perf_counter()
            dormant = self._dormant(batch.seqs)
            self.control_seconds += time.perf_counter() - t
            if dormant:
                self._untimed = True
                return None, None
        keys = self.drafter.offer(batch, self.k)  # the drafter's own work (an n-gram lookup propose reuses)
        t = time.perf_counter()
        lag = self.drafter.lag(batch)  # the horizon only amortises a catch-up: not counted without one
        plan = self.controller.plan(batch.seqs, keys, catch_up=lag, horizon=self._horizon(batch) if lag else math.inf,
                                    remaining=self._remaining(batch))
        self.control_seconds += time.perf_counter() - t
        if self.ranks is not None:  # the controller follows this rank's timings: use rank 0's plan
            plan = self.ranks.agree_plan(plan, self.controller)
        if plan.plain:
            if self.watch_plain and self.ranks is None:  # one rank's verdicts would skew its controller alone
                self.drafter.watch_plain(batch, self.sampling)
            return plan, None
        early = getattr(self.drafter, "early_stop", False) and self.adaptive
        position_keys = self.position_keys

        def stop(drafted, keys_so_far):
            t0 = time.perf_counter()
            go_on = self.controller.keep_drafting(plan, drafted, keys_so_far, position_keys)
            self.control_seconds += time.perf_counter() - t0
            if self.ranks is not None:
                go_on = self.ranks.agree_flag(go_on, self.controller)
            return not go_on

        proposal = self.drafter.propose(batch, self.k if early else plan.width - 1, self.sampling, self.generator,
                                        stop)
        if proposal.keys is not None:  # proposals known up front (n-gram): verify only what the plan priced
            proposal = proposal.narrowed(plan.num_draft)
        if proposal.width == 0:
            return plan, None
        return plan, proposal

    def _horizon(self, batch: StepBatch) -> float:
        """Steps the batch has left, roughly: its rows' remaining tokens over the tokens a row gets per step."""
        remaining = sum(self.max_new - len(self.out[s]) for s in batch.seqs) / max(1, batch.size)
        per_step = (self.accepted + self.row_steps) / self.row_steps if self.row_steps else 1.0
        return max(1.0, remaining / per_step)

    def _remaining(self, batch: StepBatch) -> list[int] | None:
        """Once the batch drains (no prompt waits, every live sequence is in it), the most tokens each row has
        left: the run ends with its longest row, which the controller values (SpeculationController.plan)."""
        if self.waiting or batch.size != len(self.live) or not self.adaptive:
            return None
        return [self.max_new - len(self.out[s]) for s in batch.seqs]

    def verify(self, batch: StepBatch, proposal: Proposal | None) -> torch.Tensor:
        if proposal is None:
            columns = batch.last[:, None]
        else:  # unused slots of a ragged proposal hold -1; any valid id will do there, nothing reads its logits
            columns = torch.cat([batch.last[:, None], proposal.tokens.clamp(min=0)], dim=1)
        if not self.adaptive or self._untimed:
            self._untimed = False
            return batch.target.forward(columns)
        with self.clock.measure(columns.numel(), self._observe_target):
            return batch.target.forward(columns)

    def sample(self, batch: StepBatch, proposal: Proposal | None, logits: torch.Tensor):
        """((emitted per row, last [B] on the device), accepted per row, confidence bins or None). The step's
        one device-to-host sync reads tokens, counts and bins back together."""
        if proposal is None:
            tokens = self.first_tokens(logits, batch.seqs)[:, None]
            accepted = torch.zeros(batch.size, dtype=torch.int64, device=tokens.device)
        else:
            counts = proposal.counts()
            num_draft = None
            if any(c != proposal.width for c in counts):
                num_draft = torch.tensor(counts, dtype=torch.int64).to(logits.device, non_blocking=True)
            prefixes = Prefixes(batch.seqs, self.history, self.prompt_length, proposal.tokens)
            scores = self._scores(batch.seqs, logits, prefixes)
            if not self.sampling.do_sample:
                tokens, accepted = sk.verify_greedy(proposal.tokens, scores, num_draft, backend=self.backend,
                                                    **NO_VALUE_CHECKS)
            else:
                probs = scores.softmax(dim=-1) if scores is not None else self.sampling.probs(logits, prefixes)
                tokens, accepted = sk.rejection_sample(proposal.tokens, proposal.probs, probs, num_draft,
                                                       generator=self.generator, backend=self.backend,
                                                       **NO_VALUE_CHECKS)
        last = tokens.gather(1, accepted[:, None]).squeeze(1)
        packed = [accepted[:, None], tokens]
        if proposal is not None and proposal.bins is not None:
            packed.append(proposal.bins)
        if self.ranks is None:
            host = torch.cat(packed, dim=1).tolist()
        else:  # rank 0's outcome on every rank, read in the same readback; its drafts come along to be checked
            host, last = self.ranks.agree_outcome(torch.cat(packed, dim=1),
                                                  None if proposal is None else proposal.tokens)
        if self.adaptive:
            self.collect_timings()
        width = tokens.shape[1]
        accepted_host = [row[0] for row in host]
        emitted = [row[1:2 + a] for row, a in zip(host, accepted_host)]
        bins = [row[1 + width:] for row in host] if len(packed) == 3 else None
        return (emitted, last), accepted_host, bins

    def first_tokens(self, logits: torch.Tensor, seqs: list[int]) -> torch.Tensor:
        """The next token of each row from the last column's logits [B, n, V] (or [B, V])."""
        if logits.ndim == 3:
            logits = logits[:, -1]
        prefixes = Prefixes(seqs, self.history, self.prompt_length)
        scores = self._scores(seqs, logits[:, None], prefixes)
        if self.sampling.do_sample:
            probs = scores.softmax(dim=-1) if scores is not None else self.sampling.probs(logits[:, None], prefixes)
            return sample(probs[:, 0], self.generator)
        return greedy(scores[:, 0])

    def _scores(self, seqs: list[int], logits: torch.Tensor, prefixes: Prefixes) -> torch.Tensor | None:
        """The processed scores [B, w, V] when greedy decoding or the observer needs them (sampling then
        uses their softmax, which is what probs() is), else None."""
        if self.sampling.do_sample and not self.keep_scores:
            return None
        scores = self.sampling.process(logits, prefixes)
        if self.keep_scores:
            self.observer.scores(seqs, logits, scores)
        return scores

    def admission_tokens(self, logits: torch.Tensor, seqs: list[int]) -> torch.Tensor:
        """The first tokens of admitted prompts (first_tokens), rank 0's on every tensor-parallel rank."""
        tokens = self.first_tokens(logits, seqs)
        return tokens if self.ranks is None else self.ranks.agree_tokens(tokens)

    def history(self, seq: int) -> list[int]:
        """The tokens sequence `seq` has so far: its prompt, then what it emitted."""
        return self.prompts[seq] + self.out[seq]

    def prompt_length(self, seq: int) -> int:
        return len(self.prompts[seq])

    # ------------------------------------------------------------------------------------------- bookkeeping
    def emit(self, seq: int, tokens: Sequence[int]) -> None:
        out = self.out[seq]
        start = len(out)
        for i, t in enumerate(tokens):
            out.append(t)
            eos = t in self.eos_set
            if eos or len(out) >= self.max_new:
                self.finished[seq] = True
                if self.progress is not None:
                    self.progress(seq)
                if i + 1 < len(tokens):  # the block is cut: what follows is dropped
                    self.cuts["eos" if eos else "max_new_tokens"] += 1
                break
        if self.observer is not None:
            self.observer.tokens(seq, out[start:])

    def record(self, batch: StepBatch, plan, proposal: Proposal | None, emitted, accepted, bins,
               seconds: float) -> None:
        for seq, block in zip(batch.seqs, emitted):
            self.emit(seq, block)
        for a in accepted:
            self.accept_hist[a] += 1
        self.row_steps += len(accepted)
        if proposal is not None:
            self.drafted += sum(proposal.counts())
            self.accepted += sum(accepted)
            self.ragged_steps += int(max(accepted) != min(accepted))
        if plan is not None:
            t = time.perf_counter()
            if proposal is None:
                keys = [[] for _ in batch.seqs]
            else:
                keys = proposal.keys if proposal.keys is not None else proposal.resolve_keys(bins)
            self.controller.record(plan, keys, accepted, seconds)
            if self.hindsight:
                self.controller.judge(self.drafter.judged())
            self.control_seconds += time.perf_counter() - t

    def settle(self) -> None:
        """Retire finished sequences and admit waiting prompts while there is room (a prompt whose first token
        finishes it frees its room again: repeat)."""
        while True:
            done = [s for s in self.live if self.finished[s]]
            if done:
                self.source.retire(done)
                self.live.difference_update(done)
                for s in done:
                    if self.drafter is not None:
                        self.drafter.finish(s)
                    if self.controller is not None:
                        self.controller.forget(s)
            take = [self.waiting.pop() for _ in range(min(self.source.room(), len(self.waiting)))]
            if not take:
                return
            prompts = [self.prompts[i] for i in take]
            # A prefill is timed too: what a forward of that size costs, the size a draft model's catch-up is
            # (the controller keeps it apart from the steps' costs: SpeculationController.prefill_costs).
            timed = self.clock.measure(len(take) * max(map(len, prompts)), self._observe_prefill) \
                if self.adaptive else contextlib.nullcontext()
            with self.timer.within("prefill"), timed:
                first = self.source.admit(take, prompts, self.admission_tokens).tolist()
            if self.adaptive:  # before the next step's plan: a prefill is not that step's forward
                self.collect_timings()
            self.live.update(take)
            for seq, prompt, t in zip(take, prompts, first):
                if self.drafter is not None:
                    self.drafter.start(seq, prompt, t)
                self.emit(seq, [t])

    # ------------------------------------------------------------------------------------------- stats
    def stats(self) -> dict:
        phases = self.timer.report()
        total = sum(phases.values())
        new_tokens = sum(len(s) for s in self.out)
        out = {
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            # tokens a row emits per step: its accepted drafts plus the target's own token
            "mean_accepted_length": (self.accepted + self.row_steps) / self.row_steps if self.row_steps else 0.0,
            "accept_histogram": list(self.accept_hist),
            "ragged_steps": self.ragged_steps,  # steps whose rows accepted different numbers of drafts
            "cut_blocks": dict(self.cuts),  # steps' token blocks cut short by EOS / max_new_tokens
            "new_tokens": new_tokens,
            "tokens_per_s": new_tokens / total if total > 0 else 0.0,
            "total_seconds": total,
            "phase_seconds": phases,
            # target prefills of new prompts, inside "schedule" (a draft model catches up inside "draft"): the
            # engine's own overhead is total - draft - verify - prefill
            "prefill_seconds": self.timer.inner.get("prefill", 0.0),
            # a draft model's prefill of new prompts into its lane, inside "draft" (the rest of its catch-up
            # rides on its first forward of a step)
            "draft_prefill_seconds": self.timer.inner.get("draft_prefill", 0.0),
            "control_seconds": self.control_seconds,
            # a draft model's tokens fed to catch up (prompts, and steps it sat out: resumed_columns)
            "catch_up_columns": self._drafter_counters()[0] - self._fed[0],
            "resumed_columns": self._drafter_counters()[1] - self._fed[1],
            "eos": list(self.eos),
        }
        if self.controller is not None:
            out.update(self.controller.stats())
        out.update(self.source.stats())
        return out


# The loop builds every op input itself (ids in range, counts within K, finite probabilities from softmax), so it
# skips the checks that read tensor values: each would cost a device sync.
NO_VALUE_CHECKS = {"check_values": False}
