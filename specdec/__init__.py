"""specdec: batch speculative decoding engines (EQSPEC, EXSPEC) on Hugging Face models."""

from .batch import RaggedKV
from .cache import SlabCache
from .drafters import Drafter, ModelDrafter, Proposal
from .engine import GenerationResult, SpeculativeDecoder
from .ngram import NgramDrafter
from .sampling import SamplingConfig, processed_probs
from .timing import PHASES, PhaseTimer

__all__ = ["Drafter", "GenerationResult", "ModelDrafter", "NgramDrafter", "PHASES", "PhaseTimer", "Proposal", "RaggedKV",
           "SamplingConfig", "SlabCache", "SpeculativeDecoder", "processed_probs"]
