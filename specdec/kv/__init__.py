"""KV state, the bottom layer: the slab cache, a right-aligned ragged batch over it, EXSPEC's slot pool, and the
step handle the layers above share. Imports nothing else from specdec."""

from .batch import StepBatch
from .pool import SlotPool
from .ragged import COMPACT_THRESHOLD, REALIGN_MODES, RaggedKV
from .slab import SlabCache

__all__ = ["COMPACT_THRESHOLD", "REALIGN_MODES", "RaggedKV", "SlabCache", "SlotPool", "StepBatch"]
