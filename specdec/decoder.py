"""SpeculativeDecoder: the facade over the decode loop: EQSPEC or EXSPEC as the batch source, a draft model or
another drafter, the speculation controller, and the plain autoregressive baseline.

    dec = SpeculativeDecoder(target, draft, num_draft_tokens=4, scheduler="eqspec")
    res = dec.generate(prompts, max_new_tokens=64, batch_size=8)
    res.sequences, res.stats

A target sharded by transformers' tensor-parallel plan (loaded with tp_plan / DistributedConfig under
torch.distributed) is detected: every rank makes the same calls, rank 0 decides, the others follow
(specdec.scheduling.distributed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import specdec_kernels as sk

from .drafting.base import Drafter
from .drafting.model import ModelDrafter
from .kv.geometry import model_device, output_vocab, parameter_count
from .kv.ragged import REALIGN_MODES, check_compact_threshold
from .sampling import SamplingConfig, check_scoring
from .scheduling.control import SpeculationController
from .scheduling.distributed import TensorParallelRanks, check_placement, fingerprint, guarded
from .scheduling.eqspec import EqspecSource
from .scheduling.exspec import ExspecSource
from .scheduling.loop import DecodeLoop
from .timing import PhaseTimer
from .validation import check_attention, check_models, check_progress, check_seed, encode_prompts, eos_ids

SCHEDULERS = ("eqspec", "exspec", "autoregressive")


@dataclass
class GenerationResult:
    sequences: list[list[int]]
    stats: dict = field(default_factory=dict)
    texts: list[str] | None = None


class SpeculativeDecoder:
    """Batch speculative decoding on a Hugging Face causal LM.

    Args:
        target: the model whose output is reproduced (greedy: token for token; sampling: in distribution).
        draft: a draft model (same vocabulary), a drafter object (specdec.drafting, e.g. NgramDrafter), or None
            for scheduler="autoregressive".
        num_draft_tokens: K, the most drafts per row in one step.
        scheduler: "eqspec" (a static batch, realigned every step), "exspec" (a pool stepped in groups of
            equal length) or "autoregressive" (plain batched decoding, the baseline).
        adaptive: let the speculation controller (specdec.scheduling.control) choose each step's verify width
            and draft counts from measured costs and acceptance, down to plain decoding where speculation does
            not pay; False: always K drafts (fewer only where the drafter has fewer). Output is exact either way.
            With sampling, a fixed seed fixes the output for a fixed sequence of widths; the controller's widths
            follow measured timings, so pass adaptive=False for bit-for-bit repeatable samples.
        controller: a SpeculationController to use instead of a new one (shared knowledge of costs, or a
            scripted one in tests).
        backend: specdec_kernels backend for the engine's ops (default: the process-wide choice).
        realign: "shift" | "mask" | "paper" (specdec.kv.ragged); compact_threshold: realign="mask"'s threshold.
        window: EXSPEC's pool size, the number of unfinished prompts it picks each step's group from.
        sync_timers: synchronise the device at phase boundaries (default: on CUDA).
        tp_timeout: a tensor-parallel target's ranks wait this many seconds (default 120) in a collective
            of their own before a stuck rank ends the run with an error.
    """

    def __init__(self, target, draft=None, num_draft_tokens: int = 4, scheduler: str = "eqspec",
                 backend: str | None = None, tokenizer=None, sync_timers: bool | None = None,
                 realign: str = "shift", compact_threshold: float | None = None, window: int = 32,
                 adaptive: bool = True, controller: SpeculationController | None = None,
                 tp_timeout: float | None = None):
        if not isinstance(realign, str) or realign not in REALIGN_MODES:
            raise ValueError(f"realign must be one of {REALIGN_MODES}, got {realign!r}")
        self.compact_threshold = check_compact_threshold(compact_threshold)
        if not isinstance(scheduler, str) or scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be an int >= 1, got {num_draft_tokens!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if not isinstance(adaptive, bool):
            raise ValueError(f"adaptive must be True or False, got {adaptive!r}")
        if controller is not None and not isinstance(controller, SpeculationController):
            raise ValueError(f"controller must be a SpeculationController, got {type(controller).__name__}")
        if backend is not None:
            reason = sk.unavailable_reason(backend)  # ValueError for an unknown name
            if reason and backend != "auto":
                raise RuntimeError(f"backend {backend!r} is not available: {reason}")
        check_attention(target, "target")  # sliding windows, flash attention: refused before any forward
        check_placement(target, "target")  # a pipeline split (device_map over devices) is refused
        self.target = target
        self.scheduler = scheduler
        self.k = num_draft_tokens
        self.backend = backend
        self.tokenizer = tokenizer
        self.sync_timers = sync_timers
        self.realign = realign
        self.window = window
        self.adaptive = adaptive
        self.device = model_device(target)
        if scheduler == "autoregressive":
            self.drafter = None
        elif draft is None:
            raise ValueError(f"scheduler={scheduler!r} needs a draft model or drafter")
        elif isinstance(draft, torch.nn.Module):
            check_models(target, draft)
            self.drafter = ModelDrafter(draft)
        elif isinstance(draft, Drafter):
            if isinstance(getattr(draft, "kv_model", None), torch.nn.Module):  # a drafter over a model
                check_models(target, draft.kv_model)
            if getattr(draft, "writes_target", False) and getattr(draft, "target", None) is not target:
                raise ValueError(f"{type(draft).__name__} drafts with its own target's layers and cache: build it "
                                 "on the target this decoder verifies with")
            self.drafter = draft
        else:
            raise ValueError(f"draft must be a causal LM or a drafter (start/offer/propose/commit/finish, see "
                             f"specdec.drafting.base), got {type(draft).__name__}")
        self.vocab_size = output_vocab(target)
        self.controller = None
        if self.drafter is not None:
            kv_model = getattr(self.drafter, "kv_model", None)
            if kv_model is not None:
                check_placement(kv_model, "draft")
            costed = kv_model if kv_model is not None else getattr(self.drafter, "cost_model", None)
            ratio = parameter_count(costed) / parameter_count(target) if costed is not None else None
            first = getattr(self.drafter, "first_columns", 2)  # columns per row of a draft model's first forward
            self.controller = controller or SpeculationController(self.k, draft_cost_ratio=ratio, enabled=adaptive,
                                                                  draft_first_columns=first)
        # Last, once every check passed on every rank alike: building the ranks' control group is a collective.
        self.ranks = TensorParallelRanks.for_model(target, tp_timeout)

    def generate(self, prompts, max_new_tokens: int = 64, batch_size: int = 8, eos_token_id=None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None, progress=None, scoring=None, observer=None) -> GenerationResult:
        """Generate for every prompt; see GenerationResult. eos_token_id: an id, a list of ids, or None for
        the target's generation_config.eos_token_id (what target.generate would use); [] disables EOS.
        progress: optional callable, called with a prompt's index when that prompt is finished.
        scoring: what every distribution is decoded from instead of do_sample/temperature/top_k/top_p (left at
        their defaults then): an object with do_sample, process(logits, prefixes) and probs(logits, prefixes)
        (specdec.sampling), e.g. specdec.processing.ProcessorScoring for transformers logits processors.
        observer: sees the kept tokens (and, if it asks, the scores they came from): see specdec.scheduling.loop."""
        ids = encode_prompts(prompts, self.tokenizer, self.target, max_new_tokens, batch_size)
        sampling = SamplingConfig(do_sample, temperature, top_k, top_p)
        if scoring is not None:
            if sampling != SamplingConfig():
                raise ValueError("pass either scoring or do_sample/temperature/top_k/top_p, not both")
            check_scoring(scoring)
            sampling = scoring
        eos = eos_ids(eos_token_id, self.target, self.vocab_size)
        seed = check_seed(seed)
        check_progress(progress)
        max_new_tokens, batch_size = int(max_new_tokens), int(batch_size)
        if self.ranks is not None:  # one seed on every rank (rank 0's), and a check that all got this call
            self.ranks.reset_stats()
            seed = self.ranks.agree_start(seed, fingerprint(ids, max_new_tokens, batch_size, eos, do_sample,
                                                            temperature, top_k, top_p, self.scheduler, self.k,
                                                            self.realign, self.window, self.adaptive,
                                                            type(self.controller).__name__))
        generator = torch.Generator(device=self.device)
        if seed is not None:
            generator.manual_seed(seed)
        else:
            generator.seed()
        timer = PhaseTimer(self.device, self.sync_timers)
        if self.controller is not None:
            self.controller.begin_run()
        draft_model = getattr(self.drafter, "kv_model", None)
        out: list[list[int]] = [[] for _ in ids]
        if self.scheduler == "exspec":
            # a drafter that drafts in the target's lane writes up to K columns there before the verify forward
            room = self.k if getattr(self.drafter, "writes_target", False) else 0
            source = ExspecSource(self.target, draft_model, batch_size, max_new_tokens, self.k, self.backend,
                                  self.realign, self.window, ids, out, timer, draft_room=room)
        else:
            source = EqspecSource(self.target, draft_model, batch_size, max_new_tokens, self.k, self.backend,
                                  self.realign, self.compact_threshold)
        loop = DecodeLoop(target=self.target, source=source, drafter=self.drafter, controller=self.controller,
                          prompts=ids, max_new=max_new_tokens, eos=eos, sampling=sampling, generator=generator,
                          backend=self.backend, timer=timer, k=self.k, progress=progress, observer=observer)
        loop.out = out
        loop.ranks = self.ranks
        with torch.no_grad(), guarded(self.ranks):
            loop.run()
        stats = loop.stats()
        if self.ranks is not None:
            stats["tensor_parallel"] = self.ranks.stats()
        stats.update({
            "scheduler": self.scheduler,
            "num_draft_tokens": self.k if self.drafter is not None else 0,
            "backend": self.backend or sk.get_backend(),
            "realign": self.realign,
            "compact_threshold": self.compact_threshold,
        })
        result = GenerationResult(loop.out, stats)
        if self.tokenizer is not None:
            result.texts = [self.tokenizer.decode(s) for s in loop.out]
        return result
