"""ProcessorScoring: a scoring (specdec.sampling's interface) made of transformers logits processors, applied to
every distribution of a block with that position's own prefix, so speculation stays exact with them.

A verified block is [B, w, V]: position j of row b follows the row's prompt, its tokens so far and its first j
drafts (specdec.sampling.Prefixes). Plain decoding would have called each processor once per position with that
prefix; the stages below reproduce those calls on the flattened [B * w, V] block:

    row-wise       processors that read only the scores (temperature, top-k, top-p, min-p, typical, epsilon, eta,
                   top-h, suppress_tokens, renormalisation, inf/nan removal): one call on the block is exact.
    ids            processors that read only the prefix's ids, through transformers' own classes on a [B * w, W]
                   matrix holding each position's prefix, right-aligned: no-repeat n-grams and bad words /
                   sequence bias (padding -1 matches no token, and the rules only look at suffixes), repetition
                   penalty (padding replaced by a token of the same row: the penalty depends only on which ids
                   occur; so do 1-gram bans). Built on the device from the rows' histories and the drafts; no
                   device-to-host read.
    lengths        min_length, min_new_tokens and begin_suppress_tokens from a generation config: one mask from the
                   per-position lengths (host ints), vectorised, with transformers' semantics.
    each           anything else (a user's own processor): called once per (row, position) with that position's
                   exact [1, L] prefix, the row's own prompt without padding plus its tokens and drafts. Slow (a host
                   loop over B * w positions), and when the block has drafts it reads them back to the host: one
                   device sync per scoring call (the verification, and each draft position after the first).

Processors run in the order of the list (build it with transformers' own `_get_logits_processor`, as
specdec.hf_generate does, for transformers' order). A processor must be a pure function of (input_ids, scores):
under speculation it is called for drafted and rejected positions too, on the draft model's logits as well.
"""

from __future__ import annotations

import array
from typing import Sequence

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper, EtaLogitsWarper, InfNanRemoveLogitsProcessor, LogitNormalization, LogitsProcessorList,
    MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor, MinPLogitsWarper, NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor, TemperatureLogitsWarper, TopHLogitsWarper,
    TopKLogitsWarper, TopPLogitsWarper, TypicalLogitsWarper)

from .sampling import Prefixes

# Exact types (a subclass may override __call__): their __call__ reads the scores only, row by row.
ROW_WISE = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, TypicalLogitsWarper,
            EpsilonLogitsWarper, EtaLogitsWarper, TopHLogitsWarper, LogitNormalization, InfNanRemoveLogitsProcessor,
            SuppressTokensLogitsProcessor)
# Read only suffixes of the ids (n-grams ending at the position, sequences completed by the next token).
SUFFIX_RULES = (NoRepeatNGramLogitsProcessor, SequenceBiasLogitsProcessor, NoBadWordsLogitsProcessor)
# Built by generate from a config and read lengths in its padded frame; reimplemented per position here.
LENGTH_RULES = (MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor, SuppressTokensAtBeginLogitsProcessor)


