"""Drafting: the drafter protocol, a draft model over its KV lane, and prompt-lookup n-grams. Built on specdec.kv."""

from .base import Drafter, Proposal
from .model import ModelDrafter
from .ngram import NgramDrafter, NgramIndex

__all__ = ["Drafter", "ModelDrafter", "NgramDrafter", "NgramIndex", "Proposal"]
