"""Side-by-side timings of every op on every backend, in one process, interleaved round by round.

Kernel rows run with value checks off (SPECDEC_CHECKS=0); the "+ checks" rows show what the default
checks (NaN, id and count ranges: one extra pass over the inputs) add.

A shared, noisy machine makes separate runs incomparable; interleaving the backends inside each round and
taking medians makes the ratios trustworthy. `python -m specdec_kernels` prints the table;
bench/compare_ops.py writes it as JSON/markdown for the README.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import ops
from .backend import available_backends, unavailable_reason
from .noise import draw_noise


@dataclass
class Row:
    op: str
    size: str
    backend: str
    median_ms: float
    gbytes: float  # bytes an ideal implementation must move, for GB/s

    @property
    def gb_per_s(self) -> float:
        return self.gbytes / (self.median_ms / 1e3) if self.median_ms else float("nan")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _checks(on: bool):
    """Value checks (NaN, id ranges) cost a pass over the inputs; the kernel rows are timed without them."""
    old = os.environ.get("SPECDEC_CHECKS")
    os.environ["SPECDEC_CHECKS"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["SPECDEC_CHECKS"]
        else:
            os.environ["SPECDEC_CHECKS"] = old


def _timed(fn: Callable[[], object], checks: bool) -> Callable[[], object]:
    def call():
        with _checks(checks):
            return fn()
    return call


def _median_ms(fns: dict[str, Callable[[], object]], device: torch.device, rounds: int, warmup: int = 2) -> dict:
    fns = {name: _timed(fn, checks=name.endswith("+ checks")) for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
    _sync(device)
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def kv_cache(layers: int, batch: int, heads: int, length: int, head_dim: int, device, dtype=torch.float32):
    """Every layer's keys and values, as the engine holds them."""
    gen = torch.Generator(device=device).manual_seed(0)
    return [torch.randn(batch, heads, length, head_dim, generator=gen, device=device, dtype=dtype)
            for _ in range(2 * layers)]


def backends_for(device: torch.device) -> list[str]:
    """Backends worth timing on `device` (Triton's CPU interpreter is for correctness, not speed)."""
    return [b for b in available_backends() if unavailable_reason(b, device) is None
            and not (b == "triton" and device.type != "cuda")]


def sampling_rows(device, batch=8, k=4, vocab=32000, rounds=20) -> list[Row]:
    gen = torch.Generator(device=device).manual_seed(0)
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen, device=device), -1)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen, device=device), -1)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, k)
    logits = torch.randn(batch, k + 1, vocab, generator=gen, device=device)
    uniform, exponential = draw_noise(batch, k, vocab, device, gen)
    size = f"B={batch} K={k} V={vocab}"
    rows = []
    names = backends_for(device)
    reject = {b: (lambda b=b: ops.rejection_sample(drafts, q, p, uniform=uniform, exponential=exponential,
                                                   backend=b)) for b in names}
    fastest = names[-1]
    reject[f"{fastest} + checks"] = reject[fastest]
    # Ideal traffic: the K draft probabilities gathered plus one full row of p and q.
    for b, ms in _median_ms(reject, device, rounds).items():
        rows.append(Row("rejection_sample", size, b, ms, (2 * vocab + 2 * k) * 4 * batch / 1e9))
    greedy = {b: (lambda b=b: ops.verify_greedy(drafts, logits, backend=b)) for b in names}
    greedy[f"{fastest} + checks"] = greedy[fastest]
    for b, ms in _median_ms(greedy, device, rounds).items():
        rows.append(Row("verify_greedy", size, b, ms, logits.numel() * 4 / 1e9))
    return rows


def move_rows(device, layers=24, batch=8, heads=4, length=512, head_dim=64, rounds=10) -> list[Row]:
    cache = kv_cache(layers, batch, heads, length, head_dim, device)
    copy_src = kv_cache(layers, batch, heads, length, head_dim, device)
    shifts = (torch.arange(batch, device=device) % 5).to(torch.int64)  # 0..4, as after a step with K=4
    keep = torch.rand(batch, length, device=device) < 0.9
    nbytes = sum(x.numel() * x.element_size() for x in cache)
    size = f"{2 * layers}x[{batch},{heads},{length},{head_dim}] f32"
    names = backends_for(device)
    fns: dict[str, Callable[[], object]] = {"copy (floor)": lambda: [d.copy_(s) for d, s in zip(cache, copy_src)]}
    fns.update({b: (lambda b=b: ops.shift_rows_(cache, shifts, dim=-2, backend=b)) for b in names})
    rows = [Row("shift_rows_", size, b, ms, 2 * nbytes / 1e9) for b, ms in _median_ms(fns, device, rounds).items()]
    compact = {b: (lambda b=b: ops.compact_rows_(cache, keep, dim=-2, backend=b)) for b in names}
    rows += [Row("compact_rows_", size, b, ms, 2 * nbytes / 1e9)
             for b, ms in _median_ms(compact, device, rounds).items()]
    return rows


def run(device: str | torch.device = "cpu", quick: bool = False) -> list[Row]:
    device = torch.device(device)
    rounds = 5 if quick else None
    return (sampling_rows(device, rounds=rounds or 20) +
            move_rows(device, rounds=rounds or 10, layers=6 if quick else 24))


def format_table(rows: list[Row]) -> str:
    """Markdown: per op, each backend's median and its speed-up over the torch backend."""
    base = {(r.op, r.size): r.median_ms for r in rows if r.backend == "torch"}
    floor = {(r.op, r.size): r.median_ms for r in rows if r.backend == "copy (floor)"}
    lines = ["| op | size | backend | median ms | vs torch | vs copy floor | GB/s |", "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        key = (r.op, r.size)
        vs_torch = f"{base[key] / r.median_ms:.2f}x" if key in base else ""
        vs_copy = f"{r.median_ms / floor[key]:.2f}x" if key in floor else ""
        lines.append(f"| {r.op} | {r.size} | {r.backend} | {r.median_ms:.3f} | {vs_torch} | {vs_copy} | "
                     f"{r.gb_per_s:.1f} |")
    return "\n".join(lines)