class ProcessorScoring:
    """A scoring (do_sample, process, probs) from a LogitsProcessorList.

    Args:
        processors: the processors, in the order they apply.
        do_sample: sample from softmax(process(...)), or take its argmax.
        user: the processors that came from the caller (a user's LogitsProcessorList). Their length-reading
            instances go through the per-position call with the row's own prefix (their lengths mean what they
            mean there); the same classes built from a generation config use `frame_length`.
        frame_length: the prompt length a generation config's min_length counts (model.generate counts a padded
            batch's common width, padding included); None: each row's own prompt length, as on that prompt alone.
            min_new_tokens and begin_suppress_tokens count new tokens, which no padding changes.
    """

    def __init__(self, processors: Sequence | None = None, do_sample: bool = False, *, user: Sequence = (),
                 frame_length: int | None = None):
        if not isinstance(do_sample, bool):
            raise ValueError(f"do_sample must be True or False, got {do_sample!r}")
        if frame_length is not None and (isinstance(frame_length, bool) or not isinstance(frame_length, int)
                                         or frame_length < 0):
            raise ValueError(f"frame_length must be None or an int >= 0, got {frame_length!r}")
        self.do_sample = do_sample
        self.frame_length = frame_length
        processors = list(processors or [])
        for p in processors:
            if not callable(p):
                raise ValueError(f"a logits processor must be callable as processor(input_ids, scores), got {p!r}")
        self.processors = LogitsProcessorList(processors)
        self.stages = [_stage(p, any(p is u for u in user)) for p in processors]
        self.needs_ids = any(kind != "rows" for kind, _ in self.stages)
        self._cache: tuple | None = None  # the last block's histories on the device (reused within a step)

    def __repr__(self) -> str:
        kinds = ", ".join(f"{type(p).__name__}:{kind}" for p, (kind, _) in zip(self.processors, self.stages))
        return f"ProcessorScoring(do_sample={self.do_sample}, [{kinds}])"

    def describe(self) -> list[tuple[str, str]]:
        """(processor class, stage) in order; stage is "rows", "ids", "filled", "lengths" or "each"."""
        return [(type(p).__name__, kind) for p, (kind, _) in zip(self.processors, self.stages)]

    def process(self, logits: torch.Tensor, prefixes: Prefixes | None = None) -> torch.Tensor:
        """float32 scores of the same shape ([B, V] or [B, w, V]) after every processor, each position with its
        own prefix."""
        single = logits.ndim == 2
        block = logits[:, None] if single else logits
        b, w, v = block.shape
        scores = block.float().reshape(b * w, v)
        if self.stages:
            ctx = _Block(self, prefixes, b, w, scores.device) if self.needs_ids else None
            for kind, fn in self.stages:
                scores = fn(ctx, scores)
        scores = scores.reshape(b, w, v)
        return scores[:, 0] if single else scores

    def probs(self, logits: torch.Tensor, prefixes: Prefixes | None = None) -> torch.Tensor:
        return self.process(logits, prefixes).softmax(dim=-1)

    # ------------------------------------------------------------------------------------------- histories
    def _device_histories(self, hist: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, Lh] the histories right-aligned on the device, -1 before them; [B] each row's first token).
        Within a step the draft positions and the verification score the same histories: the last ones are
        kept, so a step copies them to the device once (host to device, no sync)."""
        key = (hist, device)  # compared by content: a scoring object may serve several runs
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1], self._cache[2]
        width = max(len(h) for h in hist)
        # one host tensor, one copy: column 0 holds each row's first token, the rest the right-aligned rows
        # (through array.array: torch.tensor on nested lists costs ~10x more per id)
        flat = array.array("q")
        for h in hist:
            flat.append(h[0])
            flat.extend([-1] * (width - len(h)))
            flat.extend(h)
        rows = torch.frombuffer(flat, dtype=torch.int64).view(len(hist), width + 1)
        rows = rows.to(device, non_blocking=True) if rows.device != torch.device(device) else rows.clone()
        right, first = rows[:, 1:], rows[:, 0]
        self._cache = (key, right, first)
        return right, first


class _Block:
    """What the stages of one process() call share, built lazily: per-position lengths and prefix matrices."""

    def __init__(self, scoring: ProcessorScoring, prefixes: Prefixes | None, b: int, w: int, device):
        if prefixes is None or prefixes.history is None:
            raise ValueError("these logits processors read the tokens so far: pass Prefixes with a history")
        extra_width = prefixes.offset + w - 1
        if extra_width > 0 and (prefixes.extra is None or prefixes.extra.shape[1] < extra_width):
            raise ValueError(f"Prefixes.extra must hold offset + w - 1 = {extra_width} drafts per row")
        self.scoring, self.prefixes, self.b, self.w, self.device = scoring, prefixes, b, w, device
        self.extra_width = extra_width
        self.hist = [list(prefixes.history(s)) for s in prefixes.seqs]
        self._devices = self._right = self._filled = self._host = None
        # prefix length of position j of row b (host ints): history, then offset + j drafts
        self.lengths = [len(h) + prefixes.offset + j for h in self.hist for j in range(w)]

    def new_counts(self) -> list[int]:
        """Tokens generated before each position (the drafts before it count: plain decoding had emitted them)."""
        if self.prefixes.prompt_length is None:
            raise ValueError("min_new_tokens and the like need Prefixes.prompt_length")
        prompts = [self.prefixes.prompt_length(s) for s in self.prefixes.seqs]
        return [n - prompts[r // self.w] for r, n in enumerate(self.lengths)]

    def frame_lengths(self) -> list[int]:
        """Each position's length in the frame a generation config's min_length counts (see frame_length)."""
        frame = self.scoring.frame_length
        if frame is None:
            return self.lengths
        return [frame + n for n in self.new_counts()]

    def _on_device(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._devices is None:
            self._devices = self.scoring._device_histories(self.hist, self.device)
        return self._devices

    @property
    def hist_right(self) -> torch.Tensor:
        """[B, Lh]: the histories right-aligned on the device, -1 before them."""
        return self._on_device()[0]

    @property
    def first(self) -> torch.Tensor:
        """[B]: each row's first token (on the device)."""
        return self._on_device()[1]

    def right(self) -> torch.Tensor:
        """int64 [B * w, W]: position (b, j)'s prefix right-aligned, -1 before it. Unused draft slots (-1 in a
        ragged proposal) become 0 so that every id inside a prefix is valid; only positions past a row's drafts
        see them, and nothing reads those positions' scores."""
        if self._right is None:
            hist = self.hist_right
            if self.extra_width:
                drafts = self.prefixes.extra[:, :self.extra_width].to(hist.device).clamp(min=0)
                full = torch.cat([hist, drafts], dim=1)
            else:
                full = hist
            if self.w == 1:  # one position per row (a draft position, a first token): full is its prefix
                self._right = full
                return full
            width = full.shape[1]
            shift = (self.extra_width - self.prefixes.offset - torch.arange(self.w, device=full.device))
            index = torch.arange(width, device=full.device)[None, :] - shift[:, None]  # [w, W]
            gathered = full[:, index.clamp(min=0)]  # [B, w, W]
            self._right = torch.where(index[None] >= 0, gathered, -1).reshape(self.b * self.w, width)
        return self._right

    def filled(self) -> torch.Tensor:
        """right() with its padding replaced by the row's first token: the same set of ids per position."""
        if self._filled is None:
            right = self.right()
            first = self.first.repeat_interleave(self.w)[:, None]
            self._filled = torch.where(right < 0, first, right)
        return self._filled

    def host_prefixes(self) -> list[list[int] | None]:
        """Each position's exact prefix as host ints; None where it holds an unused draft slot. Reading the
        drafts is a device-to-host copy (a sync)."""
        if self._host is None:
            drafts = self.prefixes.extra[:, :self.extra_width].tolist() if self.extra_width else None
            out = []
            for b, h in enumerate(self.hist):
                for j in range(self.w):
                    d = drafts[b][:self.prefixes.offset + j] if drafts is not None else []
                    out.append(None if any(t < 0 for t in d) else h + d)
            self._host = out
        return self._host


