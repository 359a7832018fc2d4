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

import torch

from ..kv.batch import StepBatch
from ..kv.geometry import text_config
from ..sampling import SamplingConfig
from .base import Proposal, StopRule
from .model import ModelDrafter


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


class EarlyExitDrafter(ModelDrafter):
    """Drafts with `target`'s first `layers` layers over the target's own KV lane (see the module docstring).

    Args:
        target: the model SpeculativeDecoder verifies with (the same object).
        layers: how many decoder layers the draft runs, 1 .. num_hidden_layers - 1.
        early_stop: as ModelDrafter's (the controller may stop a step's drafting early; CPU default on).
    """

    kv_model = None  # no lane of its own: it drafts in the target's
    writes_target = True  # the sources leave room in the target's lane for a step's draft columns
    first_columns = 1  # a step's first forward feeds only each row's newest token

    def __init__(self, target, layers: int, early_stop: bool | None = None):
        super().__init__(early_exit_view(target, layers), early_stop)
        self.kv_model = None
        self.target = target
        self.layers = layers
        self.cost_model = self.model  # the controller's prior for its cost: its parameter share

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
        return None  # the lane was rewound: the verify forward wrote the step's columns, the source realigns them
