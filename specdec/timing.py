"""Phase timers: where a step's time goes (draft, verify, sample, realign, schedule, other).

Work on a GPU is asynchronous; a timer that does not synchronise charges a phase's kernels to whichever
later phase happens to wait for them. With sync=True (the default on CUDA) every phase boundary waits for
the device, which costs a little throughput and buys honest attribution; switch it off to measure speed only.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch

PHASES = ("draft", "verify", "sample", "realign", "schedule", "other")


class PhaseTimer:
    def __init__(self, device: torch.device | str = "cpu", sync: bool | None = None):
        device = torch.device(device)
        self.sync = (device.type == "cuda") if sync is None else bool(sync)
        self._device = device
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._t0: float | None = None
        self.total = 0.0
        self.inner: dict[str, float] = {}  # time of named work inside phases (e.g. prefill inside schedule)

    def _wait(self) -> None:
        if self.sync and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def start(self) -> None:
        self._wait()
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self._wait()
        if self._t0 is not None:
            self.total += time.perf_counter() - self._t0
            self._t0 = None

    @contextlib.contextmanager
    def _timed(self, table: dict[str, float], name: str) -> Iterator[None]:
        self._wait()
        t = time.perf_counter()
        try:
            yield
        finally:
            self._wait()
            table[name] = table.get(name, 0.0) + time.perf_counter() - t

    def phase(self, name: str):
        """Charge the block's time to phase `name`."""
        if name not in self.seconds:
            raise ValueError(f"unknown phase {name!r}; phases are {PHASES}")
        return self._timed(self.seconds, name)

    def within(self, name: str):
        """Account a piece of work inside the current phase under its own name too; phases are unchanged."""
        return self._timed(self.inner, name)

    def report(self) -> dict[str, float]:
        """Seconds per phase; "other" is whatever the named phases did not cover, so the phases add up to
        the total."""
        out = dict(self.seconds)
        out["other"] = max(0.0, self.total - sum(v for k, v in out.items() if k != "other"))
        return out
