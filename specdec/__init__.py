"""specdec: batch speculative decoding (EQSPEC, EXSPEC) on Hugging Face models, exact with respect to plain decoding.

The package in layers, each importing only the ones above it in this list:
    kv/          KV state: the slab cache, a right-aligned ragged batch, EXSPEC's slot pool, the step handle
    drafting/    the drafter protocol, a draft model over its KV lane, the target's early exit over the target's
                 lane, prompt-lookup n-grams
    scheduling/  the decode loop, EQSPEC and EXSPEC as its batch sources, the speculation controller
    decoder.py   SpeculativeDecoder: the facade
    hf_generate  specdec.generate: model.generate's inputs and outputs (padded batches, generation configs, logits
                 processors, streamers) through the facade
    apps/        the CLI, demos, ablation, reports (use the layers, never used by them)
    models/      model factories for tests and demos (tiny offline models, the demo pair, local HF folders)
sampling.py, timing.py and validation.py are shared utilities of the core layers; processing.py builds a scoring
(sampling.py's interface) from transformers logits processors.
"""

from .decoder import GenerationResult, SpeculativeDecoder
from .drafting import Drafter, EarlyExitDrafter, ModelDrafter, NgramDrafter, Proposal
from .hf_generate import generate
from .kv import RaggedKV, SlabCache
from .processing import ProcessorScoring
from .sampling import SamplingConfig, processed_probs
from .scheduling import SpeculationController
from .timing import PHASES, PhaseTimer

__all__ = ["Drafter", "EarlyExitDrafter", "GenerationResult", "ModelDrafter", "NgramDrafter", "PHASES", "PhaseTimer",
           "ProcessorScoring", "Proposal", "RaggedKV", "SamplingConfig", "SlabCache", "SpeculationController",
           "SpeculativeDecoder", "generate", "processed_probs"]
