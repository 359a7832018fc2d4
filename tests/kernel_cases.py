"""Random inputs for the kernel tests: ragged drafts with controllable acceptance, and shapes tables."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

import specdec_kernels.outputs as outputs

# (B, K, V): B=1, K=1, V=111 (odd, not a power of two), K=0 (no drafts), a larger batch, a larger vocabulary.
SAMPLING_SHAPES = [
    pytest.param(1, 1, 111, id="B1-K1-V111"),
    pytest.param(3, 4, 111, id="B3-K4-V111"),
    pytest.param(5, 6, 257, id="B5-K6-V257"),
    pytest.param(2, 0, 17, id="B2-K0-V17"),
    pytest.param(33, 3, 50, id="B33-K3-V50"),
    pytest.param(2, 2, 1000, id="B2-K2-V1000"),
]
FLOAT_DTYPES = [
    pytest.param(torch.float32, id="f32"),
    pytest.param(torch.float16, id="f16"),
    pytest.param(torch.bfloat16, id="bf16"),
]


@dataclasses.dataclass
class SamplingCase:
    draft_tokens: torch.Tensor
    draft_probs: torch.Tensor | None
    target_probs: torch.Tensor
    num_draft: torch.Tensor | None
    uniform: torch.Tensor
    exponential: torch.Tensor


def ragged_num_draft(batch: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Counts in 0..K with 0 and K present whenever the batch has room for them."""
    n = torch.randint(0, k + 1, (batch,), generator=gen)
    if batch >= 2:
        n[0], n[-1] = 0, k
    return n


def pad_unused(draft_tokens: torch.Tensor, num_draft: torch.Tensor | None) -> torch.Tensor:
    """-1 in the slots past num_draft, as a caller with ragged drafts would pass them."""
    if num_draft is None:
        return draft_tokens
    slots = torch.arange(draft_tokens.shape[1])[None, :]
    return torch.where(slots < num_draft[:, None], draft_tokens, torch.full_like(draft_tokens, -1))


def peaked_logits(batch: int, slots: int, vocab: int, gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(batch, slots, vocab, generator=gen) * 3).to(dtype)


def greedy_case(batch, k, vocab, seed, dtype=torch.float32, ragged=True, ties=False):
    """Drafts that match the target's argmax for a random prefix of each row, then diverge."""
    gen = torch.Generator().manual_seed(seed)
    if ties:  # a few integer levels: many exact ties, so argmax tie-breaking is exercised
        logits = torch.randint(0, 3, (batch, k + 1, vocab), generator=gen).to(dtype)
    else:
        logits = peaked_logits(batch, k + 1, vocab, gen, dtype)
    best = logits.float().argmax(-1)
    agree = torch.randint(0, k + 1, (batch,), generator=gen)
    noise = torch.randint(0, vocab, (batch, k), generator=gen)
    slots = torch.arange(k)[None, :]
    drafts = torch.where(slots < agree[:, None], best[:, :k], noise)
    num_draft = ragged_num_draft(batch, k, gen) if ragged else None
    return pad_unused(drafts, num_draft), logits, num_draft


def sampling_case(batch, k, vocab, seed, dtype=torch.float32, with_q=True, ragged=True) -> SamplingCase:
    """Random target/draft distributions with drafts sampled from the draft distribution."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen) * 2, -1)
    # Mix q toward p so some rows accept several drafts and others none.
    mix = torch.rand(batch, 1, 1, generator=gen)
    q = mix * p[:, :k] + (1 - mix) * q
    drafts = torch.multinomial(q.reshape(-1, vocab).clamp_min(1e-12), 1, generator=gen).view(batch, k) \
        if k else torch.empty(batch, 0, dtype=torch.int64)
    num_draft = ragged_num_draft(batch, k, gen) if ragged else None
    uniform = torch.rand(batch, k, generator=gen)
    exponential = torch.empty(batch, vocab).exponential_(generator=gen)
    return SamplingCase(pad_unused(drafts, num_draft), q.to(dtype) if with_q else None, p.to(dtype), num_draft,
                        uniform, exponential)


@pytest.fixture
def poisoned_outputs():
    """Every output a custom backend allocates starts as -7, so an unwritten element fails the test."""
    outputs.set_poison(-7)
    yield
    outputs.set_poison(None)


@contextlib.contextmanager
def torch_threads(n: int):
    """torch.set_num_threads(n) inside the block, the previous count restored after."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def move_backend_params():
    """(backend, threads) params for the row-move tests: every backend at 1 thread, and cpp again at 2 threads,
    so that two workers touching one row (a race) can show."""
    from conftest import backend_params
    out = [pytest.param(p.values[0], 1, id=p.id, marks=p.marks) for p in backend_params()]
    cpp = next(p for p in backend_params() if p.values[0] == "cpp")
    out.append(pytest.param("cpp", 2, id="cpp-2threads", marks=cpp.marks))
    return out
