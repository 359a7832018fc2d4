"""specdec.generate: model.generate's inputs and outputs for decoder-only models, decoded by the engine.

    out = model.generate(**batch, assistant_model=draft)              # transformers: batch size 1 only
    out = specdec.generate(model, **batch, assistant_model=draft)     # the same tensor, at any batch size

In: a tokenizer's padded batch (input_ids [B, P] and its attention_mask; left or right padding, told apart by the
mask: each row's real tokens are its one run of ones), a GenerationConfig and/or generation kwargs merged over
model.generation_config exactly as transformers merges them, a LogitsProcessorList, a streamer.
assistant_model=: a draft model; prompt_lookup_num_tokens=K: the prompt-lookup n-gram drafter with K drafts;
assistant_early_exit=L: self-speculation, the model's own first L layers drafting over its own cache
(specdec.drafting.early_exit; transformers' meaning: those layers, then the final norm and head); none of them:
plain decoding through the engine. Engine options as keyword arguments, with the engine's defaults:
scheduler, realign, backend, batch_size, adaptive, num_draft_tokens (K for a draft model; else an explicit
num_assistant_tokens, else 4), window, compact_threshold, and seed (sampling; default: drawn from torch's global
generator, so torch.manual_seed makes a run repeatable as it does for model.generate).

Out: what model.generate returns on that batch: the LongTensor input_ids as given followed by the new tokens,
rows that finished early padded with pad_token_id to the longest; with return_dict_in_generate=True a
GenerateDecoderOnlyOutput whose scores / logits (output_scores / output_logits) hold, per emitted token, the
processed / raw target distribution it was chosen from (float32 [B, V] per step). Where a row had already
finished, its entry is -inf everywhere but 0 at pad_token_id (all mass on the pad its sequence holds there), so
compute_transition_scores gives it 0. `cache` is None: the engine's KV cache is its own.

Semantics (greedy output equals model.generate on each prompt alone, token for token):
- lengths follow the padded batch: max_length and min_length count the batch's width P (max_new_tokens =
  max_length - P for every row), as model.generate does on that batch;
- logits processors see each row's own tokens: built-in rules (repetition penalty, no-repeat n-grams, bad words)
  never see padding (on a left-padded batch model.generate's n-gram and bad-word rules can match across padding;
  here they follow the prompt alone), and a user's own processor is called once per (row, position) with that
  position's prefix, [1, L], without padding (specdec.processing);
- right padding: each row continues after its real prompt (model.generate would continue after the padding);
  the returned rows still start with the input_ids as given;
- num_return_sequences > 1 (sampling) repeats each prompt, as model.generate does.

Cost: transformers' built-in processors run vectorised on the device (specdec.processing): per step the rows'
histories are copied to the device once and nothing is read back. A processor of the caller's own class is
called once per (row, position), on the host, and reads the drafts back: one extra device sync per verification
and per draft position after the first.

Refused with a ValueError naming the option, before any forward: beam and group beam search, contrastive search,
constrained decoding, DoLa, output_attentions / output_hidden_states, stop_strings, max_time, stopping_criteria,
prefix_allowed_tokens_fn, classifier-free guidance, forced BOS/EOS, the exponential length penalty,
watermarking, lossy assistants, streaming at batch > 1, and any argument model.generate would hand to
the model's forward (there is no such passage here). Options that only tune transformers' own caching,
compilation or assisted-generation schedule (cache_implementation, compile_config, num_assistant_tokens_schedule,
assistant_confidence_threshold, ...) do not change the output and are ignored: the engine keeps its own cache and
its controller picks the widths.
"""

from __future__ import annotations

import weakref

import torch
from transformers import GenerationConfig
from transformers.generation.streamers import TextStreamer
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .decoder import SpeculativeDecoder
from .drafting.early_exit import EarlyExitDrafter
from .drafting.ngram import NgramDrafter
from .processing import ProcessorScoring, build_processors
from .validation import encode_prompts

# Engine options taken from the keyword arguments (SpeculativeDecoder's and its generate's), engine defaults.
ENGINE_OPTIONS = ("scheduler", "realign", "backend", "batch_size", "adaptive", "num_draft_tokens", "window",
                  "compact_threshold", "seed")
DEFAULT_DRAFTS = 4