def _stage(p, from_user: bool):
    kind = type(p)
    if kind in ROW_WISE:
        return "rows", lambda ctx, s: p(_no_ids(s), s)
    if kind is NoRepeatNGramLogitsProcessor and p.ngram_size == 1:
        # 1-grams ban every id of the prefix (their empty key matches padding too): a set rule, like the penalty
        return "filled", lambda ctx, s: p(ctx.filled(), s)
    if kind in SUFFIX_RULES:
        return "ids", lambda ctx, s: p(ctx.right(), s)
    if kind is RepetitionPenaltyLogitsProcessor and (not from_user or p.prompt_ignore_length is None):
        # Built by generate, it ignores a padded batch's left padding; these prefixes hold no padding at all.
        fresh = RepetitionPenaltyLogitsProcessor(p.penalty)
        return "filled", lambda ctx, s: fresh(ctx.filled(), s)
    if kind in LENGTH_RULES and not from_user:
        return "lengths", _length_rule(p)
    return "each", lambda ctx, s: _each(p, ctx, s)


def _no_ids(scores: torch.Tensor) -> torch.Tensor:
    return scores.new_zeros((scores.shape[0], 0), dtype=torch.int64)


def _length_rule(p):
    """One of LENGTH_RULES as a per-position mask: where the rule fires, its tokens get -inf (what the class does
    to a whole batch whose length is that position's)."""
    if isinstance(p, MinLengthLogitsProcessor):
        tokens, fires = p.eos_token_id, lambda ctx: [n < p.min_length for n in ctx.frame_lengths()]
    elif isinstance(p, MinNewTokensLengthLogitsProcessor):
        tokens, fires = p.eos_token_id, lambda ctx: [n < p.min_new_tokens for n in ctx.new_counts()]
    else:  # SuppressTokensAtBeginLogitsProcessor: generate sets begin_index to the first new token's position
        tokens, fires = p.begin_suppress_tokens, lambda ctx: [n == 0 for n in ctx.new_counts()]

    def apply(ctx: _Block, scores: torch.Tensor) -> torch.Tensor:
        rows = fires(ctx)
        if not any(rows):
            return scores
        vocab = torch.arange(scores.shape[-1], device=scores.device)
        banned = torch.isin(vocab, torch.as_tensor(tokens).to(scores.device))
        where = torch.tensor(rows, dtype=torch.bool).to(scores.device, non_blocking=True)
        return torch.where(where[:, None] & banned[None, :], -float("inf"), scores)

    return apply


