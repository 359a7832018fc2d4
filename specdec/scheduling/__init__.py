"""Scheduling: the one decode loop, EQSPEC and EXSPEC as its batch sources, and the speculation controller.
Built on specdec.drafting and specdec.kv."""

from .control import SpeculationController
from .eqspec import EqspecSource
from .exspec import ExspecSource
from .loop import DecodeLoop

__all__ = ["DecodeLoop", "EqspecSource", "ExspecSource", "SpeculationController"]