# model.generate's own arguments that have no counterpart here: refused unless None (synced_gpus: unless False)
GENERATE_ARGUMENTS = {
    "inputs": "pass the prompt as input_ids",
    "stopping_criteria": "custom stopping criteria are not supported (max_new_tokens, max_length and EOS are)",
    "prefix_allowed_tokens_fn": "constrained decoding is not supported",
    "synced_gpus": "not supported",
    "negative_prompt_ids": "classifier-free guidance is not supported",
    "negative_prompt_attention_mask": "classifier-free guidance is not supported",
    "custom_generate": "not supported",
    "assistant_tokenizer": "the draft must share the target's vocabulary",
    "tokenizer": "only stop_strings and token healing need it, and neither is supported",
}

# Merged generation-config options that select a decoding mode the engine does not have.
REFUSED_OPTIONS = {
    "num_beams": (lambda v: v not in (None, 1), "beam search"),
    "num_beam_groups": (lambda v: v not in (None, 1), "group beam search"),
    "diversity_penalty": (lambda v: v not in (None, 0.0), "group beam search"),
    "penalty_alpha": (lambda v: v not in (None, 0.0), "contrastive search"),
    "constraints": (lambda v: v is not None, "constrained beam search"),
    "force_words_ids": (lambda v: v is not None, "constrained beam search"),
    "dola_layers": (lambda v: v is not None, "DoLa decoding"),
    "output_attentions": (lambda v: bool(v), "the engine returns no attention weights"),
    "output_hidden_states": (lambda v: bool(v), "the engine returns no hidden states"),
    "max_time": (lambda v: v is not None, "a wall-clock limit would make the output depend on timing"),
    "stop_strings": (lambda v: v is not None, "stop strings"),
    "token_healing": (lambda v: bool(v), "token healing"),
    "use_mtp": (lambda v: bool(v), "multi-token-prediction drafting"),
    "speculation_type": (lambda v: v is not None, "transformers' own speculation variants"),
    "assistant_ensemble_weight": (lambda v: v is not None, "lossy target/draft ensembles"),
}


def generate(model, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None, *,
             assistant_model=None, prompt_lookup_num_tokens: int | None = None,
             generation_config: GenerationConfig | None = None, logits_processor=None, streamer=None, **kwargs):
    """model.generate for a decoder-only model, through the engine: see the module's docstring."""
    engine = {name: kwargs.pop(name) for name in ENGINE_OPTIONS if name in kwargs}
    for name, why in GENERATE_ARGUMENTS.items():
        value = kwargs.pop(name, None)
        if value is not None and not (name == "synced_gpus" and value is False):
            raise ValueError(f"{name} is not supported by specdec.generate: {why}")
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("specdec.generate decodes decoder-only models; this model is an encoder-decoder")
    if prompt_lookup_num_tokens is not None:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
    explicit_k = _explicit(model, generation_config, kwargs, "num_assistant_tokens")
    has_default_max_length = _explicit(model, generation_config, kwargs, "max_length") is None
    has_default_min_length = _explicit(model, generation_config, kwargs, "min_length") is None

    config, unused = model._prepare_generation_config(generation_config, **kwargs)
    if unused:
        raise ValueError(f"specdec.generate does not support the argument(s) {', '.join(sorted(unused))}: "
                         "they are neither generation options nor engine options (model inputs other than "
                         "input_ids and attention_mask cannot be passed)")
    _check_options(config)
    ids = _check_input_ids(input_ids)
    batch, width = ids.shape
    model._prepare_special_tokens(config, attention_mask is not None, device=ids.device, batch_size=batch)
    if attention_mask is None:  # inferred from the pad token where transformers infers it, else all ones
        attention_mask = model._prepare_attention_mask_for_generation(ids, config, {})
    prompts = _strip_padding(ids, attention_mask)
    copies = int(config.num_return_sequences or 1)
    if copies > 1:  # transformers' validate already refused this for greedy decoding
        prompts = [p for p in prompts for _ in range(copies)]
        ids = ids.repeat_interleave(copies, dim=0)
        attention_mask = attention_mask.repeat_interleave(copies, dim=0)
    config = model._prepare_generated_length(
        generation_config=config, has_default_max_length=has_default_max_length,
        has_default_min_length=has_default_min_length, model_input_name="input_ids", input_ids_length=width,
        inputs_tensor=ids)
    model._validate_generated_length(config, width, has_default_max_length)
    max_new = int(config.max_length) - width

    processors = build_processors(model, config, logits_processor, input_length=width, attention_mask=attention_mask)
    scoring = ProcessorScoring(processors, bool(config.do_sample), user=list(logits_processor or []),
                               frame_length=width)
    eos = [] if config._eos_token_tensor is None else [int(t) for t in config._eos_token_tensor.reshape(-1).tolist()]
    pad = None if config._pad_token_tensor is None else int(config._pad_token_tensor)

    decoder = _decoder(model, assistant_model, config, engine, explicit_k)
    batch_size = engine.get("batch_size", 8)
    encode_prompts(prompts, None, model, max_new, batch_size)  # every prompt check, before the streamer sees one
    seed = engine.get("seed")
    if seed is None and config.do_sample:
        seed = int(torch.randint(0, 2 ** 63 - 1, (), dtype=torch.int64))
    collector = _Collector(len(prompts), streamer, bool(config.output_scores), bool(config.output_logits))
    if streamer is not None:
        if len(prompts) > 1:
            if isinstance(streamer, TextStreamer):
                streamer.put(ids.cpu())  # transformers' own error: "TextStreamer only supports batch size 1"
            raise ValueError(f"specdec.generate streams at batch size 1 only, got {len(prompts)} sequences")
        streamer.put(ids.cpu())  # the prompt first, as transformers does
    try:
        result = decoder.generate(prompts, max_new_tokens=max_new, batch_size=batch_size, eos_token_id=eos,
                                  seed=seed, scoring=scoring, observer=collector)
    finally:
        if streamer is not None:
            streamer.end()

    sequences = _pad_sequences(ids, result.sequences, pad)
    if not config.return_dict_in_generate:
        return sequences
    steps = sequences.shape[1] - width
    device = next(model.parameters()).device
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=collector.stacked(collector.processed, steps, pad, device) if config.output_scores else None,
        logits=collector.stacked(collector.raw, steps, pad, device) if config.output_logits else None)