def _each(p, ctx: _Block, scores: torch.Tensor) -> torch.Tensor:
    """The processor once per position with its exact [1, L] prefix (positions holding an unused draft slot are
    left as they are: nothing reads them)."""
    rows = []
    for r, prefix in enumerate(ctx.host_prefixes()):
        row = scores[r:r + 1]
        if prefix is not None:
            ids = torch.tensor([prefix], dtype=torch.int64).to(scores.device, non_blocking=True)
            row = p(ids, row.clone())
        rows.append(row)
    return torch.cat(rows, dim=0)


# Generation-config options for which model.generate adds a processor that is not reproduced here: refused.
REFUSED_PROCESSOR_OPTIONS = {
    "guidance_scale": (lambda v: v is not None and v != 1, "classifier-free guidance (it runs the model a second "
                                                            "time per step, on an unconditional prompt)"),
    "forced_bos_token_id": (lambda v: v is not None, "forcing a first token"),
    "forced_eos_token_id": (lambda v: v is not None, "forcing EOS at max_length"),
    "exponential_decay_length_penalty": (lambda v: v is not None, "an exponential length penalty"),
    "encoder_repetition_penalty": (lambda v: v not in (None, 1.0), "an encoder-decoder option"),
    "encoder_no_repeat_ngram_size": (lambda v: v not in (None, 0), "an encoder-decoder option"),
    "watermarking_config": (lambda v: v is not None, "watermarking"),
}


def check_processor_options(config) -> None:
    """ValueError naming the first generation-config option whose processor is not supported."""
    for name, (refused, what) in REFUSED_PROCESSOR_OPTIONS.items():
        value = getattr(config, name, None)
        if refused(value):
            raise ValueError(f"{name}={value!r} is not supported by specdec ({what})")


def build_processors(model, config, logits_processor=None, *, input_length: int = 1,
                     attention_mask: torch.Tensor | None = None) -> LogitsProcessorList:
    """transformers' own processor list for a merged, prepared generation config (special tokens set): the same
    classes, parameters and order model.generate would use, the caller's processors merged in as it merges them."""
    check_processor_options(config)
    return model._get_logits_processor(
        generation_config=config, input_ids_seq_length=max(1, int(input_length)),
        logits_processor=logits_processor if logits_processor is not None else LogitsProcessorList(),
        device=next(model.parameters()).device,
        model_kwargs={"attention_mask": attention_mask} if attention_mask is not None else {})


def from_generation_config(model, generation_config=None, logits_processor=None, *, frame_length: int | None = None,
                           **kwargs) -> ProcessorScoring:
    """The scoring model.generate would decode with for these options (model.generation_config as the base,
    `generation_config` and kwargs over it, merged as transformers merges them), for SpeculativeDecoder.generate:

        scoring = from_generation_config(model, do_sample=True, top_k=20, repetition_penalty=1.2)
        SpeculativeDecoder(model, draft).generate(prompts, scoring=scoring, seed=0)

    Only options that shape the distributions are taken (lengths, EOS and the rest are the decoder's)."""
    config, unused = model._prepare_generation_config(generation_config, **kwargs)
    if unused:
        raise ValueError(f"not generation options: {', '.join(sorted(unused))}")
    model._prepare_special_tokens(config, True, device=next(model.parameters()).device)
    processors = build_processors(model, config, logits_processor)
    return ProcessorScoring(processors, bool(config.do_sample), user=list(logits_processor or []),
                            frame_length=frame_length)
