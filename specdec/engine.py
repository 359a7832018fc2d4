"""SpeculativeDecoder: batch speculative decoding (EQSPEC; EXSPEC in specdec.exspec) and its plain
autoregressive baseline.

The loop is short and every phase is a named method, as in gpt-fast:

    admit the first batch (prefill target and drafter; the target's prefill gives each row its first token)
    while rows remain:
        draft    drafter.propose: K tokens per row
        verify   one target forward over [last, d_1..d_K] per row
        sample   sk.verify_greedy / sk.rejection_sample: tokens [B, K+1] and a_b per row
        realign  target and drafter drop their rejected columns and right-align again (sk.shift_rows_)
        schedule append tokens, finish rows at EOS / max_new_tokens, evict them, admit waiting prompts

Between steps the target cache holds every token of a row except the newest, `last`. EXSPEC (ExspecRun) reuses
this class's phases (speculate, record, emit, first_tokens, stats) around its own pool, gather and scatter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import specdec_kernels as sk

from .batch import REALIGN_MODES, RaggedKV, check_compact_threshold, initial_room
from .drafters import Drafter, ModelDrafter, PoolDrafter, Proposal
from .sampling import SamplingConfig, greedy, sample
from .timing import PhaseTimer
from .validation import check_attention, check_models, check_progress, check_seed, encode_prompts, eos_ids

SCHEDULERS = ("eqspec", "exspec", "autoregressive")


@dataclass
class GenerationResult:
    sequences: list[list[int]]
    stats: dict = field(default_factory=dict)
    texts: list[str] | None = None


class SpeculativeDecoder:
    def __init__(self, target, draft=None, num_draft_tokens: int = 4, scheduler: str = "eqspec",
                 backend: str | None = None, tokenizer=None, sync_timers: bool | None = None,
                 realign: str = "shift", compact_threshold: float | None = None, window: int = 32):
        """window: EXSPEC's pool size, the number of unfinished prompts it picks each step's group from."""
        if not isinstance(realign, str) or realign not in REALIGN_MODES:
            raise ValueError(f"realign must be one of {REALIGN_MODES}, got {realign!r}")
        # realign="mask": compact the holes once they are this share of the window (specdec.batch)
        self.compact_threshold = check_compact_threshold(compact_threshold)
        if not isinstance(scheduler, str) or scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be an int >= 1, got {num_draft_tokens!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if backend is not None:
            reason = sk.unavailable_reason(backend)  # ValueError for an unknown name
            if reason and backend != "auto":
                raise RuntimeError(f"backend {backend!r} is not available: {reason}")
        check_attention(target, "target")  # sliding windows, flash attention: refused before any forward
        self.target = target
        self.scheduler = scheduler
        self.k = num_draft_tokens
        self.backend = backend
        self.tokenizer = tokenizer
        self.sync_timers = sync_timers
        self.realign = realign
        self.window = window
        self.device = next(target.parameters()).device
        if scheduler == "autoregressive":
            self.drafter = None
        elif draft is None:
            raise ValueError(f"scheduler={scheduler!r} needs a draft model or drafter")
        elif isinstance(draft, Drafter) and not isinstance(draft, torch.nn.Module):
            if isinstance(getattr(draft, "model", None), torch.nn.Module):  # a drafter over a model (ModelDrafter)
                check_models(target, draft.model)
            self.drafter = draft
        else:
            check_models(target, draft)
            self.drafter = ModelDrafter(draft, backend, realign, self.compact_threshold)
        if scheduler == "exspec" and not isinstance(self.drafter, PoolDrafter):
            raise ValueError("scheduler='exspec' needs a drafter with the pool hooks begin_pool, gather and align "
                             "(see specdec.drafters)")
        self.vocab_size = target.get_output_embeddings().weight.shape[0]

    def generate(self, prompts, max_new_tokens: int = 64, batch_size: int = 8, eos_token_id=None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None, progress=None) -> GenerationResult:
        """Generate for every prompt; see GenerationResult. eos_token_id: an id, a list of ids, or None for
        the target's generation_config.eos_token_id (what target.generate would use); [] disables EOS.
        progress: optional callable, called with a prompt's index when that prompt is finished."""
        ids = encode_prompts(prompts, self.tokenizer, self.target, max_new_tokens, batch_size)
        sampling = SamplingConfig(do_sample, temperature, top_k, top_p)
        eos = eos_ids(eos_token_id, self.target, self.vocab_size)
        seed = check_seed(seed)
        check_progress(progress)
        if self.scheduler == "exspec":
            from .exspec import ExspecRun  # exspec builds on _Run: imported here, not at the top
            run = ExspecRun(self, ids, max_new_tokens, batch_size, eos, sampling, seed, progress, self.window)
        else:
            run = _Run(self, ids, max_new_tokens, batch_size, eos, sampling, seed, progress)
        with torch.no_grad():
            run.run()
        result = GenerationResult(run.out, run.stats())
        if self.tokenizer is not None:
            result.texts = [self.tokenizer.decode(s) for s in run.out]
        return result


