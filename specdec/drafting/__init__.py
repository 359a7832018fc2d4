"""Drafting: the drafter protocol, a draft model over its KV lane, the target cut short (early exit) over the
target's own lane, and prompt-lookup n-grams. Built on specdec.kv."""

from .base import Drafter, Proposal
from .early_exit import EarlyExitDrafter, early_exit_view
from .model import ModelDrafter
from .ngram import NgramDrafter, NgramIndex

__all__ = ["Drafter", "EarlyExitDrafter", "ModelDrafter", "NgramDrafter", "NgramIndex", "Proposal", "early_exit_view"]
