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
        self._given: list[float] = []  # per open phase block: time its nested phases took

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
    def _timed(self, table: dict[str, float], name: str, nests: bool) -> Iterator[None]:
        self._wait()
        t = time.perf_counter()
        if nests:
            self._given.append(0.0)
        try:
            yield
        finally:
            self._wait()
            elapsed = time.perf_counter() - t
            if nests:
                elapsed_own = elapsed - self._given.pop()
                if self._given:  # a phase inside a phase: the enclosing one gives this time away
                    self._given[-1] += elapsed
                elapsed = elapsed_own
            table[name] = table.get(name, 0.0) + elapsed

    def phase(self, name: str):
        """Charge the block's time to phase `name`. Inside another phase's block, the time moves from that
        phase to this one (a scheduler's realignment inside its batch building, say)."""
        if name not in self.seconds:
            raise ValueError(f"unknown phase {name!r}; phases are {PHASES}")
        return self._timed(self.seconds, name, nests=True)

    def within(self, name: str):
        """Account a piece of work inside the current phase under its own name too; phases are unchanged."""
        return self._timed(self.inner, name, nests=False)

    def report(self) -> dict[str, float]:
        """Seconds per phase; "other" is whatever the named phases did not cover, so the phases add up to
        the total."""
        out = dict(self.seconds)
        out["other"] = max(0.0, self.total - sum(v for k, v in out.items() if k != "other"))
        return out


class ForwardClock:
    """Times single model forwards for the speculation controller without adding device syncs: on CUDA a pair of
    events around the forward, on CPU the clock at once, with the process's CPU time when torch computes on one
    thread (what a forward costs, whatever else the machine runs: on a shared machine wall time also counts the
    time the process waited for a core, and the controller would chase that noise) and wall time otherwise.

    Either way the timings reach their sinks in `collect()`, which the decode loop calls after the step's own
    sync: on CUDA an event that has not completed yet is read at a later step; on CPU every timing of the step is
    handed over there together. A sink called right after each forward runs with the interpreter's working set
    evicted by it (on the demo pair 17-20 us a call, 3 of them a step); handed over in one loop, only the first
    call of a step pays that."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self.now = time.process_time if not self.cuda and torch.get_num_threads() == 1 else time.perf_counter
        self._pending: list = []  # CUDA: (start event, end event, tokens, sink); CPU: (None, seconds, tokens, sink)

    @contextlib.contextmanager
    def measure(self, tokens: int, sink) -> Iterator[None]:
        """Time the block as one forward over `tokens` query tokens; sink(tokens, seconds) gets the result at the
        next `collect()`."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._pending.append((start, end, tokens, sink))
            return
        t = self.now()
        yield
        self._pending.append((None, self.now() - t, tokens, sink))

    def collect(self) -> None:
        """Hand every finished timing to its sink, in the order the forwards ran."""
        if not self._pending:
            return
        waiting = []
        for start, end, tokens, sink in self._pending:
            if start is None:
                sink(tokens, end)
            elif end.query():
                sink(tokens, start.elapsed_time(end) / 1e3)
            else:
                waiting.append((start, end, tokens, sink))
        self._pending = waiting