def narrow(proposal: Proposal) -> Proposal:
    """Verify only as many draft slots as the longest row proposes: a drafter that often proposes fewer than K
    (the n-gram drafter finds no match) would otherwise pay for a K+1-token target forward every step."""
    if proposal.num_draft is None or proposal.tokens.shape[1] == 0:
        return proposal
    width = int(proposal.num_draft.max())
    if width == proposal.tokens.shape[1]:
        return proposal
    probs = proposal.probs[:, :width] if proposal.probs is not None else None
    return Proposal(proposal.tokens[:, :width], probs, proposal.num_draft)


class _Run:
    """The state of one generate() call."""

    def __init__(self, dec: SpeculativeDecoder, prompts, max_new: int, batch_size: int, eos: list[int],
                 sampling: SamplingConfig, seed, progress=None):
        self.dec, self.prompts, self.max_new, self.batch_size = dec, prompts, max_new, batch_size
        self.sampling, self.k, self.backend = sampling, dec.k, dec.backend
        self.device = dec.device
        self.eos, self.eos_set, self.progress = eos, frozenset(eos), progress
        self.generator = torch.Generator(device=self.device)
        if seed is not None:
            self.generator.manual_seed(int(seed))
        else:
            self.generator.seed()
        self.out: list[list[int]] = [[] for _ in prompts]
        self.waiting = list(range(len(prompts)))[::-1]  # pop() takes the next prompt in input order
        self.rows: list[int] = []  # batch row -> prompt index
        self.finished: list[bool] = []
        self.target: RaggedKV | None = None
        self.last: torch.Tensor | None = None
        self.timer = PhaseTimer(self.device, dec.sync_timers)
        self.steps = self.drafted = self.accepted = self.row_steps = self.ragged_steps = 0
        self.accept_hist = [0] * (self.k + 1)
        self.cuts = {"eos": 0, "max_new_tokens": 0}

    # --------------------------------------------------------------------------------------- the loop
    def run(self) -> None:
        self.timer.start()
        if self.prompts and self.max_new > 0:
            with self.timer.phase("schedule"):
                self.open()
                self.settle()
            while self.has_work():
                self.step()
        self.timer.stop()

    def open(self) -> None:
        self.admit_first_batch()

    def has_work(self) -> bool:
        return bool(self.rows)

    def step(self) -> None:
        self.steps += 1
        if self.dec.drafter is None:
            with self.timer.phase("verify"):
                logits = self.target.forward(self.last[:, None])
            with self.timer.phase("sample"):
                self.last = self.first_tokens(logits)
            tokens = self.last[:, None]
            accepted = torch.zeros(len(self.rows), dtype=torch.int64, device=self.device)
        else:
            proposal, tokens, accepted = self.speculate()
            with self.timer.phase("realign"):
                self.realign(tokens, accepted, proposal.num_draft)
        with self.timer.phase("schedule"):
            self.record(tokens, accepted, proposal.num_draft if self.dec.drafter is not None else None)
            self.settle()

    # --------------------------------------------------------------------------------------- phases
    def speculate(self):
        """draft, verify, sample on the current batch: (proposal, tokens [B, K+1], accepted [B])."""
        with self.timer.phase("draft"):
            proposal = narrow(self.dec.drafter.propose(self.k, self.sampling, self.generator))
        with self.timer.phase("verify"):
            logits = self.verify(proposal.tokens)
        with self.timer.phase("sample"):
            tokens, accepted = self.accept(proposal, logits)
        return proposal, tokens, accepted

    def verify(self, drafts: torch.Tensor) -> torch.Tensor:
        # Unused slots of a ragged proposal may hold -1; any valid id will do there, nothing reads its logits.
        return self.target.forward(torch.cat([self.last[:, None], drafts.clamp(min=0)], dim=1))

    def accept(self, proposal, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.sampling.do_sample:
            return sk.verify_greedy(proposal.tokens, logits, proposal.num_draft, backend=self.backend)
        return sk.rejection_sample(proposal.tokens, proposal.probs, self.sampling.probs(logits), proposal.num_draft,
                                   generator=self.generator, backend=self.backend)

    def realign(self, tokens: torch.Tensor, accepted: torch.Tensor, num_draft) -> None:
        # The target wrote w+1 columns (last, d_1..d_w; w = K unless narrowed) and keeps a_b + 1 of them.
        self.target.drop_and_align(tokens.shape[1] - 1 - accepted)
        self.dec.drafter.accept(tokens, accepted)
        self.last = tokens.gather(1, accepted[:, None]).squeeze(1)

    def first_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token from the last column's logits [B, n, V]."""
        logits = logits[:, -1]
        if self.sampling.do_sample:
            return sample(self.sampling.probs(logits), self.generator)
        return greedy(logits)

    # --------------------------------------------------------------------------------------- schedule
    def emit(self, row: int, tokens) -> None:
        out = self.out[self.rows[row]]
        for i, t in enumerate(tokens):
            out.append(t)
            eos = t in self.eos_set
            if eos or len(out) >= self.max_new:
                self.finished[row] = True
                if self.progress is not None:
                    self.progress(self.rows[row])
                if i + 1 < len(tokens):  # the block is cut: what follows is dropped
                    self.cuts["eos" if eos else "max_new_tokens"] += 1
                return

    def record(self, tokens: torch.Tensor, accepted: torch.Tensor, num_draft, rows: list[int] | None = None) -> None:
        """rows: where batch row b lives in self.rows / self.finished (default b; EXSPEC passes its pool slots)."""
        a = accepted.tolist()
        toks = tokens.tolist()
        for b, a_b in enumerate(a):
            self.emit(b if rows is None else rows[b], toks[b][:a_b + 1])
            self.accept_hist[a_b] += 1
        if self.dec.drafter is not None:
            self.drafted += int(num_draft.sum()) if num_draft is not None else self.k * len(a)
            self.accepted += sum(a)
            self.ragged_steps += int(max(a) != min(a))
        self.row_steps += len(a)

    def admit_first_batch(self) -> None:
        take = [self.waiting.pop() for _ in range(min(self.batch_size, len(self.waiting)))]
        prompts = [self.prompts[i] for i in take]
        extra = initial_room(self.max_new, self.k)  # bounded: the slabs grow as rows do
        with self.timer.within("prefill"):
            self.target, logits = RaggedKV.prefill(self.dec.target, prompts, extra, self.backend,
                                                   realign=self.dec.realign,
                                                   compact_threshold=self.dec.compact_threshold)
        self.last = self.first_tokens(logits)
        self.rows = take
        self.finished = [False] * len(take)
        if self.dec.drafter is not None:
            with self.timer.within("prefill"):
                self.dec.drafter.begin(prompts, self.last, extra_capacity=extra)
        for row, t in enumerate(self.last.tolist()):
            self.emit(row, [t])

    def prefill_new(self, prompts) -> tuple[RaggedKV, torch.Tensor]:
        """Prefill waiting prompts on their own: their right-aligned batch and each one's first token."""
        with self.timer.within("prefill"):
            src, logits = RaggedKV.prefill(self.dec.target, prompts, 0, self.backend, realign=self.dec.realign)
        return src, self.first_tokens(logits)

    def start_rows(self, rows: list[int], take: list[int], first: torch.Tensor, prompts) -> None:
        """Rows `rows` now decode prompts `take`: the drafter learns them and their first tokens are emitted."""
        if self.dec.drafter is not None:
            with self.timer.within("prefill"):
                self.dec.drafter.refill(torch.tensor(rows, dtype=torch.int64, device=self.device), prompts, first)
        for row, prompt_index, t in zip(rows, take, first.tolist()):
            self.rows[row] = prompt_index
            self.finished[row] = False
            self.emit(row, [t])

    def refill(self, rows: list[int]) -> None:
        take = [self.waiting.pop() for _ in rows]
        prompts = [self.prompts[i] for i in take]
        src, first = self.prefill_new(prompts)
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        self.target.place(index, src)
        self.last[index] = first
        self.start_rows(rows, take, first, prompts)

    def evict(self, rows: list[int]) -> None:
        gone = set(rows)
        keep_list = [r for r in range(len(self.rows)) if r not in gone]
        keep = torch.tensor(keep_list, dtype=torch.int64, device=self.device)
        self.target.select_rows(keep)
        self.last = self.last.index_select(0, keep)
        if self.dec.drafter is not None:
            self.dec.drafter.evict(keep)
        self.rows = [self.rows[r] for r in keep_list]
        self.finished = [self.finished[r] for r in keep_list]

    def settle(self) -> None:
        """Refill finished rows with waiting prompts (whose first token may finish them at once: repeat), and
        evict the finished rows nothing is waiting for."""
        while True:
            done = [r for r, f in enumerate(self.finished) if f]
            if not done:
                return
            reuse = done[:len(self.waiting)]
            if reuse:
                self.refill(reuse)
            if len(reuse) < len(done):
                self.evict(done[len(reuse):])

    # --------------------------------------------------------------------------------------- stats
    def stats(self) -> dict:
        phases = self.timer.report()
        total = sum(phases.values())
        new_tokens = sum(len(s) for s in self.out)
        return {
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
            # model forwards over new prompts (target and draft), inside "schedule": the engine's own overhead is
            # total - draft - verify - prefill
            "prefill_seconds": self.timer.inner.get("prefill", 0.0),
            "scheduler": self.dec.scheduler,
            "num_draft_tokens": self.k if self.dec.drafter is not None else 0,
            "backend": self.backend or sk.get_backend(),
            "realign": self.dec.realign,
            # realign="mask": compactions of the target's and the draft model's caches, together
            "compactions": sum(getattr(s, "compactions", 0) for s in
                               (self.target, getattr(self.dec.drafter, "state", None)) if s is not None),
            "compact_threshold": self.dec.compact_threshold,
            "eos": list(self.eos),
        }
