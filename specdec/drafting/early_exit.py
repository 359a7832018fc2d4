"""EarlyExitDrafter: self-speculative drafting with the target's own first layers, over the target's own cache.

    drafter = EarlyExitDrafter(target, layers=2)
    SpeculativeDecoder(target, drafter).generate(prompts)

The draft is the target cut short: its embeddings, its first `layers` decoder layers, its final norm and its head
(LayerSkip, Draft & Verify; transformers' `generate(assistant_early_exit=...)`). A separate draft model built
from those layers would compute, at every position, exactly the keys and values the target's first layers
compute there (the same weights on the same tokens), so it needs no cache of its own: it reads and writes the
target's lane.

A step: the drafter runs the cut-short model on each row's newest token (`batch.last`, not yet in the cache),
then on each draft it chooses, appending to the first `layers` layers of the target's lane; then it rewinds the
lane (RaggedKV.mark / rewind) to where the step began. The verify forward writes those columns again, in every
layer, from the target's own computation, so what the target attends to is its own keys and values, whatever
the drafter wrote: output exactness does not depend on the drafts (as for any drafter).

What this saves against a separate draft model holding the same layers:
- catch-up: nothing lags. After a plain step (the controller's w = 1), or for a new prompt, a separate draft
  model must first feed what it missed (the spell's tokens, the prompt); here the target's forwards already
  wrote them. Waking the drafter after a plain spell costs its drafts and nothing more.
- memory and realignment: no second KV lane to allocate, prefill, shift or gather every step.
The draft's first forward of a step takes one column per row (the newest token), not two.

Limits: the keys of positions the target verified come from the verify forward (a wider matrix product than a
draft forward's), so a draft may differ from a separate copy's by float rounding in near ties; acceptance, not
exactness, is what that can change. The early-exit view shares the target's modules: it is only valid for the
target it was built on (SpeculativeDecoder checks). On a tensor-parallel target it is sharded as the target is:
every rank runs the same draft forwards over its own heads (the ranks already share rank 0's plans and early
stops), so no rank holds a whole draft model (tests/test_tp_decoding.py).
"""

from __future__ import annotations

import copy
import math
import time

import torch

from ..kv.batch import StepBatch
from ..kv.geometry import text_config
from ..sampling import Prefixes, SamplingConfig, greedy
from .base import Proposal, StopRule
from .model import ModelDrafter, confidence_bin

# What judging plain steps may cost, as a share of plain decoding. Judging a step costs a head (norm, unembedding,
# scoring, a readback) per row: on a model with a large vocabulary a fifth of a forward (SmolLM2-135M: 28M of
# its 135M weights; measured 16-17% of its plain step at batch 1), on the demo pair's 260-token vocabulary its
# few operations (2.5%). So one plain step in ceil(cost / (JUDGE_SHARE * step)) is judged, from the measured
# cost of judging and of the step it judged. Half a percent: where drafting can never pay (the early exit on
# SmolLM2 runs plain throughout) judging is pure cost, and a percent there read 1-3% slower in 3-5 repeats.
JUDGE_SHARE = 0.005
JUDGE_FOLLOW = 0.25  # how fast the measured share of judging moves (an exponential average, per judged step)
# the base model's final norm, by the names transformers' decoder-only models give it
FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm")


def _decoder_stack(model) -> tuple[torch.nn.Module, str, torch.nn.ModuleList]:
    """(the base model, the name of its decoder-layer list, the list): Llama-style `model.layers` or GPT-2's
    `transformer.h`, found as the base model's ModuleList with one entry per configured layer."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    layers = getattr(text_config(model.config), "num_hidden_layers", None)
    if isinstance(base, torch.nn.Module) and isinstance(layers, int):
        for name, child in base.named_children():
            if isinstance(child, torch.nn.ModuleList) and len(child) == layers:
                return base, name, child
    raise ValueError(f"{type(model).__name__} has no decoder-layer list the early-exit drafter knows "
                     "(a base model with one ModuleList of num_hidden_layers layers, as Llama, Qwen, Gemma, "
                     "GPT-2 have)")


def _shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object over the same children, parameters and buffers; its own child table, so that
    replacing a child on it leaves the original untouched."""
    view = copy.copy(module)
    view._modules = dict(module._modules)
    return view