def _explicit(model, generation_config, kwargs, name):
    """The value of an option the caller (or the model's generation_config) set, None where it was left unset."""
    for source in (kwargs, generation_config, model.generation_config):
        value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
        if value is not None:
            return value
    return None


def _check_options(config) -> None:
    for name, (refused, what) in REFUSED_OPTIONS.items():
        value = getattr(config, name, None)
        if refused(value):
            raise ValueError(f"{name}={value!r} is not supported by specdec.generate ({what})")


def _check_input_ids(input_ids) -> torch.Tensor:
    if input_ids is None:
        raise ValueError("specdec.generate needs input_ids (a [batch, length] tensor of token ids)")
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.is_floating_point() \
            or input_ids.dtype == torch.bool or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a non-empty 2-D integer tensor [batch, length], got {shape}")
    return input_ids.long()


def _strip_padding(ids: torch.Tensor, mask) -> list[list[int]]:
    """Each row's real tokens: the one run of ones in its attention-mask row (left or right padding)."""
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(ids.shape):
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"attention_mask must be a tensor shaped like input_ids {tuple(ids.shape)}, got {shape}")
    rows, masks = ids.tolist(), mask.tolist()
    prompts = []
    for b, (row, m) in enumerate(zip(rows, masks)):
        if any(v not in (0, 1) for v in m):
            raise ValueError(f"attention_mask row {b} must hold only 0 and 1")
        ones = [i for i, v in enumerate(m) if v]
        if not ones:
            raise ValueError(f"row {b} of the batch is all padding (its attention_mask has no 1)")
        if ones[-1] - ones[0] + 1 != len(ones):
            raise ValueError(f"attention_mask row {b} has padding between tokens; only left or right padding is "
                             "supported")
        prompts.append(row[ones[0]:ones[-1] + 1])
    return prompts


