"""Progress bars for the apps' long loops (decoding many prompts, the plain-greedy reference of --check): tqdm on
stderr when stderr is a terminal, silent otherwise (logs, pipes, tests), and silent without tqdm installed."""

from __future__ import annotations

import sys


class Progress:
    """Called once per finished item (with its index, as SpeculativeDecoder.generate's `progress` is); `close()`
    removes the bar. Usable as a context manager."""

    def __init__(self, total: int, desc: str | None = None):
        self.bar = None
        if not sys.stderr.isatty():
            return
        try:
            from tqdm import tqdm
        except ImportError:  # tqdm is an optional extra (specdec[cli]): no bar, same results
            return
        self.bar = tqdm(total=total, desc=desc, unit="prompt", file=sys.stderr, leave=False)

    def __call__(self, index: int | None = None) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