def early_exit_view(model, layers: int) -> torch.nn.Module:
    """A causal LM that runs `model`'s embeddings, its first `layers` decoder layers, its final norm and head.

    Every module is `model`'s own (no parameter is copied); only the module objects that list the layers and the
    config that counts them are new. Called with `model`'s cache, its layers write their own slots (each
    attention module keeps its layer index), the slots of the layers it skips are untouched."""
    base, name, stack = _decoder_stack(model)
    total = len(stack)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < total:
        raise ValueError(f"layers must be an int in 1..{total - 1} ({type(model).__name__} has {total} decoder "
                         f"layers), got {layers!r}")
    config = copy.copy(model.config)
    config.num_hidden_layers = layers
    view_base = _shallow(base)
    setattr(view_base, name, torch.nn.ModuleList(list(stack)[:layers]))
    view_base.config = config
    view = _shallow(model)
    setattr(view, model.base_model_prefix, view_base)
    view.config = config
    return view


def exit_head(model):
    """(final norm, head, logit softcap or None): what the early-exit view applies to its last layer's output,
    as `model`'s causal-LM forward does to its own; None where the base model has no final norm by a known
    name (FINAL_NORMS)."""
    base, _, _ = _decoder_stack(model)
    norm = next((getattr(base, n) for n in FINAL_NORMS if isinstance(getattr(base, n, None), torch.nn.Module)),
                None)
    head = model.get_output_embeddings()
    if norm is None or head is None:
        return None
    return norm, head, getattr(text_config(model.config), "final_logit_softcapping", None)


def head_share(model) -> float:
    """The head's share of a forward's weights: its parameters over every parameter a forward multiplies by (the
    input embedding is a lookup, unless it is the head's own matrix)."""
    head = model.get_output_embeddings().weight
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()
                if p is not embedding or p is head)
    return head.numel() / max(1, total)