def _decoder(model, assistant_model, config, engine: dict, explicit_k) -> SpeculativeDecoder:
    lookup, early = config.prompt_lookup_num_tokens, config.assistant_early_exit
    given = [name for name, v in (("assistant_model", assistant_model), ("prompt_lookup_num_tokens", lookup),
                                  ("assistant_early_exit", early)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"pass one drafter, not {' and '.join(given)}")
    k = engine.get("num_draft_tokens")
    if early is not None:
        try:
            draft = EarlyExitDrafter(model, early)
        except ValueError as e:
            raise ValueError(f"assistant_early_exit={early!r}: {e}") from None
        if k is None:
            k = explicit_k if explicit_k is not None else DEFAULT_DRAFTS
    elif lookup is not None:
        if k is not None and k != lookup:
            raise ValueError(f"num_draft_tokens={k!r} contradicts prompt_lookup_num_tokens={lookup!r}")
        k = lookup
        ngram = config.max_matching_ngram_size
        draft = NgramDrafter(max_n=ngram) if ngram is not None else NgramDrafter()
    else:
        draft = assistant_model
        if k is None:
            k = explicit_k if explicit_k is not None and draft is not None else DEFAULT_DRAFTS
    scheduler = engine.get("scheduler", "eqspec" if draft is not None else "autoregressive")
    if scheduler == "autoregressive" and draft is not None:
        raise ValueError("scheduler='autoregressive' decodes without a draft: drop assistant_model / "
                         "prompt_lookup_num_tokens / assistant_early_exit, or pick 'eqspec' or 'exspec'")
    options = {name: engine[name] for name in ("realign", "backend", "adaptive", "window", "compact_threshold")
               if name in engine}
    decoder = SpeculativeDecoder(model, draft, num_draft_tokens=k, scheduler=scheduler, **options)
    if decoder.controller is not None:
        decoder.controller = _learned_controller(model, draft, decoder.controller)
    return decoder


# What the speculation controller learned (forward costs, acceptance per draft feature) outlives one call, as it
# does on one SpeculativeDecoder: kept per target (dropped with it) and per drafter, K and mode.
_LEARNED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _learned_controller(model, draft, fresh):
    # drafters made per call (n-gram, the model's own early exit) are known by what they are, models by identity
    if isinstance(draft, NgramDrafter):
        what = "ngram"
    elif isinstance(draft, EarlyExitDrafter):
        what = ("early_exit", draft.layers)
    else:
        what = id(draft)
    key = (what, fresh.k, fresh.enabled)
    per_model = _LEARNED.setdefault(model, {})
    entry = per_model.get(key)
    if entry is not None and (entry[1] is None or entry[1]() is draft):  # an id is reused only once freed
        return entry[0]
    per_model[key] = (fresh, weakref.ref(draft) if isinstance(what, int) else None)
    return fresh


def _pad_sequences(ids: torch.Tensor, new: list[list[int]], pad: int | None) -> torch.Tensor:
    steps = max((len(s) for s in new), default=0)
    out = torch.full((len(new), steps), pad if pad is not None else 0, dtype=torch.long)
    for i, s in enumerate(new):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return torch.cat([ids, out.to(ids.device)], dim=1)


class _Collector:
    """The decode loop's observer: streams kept tokens, and keeps the scores / logits each came from."""

    def __init__(self, n: int, streamer, want_scores: bool, want_logits: bool):
        self.streamer = streamer
        self.want_scores, self.want_logits = want_scores, want_logits
        self.wants_scores = want_scores or want_logits
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.processed: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.raw: list[list[torch.Tensor]] = [[] for _ in range(n)]

    def scores(self, seqs, logits: torch.Tensor, scores: torch.Tensor) -> None:
        for b, seq in enumerate(seqs):
            self.pending[seq] = (logits[b], scores[b])

    def tokens(self, seq: int, tokens) -> None:
        if not tokens:
            return
        if self.wants_scores:
            logits, scores = self.pending.pop(seq)
            n = len(tokens)
            if self.want_scores:
                self.processed[seq].append(scores[:n].float().clone())
            if self.want_logits:
                self.raw[seq].append(logits[:n].float().clone())
        if self.streamer is not None:
            self.streamer.put(torch.tensor([list(tokens)], dtype=torch.long))

    @staticmethod
    def stacked(per_row: list[list[torch.Tensor]], steps: int, pad: int | None, device) -> tuple[torch.Tensor, ...]:
        """One float32 [B, V] tensor per step; rows finished before it: -inf but 0 at pad_token_id."""
        rows = [torch.cat(r, dim=0).to(device) for r in per_row]
        vocab = rows[0].shape[-1]
        filler = torch.full((vocab,), float("-inf"), device=device)
        if pad is not None:
            filler[pad] = 0.0
        full = torch.stack([torch.cat([r, filler.expand(steps - r.shape[0], vocab)], dim=0) for r in rows], dim=0)
        return tuple(full.unbind(dim=1))
