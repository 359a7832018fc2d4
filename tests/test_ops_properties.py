"""Hypothesis property tests: output invariants of the sampling ops and shift/compact identities."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import greedy_case, sampling_case

import specdec_kernels as sk
from specdec_kernels import reference as ref

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


def check_layout(tokens, accepted, drafts, num_draft, vocab):
    batch, k = drafts.shape
    n = num_draft if num_draft is not None else torch.full((batch,), k)
    assert tokens.shape == (batch, k + 1) and tokens.dtype == torch.int64
    assert ((accepted >= 0) & (accepted <= n)).all()
    slots = torch.arange(k + 1)[None, :]
    emitted = slots <= accepted[:, None]
    assert (tokens[~emitted] == -1).all(), "-1 after the emitted tokens"
    assert ((tokens[emitted] >= 0) & (tokens[emitted] < vocab)).all(), "emitted ids in [0, V)"
    assert int(emitted.sum()) == int((accepted + 1).sum()), "emitted = accepted + 1 per row"
    prefix = slots[:, :k] < accepted[:, None]
    assert torch.equal(tokens[:, :k][prefix], drafts[prefix]), "accepted tokens are the drafts"


@SETTINGS
@given(batch=st.integers(1, 9), k=st.integers(0, 6), vocab=st.integers(1, 40), seed=st.integers(0, 2**16),
       with_q=st.booleans(), ragged=st.booleans())
def test_rejection_sample_invariants(batch, k, vocab, seed, with_q, ragged):
    case = sampling_case(batch, k, vocab, seed, with_q=with_q, ragged=ragged)
    tokens, accepted = sk.rejection_sample(case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                                           uniform=case.uniform, exponential=case.exponential)
    check_layout(tokens, accepted, case.draft_tokens, case.num_draft, vocab)
    want = ref.rejection_sample(case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                                uniform=case.uniform, exponential=case.exponential)
    assert torch.equal(tokens, want[0])


@SETTINGS
@given(batch=st.integers(1, 9), k=st.integers(0, 6), vocab=st.integers(1, 40), seed=st.integers(0, 2**16),
       ragged=st.booleans(), ties=st.booleans())
def test_verify_greedy_invariants(batch, k, vocab, seed, ragged, ties):
    drafts, logits, num_draft = greedy_case(batch, k, vocab, seed, ragged=ragged, ties=ties)
    tokens, accepted = sk.verify_greedy(drafts, logits, num_draft)
    check_layout(tokens, accepted, drafts, num_draft, vocab)
    argmax = logits.argmax(-1)
    emitted = torch.arange(k + 1)[None, :] <= accepted[:, None]
    assert torch.equal(tokens[emitted], argmax[emitted]), "every emitted token is the target's argmax"


@SETTINGS
@given(batch=st.integers(1, 6), length=st.integers(1, 20), seed=st.integers(0, 2**16), a=st.integers(-25, 25))
def test_shift_there_and_back(batch, length, seed, a):
    """Shifting by s then -s restores the positions that stayed in range; everything else is fill."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, 3, generator=gen)
    shifts = torch.randint(-length, length + 1, (batch,), generator=gen)
    shifts[0] = a
    y = x.clone()
    sk.shift_rows_(y, shifts, dim=1, fill=float("nan"))
    sk.shift_rows_(y, -shifts, dim=1, fill=float("nan"))
    t = torch.arange(length)[None, :]
    survived = (t + shifts[:, None] >= 0) & (t + shifts[:, None] < length)
    assert torch.equal(y[survived], x[survived])
    assert y[~survived].isnan().all()


@SETTINGS
@given(batch=st.integers(1, 6), length=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_compact_of_suffix_is_a_shift(batch, length, seed):
    """Keeping a contiguous block is the same as shifting it to the end: compact_rows_ generalises shift_rows_."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, 2, generator=gen)
    start = torch.randint(0, length + 1, (batch,), generator=gen)
    stop = torch.minimum(start + torch.randint(0, length + 1, (batch,), generator=gen), torch.tensor(length))
    t = torch.arange(length)[None, :]
    keep = (t >= start[:, None]) & (t < stop[:, None])
    a, b = x.clone(), x.clone()
    kept = sk.compact_rows_(a, keep, dim=1, fill=-7)
    sk.shift_rows_(b, length - stop, dim=1, fill=-7)
    b[t.expand(batch, -1) < (length - kept)[:, None]] = -7
    assert torch.equal(kept, stop - start)
    assert torch.equal(a, b)