class EarlyExitDrafter(ModelDrafter):
    """Drafts with `target`'s first `layers` layers over the target's own KV lane (see the module docstring).

    Args:
        target: the model SpeculativeDecoder verifies with (the same object).
        layers: how many decoder layers the draft runs, 1 .. num_hidden_layers - 1.
        early_stop: as ModelDrafter's (the controller may stop a step's drafting early; CPU default on).
        judge_plain: judge plain steps in hindsight (watch_plain): what the first draft would have been, read off
            the target's own forward, against the token the target chose.
        judge_share: what judging may cost, as a share of plain decoding (default JUDGE_SHARE).

    Judging plain steps. A plain step's target forward computes the draft's first `layers` layers over each
    row's newest token, exactly the draft's first forward of a step (the same weights over the same cache), so
    the draft's first token is that layer's output through the final norm and head: one head per row, not a
    draft forward. With greedy decoding it is deterministic, and whether the target's token equals it is
    whether verification would have accepted it. The controller learns from these verdicts while it decodes
    plainly (SpeculationController.judge), so a plain spell that began on a few early misses ends once the
    first drafts land often enough, and one where drafting cannot pay stays plain on evidence, not on its
    last verdicts. One plain step in ceil(cost share / judge_share) is judged, the cost share measured (a head
    over the step it judged; before the first, the head's share of the weights, head_share). Not when
    sampling (a sampled draft that matches was not necessarily accepted), nor on a tensor-parallel target (one
    rank's verdicts would move its controller alone). Verdicts only: what is emitted never depends on them.
    """

    kv_model = None  # no lane of its own: it drafts in the target's
    writes_target = True  # the sources leave room in the target's lane for a step's draft columns
    first_columns = 1  # a step's first forward feeds only each row's newest token

    def __init__(self, target, layers: int, early_stop: bool | None = None, judge_plain: bool = True,
                 judge_share: float = JUDGE_SHARE):
        if isinstance(judge_share, bool) or not isinstance(judge_share, (int, float)) or not 0 < judge_share <= 1:
            raise ValueError(f"judge_share must be a share of plain decoding in (0, 1], got {judge_share!r}")
        super().__init__(early_exit_view(target, layers), early_stop)
        self.judge_share = float(judge_share)
        self.kv_model = None
        self.target = target
        self.layers = layers
        self.cost_model = self.model  # the controller's prior for its cost: its parameter share
        self.hindsight = False  # set by the decode loop (an adaptive controller learns from judged steps)
        self._exit = exit_head(target) if judge_plain else None
        self._cost_share = head_share(target)  # judging's cost over its step's, until measured
        self._plain_steps = 0
        self._layer = _decoder_stack(target)[2][layers - 1]
        self._watch = None  # (hook handle, [captured output], scoring, when armed) while a plain verify is watched
        self._judged: list[tuple[int, list[tuple], int]] = []

    def watch_plain(self, batch: StepBatch, sampling: SamplingConfig) -> None:
        """The next target forward is a plain step's verify: capture what the draft's last layer computes there,
        to judge in commit (greedy scoring only; every ceil(cost share / judge_share)-th plain step)."""
        self._plain_steps += 1
        if not self.hindsight or self._exit is None or sampling.do_sample or self._watch is not None \
                or (self._plain_steps - 1) % self.judge_every:
            return
        captured: list = []

        def capture(module, args, output):
            captured.append(output[0] if isinstance(output, tuple) else output)

        self._watch = (self._layer.register_forward_hook(capture), captured, sampling, time.perf_counter())

    @property
    def judge_every(self) -> int:
        """One plain step in this many is judged: judging costs about judge_share of plain decoding."""
        return max(1, math.ceil(self._cost_share / self.judge_share))

    def judged(self) -> list[tuple[int, list[tuple], int]]:
        """The plain steps' first drafts judged since the last call: (seq, [its key], 1 if the target's token
        equals it else 0)."""
        out, self._judged = self._judged, []
        return out

    def _judge(self, batch: StepBatch, emitted: list[list[int]]) -> None:
        handle, captured, sampling, watched = self._watch
        self._watch = None
        handle.remove()
        if len(captured) != 1 or captured[0].shape[:2] != (batch.size, 1):
            return  # not the one-column verify it was armed for: nothing to judge
        began = time.perf_counter()  # the step's forward and sampling took began - watched (its readback synced)
        norm, head, cap = self._exit
        with torch.no_grad():
            logits = head(norm(captured[0][:, -1]))
            if cap:
                logits = torch.tanh(logits / cap) * cap
            scores = sampling.process(logits, Prefixes(batch.seqs, batch.history, batch.prompt_length, None, 0))
            drafts = greedy(scores)
            confidence = scores.float().softmax(dim=-1).gather(1, drafts[:, None])
            # one readback for both (token ids are exact in float64)
            host = torch.cat([drafts[:, None].double(), confidence.double()], dim=1).tolist()
        for seq, (d, c), out in zip(batch.seqs, host, emitted):
            self._judged.append((seq, [("model", 1, confidence_bin(c))], int(out[0] == d)))
        share = (time.perf_counter() - began) / max(began - watched, 1e-9)
        self._cost_share += JUDGE_FOLLOW * (share - self._cost_share)

    def start(self, seq: int, prompt, first: int) -> None:
        pass  # nothing to remember: the target's lane holds the sequence

    def lag(self, batch: StepBatch) -> int:
        return 0  # the target's forwards keep its cache current, plain steps included

    def propose(self, batch: StepBatch, k: int, sampling: SamplingConfig, generator: torch.Generator | None,
                stop: StopRule | None = None) -> Proposal:
        lane = batch.target
        # Room for the drafts and then the verify forward, made before the mark: a growth or compaction of the
        # lane happens here, between steps, not between a draft forward and the rewind.
        lane.reserve(k + 1)
        mark = lane.mark()
        try:
            logits = self._forward(lane, batch.last[:, None], None)
            return self._draft(batch, lane, logits, k, sampling, generator, stop)
        finally:
            lane.rewind(mark)

    def commit(self, batch: StepBatch, proposal: Proposal | None, emitted: list[list[int]]) -> None:
        if self._watch is not None:
            self._judge(batch, emitted)
        return None  # the lane was rewound: the verify forward wrote the step's columns, the source realigns them
