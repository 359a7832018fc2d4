"""Rejection sampling preserves the target distribution: chi-square tests of the first and second emitted token
against the exact target probabilities, with a fixed seed (the test is deterministic, and a wrong rule fails it)."""

import pytest
import torch
from conftest import DEVICE, backend_params, device_generator, run
from scipy.stats import chisquare

import specdec_kernels as sk

# The CPU interpreter runs one Triton program per row at ~50 ms each: give it fewer rows there (a weaker but
# still real test; exactness against the reference is tested separately). On a GPU it gets the full count.
ROWS = {"torch": 40000, "cpp": 40000, "triton": 40000 if DEVICE.type == "cuda" else 300}
ALPHA = 1e-3


def chi_square_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    probs = probs.double()
    expected = probs / probs.sum() * samples.numel()  # float32 probabilities sum to 1 only approximately
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token with target probability 0 was emitted"
    return float(chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "no-q"])
def test_first_and_second_token_follow_target(backend, with_q):
    gen = torch.Generator().manual_seed(21)
    vocab, k = 7, 2
    rows = ROWS[backend]
    p = torch.softmax(torch.randn(k + 1, vocab, generator=gen) * 1.5, -1)
    p[0, 3] = 0  # an impossible token under the target
    p[0] /= p[0].sum()
    q = torch.softmax(torch.randn(k, vocab, generator=gen) * 1.5, -1)
    if with_q:
        drafts = torch.multinomial(q, rows, replacement=True, generator=gen).T.contiguous()
        draft_probs = q.expand(rows, k, vocab).contiguous()
    else:  # a deterministic drafter always proposing the same tokens
        drafts = torch.tensor([[2, 1]]).expand(rows, k).contiguous()
        draft_probs = None
    target = p.expand(rows, k + 1, vocab).contiguous()
    tokens, accepted = run(sk.rejection_sample, drafts, draft_probs, target, generator=device_generator(5),
                                           backend=backend)
    assert chi_square_pvalue(tokens[:, 0], p[0]) > ALPHA
    # Given the first draft was accepted, the second emitted token follows the target at slot 1.
    second = tokens[accepted >= 1, 1]
    assert second.numel() > rows // 10
    assert chi_square_pvalue(second, p[1]) > ALPHA


def test_chi_square_detects_a_wrong_sampler():
    """The statistical test has power: sampling from the draft instead of the target fails it."""
    gen = torch.Generator().manual_seed(22)
    p = torch.softmax(torch.randn(7, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(7, generator=gen) * 1.5, -1)
    wrong = torch.multinomial(q, 300, replacement=True, generator=gen)
    assert chi_square_pvalue(wrong, p) < ALPHA
