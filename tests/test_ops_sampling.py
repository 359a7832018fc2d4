"""accept_lengths, verify_greedy and rejection_sample: every backend equals the reference exactly, and the
reference equals a naive per-row loop written straight from the contract."""

import pytest
import torch
from conftest import backend_params, device_generator, run
from kernel_cases import FLOAT_DTYPES, SAMPLING_SHAPES, greedy_case, poisoned_outputs, sampling_case  # noqa: F401

import specdec_kernels as sk
from specdec_kernels import reference as ref

BACKENDS = backend_params()


# ------------------------------------------------------------------------------------ the naive per-row oracle

def naive_greedy(drafts, logits, num_draft):
    batch, k = drafts.shape
    tokens = torch.full((batch, k + 1), -1, dtype=torch.int64)
    accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        n = k if num_draft is None else int(num_draft[b])
        a = 0
        while a < n and int(drafts[b, a]) == int(logits[b, a].float().argmax()):
            a += 1
        tokens[b, :a] = drafts[b, :a]
        tokens[b, a] = int(logits[b, a].float().argmax())
        accepted[b] = a
    return tokens, accepted


def naive_rejection(case):
    drafts, q, p = case.draft_tokens, case.draft_probs, case.target_probs.float()
    batch, k = drafts.shape
    vocab = p.shape[-1]
    tokens = torch.full((batch, k + 1), -1, dtype=torch.int64)
    accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        n = k if case.num_draft is None else int(case.num_draft[b])
        a = 0
        while a < n:
            d = int(drafts[b, a])
            qd = float(q[b, a, d].float()) if q is not None else 1.0
            if not case.uniform[b, a] * qd < p[b, a, d]:  # float32 tensor times an exact float32 value
                break
            a += 1
        if a < n:
            qrow = q[b, a].float() if q is not None else torch.nn.functional.one_hot(drafts[b, a], vocab).float()
            r = (p[b, a] - qrow).clamp_min(0)
            dist = r if bool((r > 0).any()) else p[b, a]
        else:
            dist = p[b, a]
        tokens[b, :a] = drafts[b, :a]
        tokens[b, a] = int((dist / case.exponential[b]).argmax())
        accepted[b] = a
    return tokens, accepted


@pytest.mark.parametrize("batch,k,vocab", SAMPLING_SHAPES)
@pytest.mark.parametrize("ties", [False, True], ids=["peaked", "ties"])
def test_reference_greedy_matches_naive_loop(batch, k, vocab, ties):
    drafts, logits, num_draft = greedy_case(batch, k, vocab, seed=1, ties=ties)
    got = ref.verify_greedy(drafts, logits, num_draft)
    want = naive_greedy(drafts, logits, num_draft)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("batch,k,vocab", SAMPLING_SHAPES)
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "no-q"])
def test_reference_rejection_matches_naive_loop(batch, k, vocab, with_q):
    case = sampling_case(batch, k, vocab, seed=2, with_q=with_q)
    got = ref.rejection_sample(case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                               uniform=case.uniform, exponential=case.exponential)
    want = naive_rejection(case)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ---------------------------------------------------------------------------- every backend against reference

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,k", [(1, 1), (4, 5), (64, 7), (3, 0)], ids=["B1-K1", "B4-K5", "B64-K7", "B3-K0"])
@pytest.mark.parametrize("ragged", [True, False], ids=["ragged", "full"])
def test_accept_lengths(backend, batch, k, ragged, poisoned_outputs):  # noqa: F811
    gen = torch.Generator().manual_seed(batch * 10 + k)
    matches = torch.rand(batch, k, generator=gen) < 0.8
    num_draft = torch.randint(0, k + 1, (batch,), generator=gen) if ragged else None
    got = run(sk.accept_lengths, matches, num_draft, backend=backend)
    assert got.dtype == torch.int64
    assert torch.equal(got, ref.accept_lengths(matches, num_draft))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,k,vocab", SAMPLING_SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("ragged", [True, False], ids=["ragged", "full"])
def test_verify_greedy_equals_reference(backend, batch, k, vocab, dtype, ragged, poisoned_outputs):  # noqa: F811
    for seed, ties in ((3, False), (4, True)):
        drafts, logits, num_draft = greedy_case(batch, k, vocab, seed, dtype, ragged=ragged, ties=ties)
        tokens, accepted = run(sk.verify_greedy, drafts, logits, num_draft, backend=backend)
        want_tokens, want_accepted = ref.verify_greedy(drafts, logits, num_draft)
        assert torch.equal(accepted, want_accepted)
        assert torch.equal(tokens, want_tokens)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,k,vocab", SAMPLING_SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "no-q"])
def test_rejection_sample_equals_reference(backend, batch, k, vocab, dtype, with_q, poisoned_outputs):  # noqa: F811
    for ragged in (True, False):
        case = sampling_case(batch, k, vocab, seed=5, dtype=dtype, with_q=with_q, ragged=ragged)
        got = run(sk.rejection_sample, case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                                  uniform=case.uniform, exponential=case.exponential, backend=backend)
        want = ref.rejection_sample(case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                                    uniform=case.uniform, exponential=case.exponential)
        assert torch.equal(got[1], want[1])
        assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejection_sample_same_generator_same_tokens(backend):
    case = sampling_case(6, 4, 111, seed=6)
    runs = [run(sk.rejection_sample, case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                                generator=device_generator(123), backend=name)
            for name in (backend, "torch", backend)]
    for tokens, accepted in runs[1:]:
        assert torch.equal(tokens, runs[0][0]) and torch.equal(accepted, runs[0][1])
    other = run(sk.rejection_sample, case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                                generator=device_generator(124), backend=backend)
    assert not torch.equal(other[0], runs[0][0]), "a different seed should change some token"


# ------------------------------------------------------------------------------------------ peer-style cases

def one_hot(ids, vocab):
    return torch.nn.functional.one_hot(torch.as_tensor(ids), vocab).float()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "no-q"])
def test_one_hot_targets_exact(backend, with_q):
    """Rows: perfect match plus bonus, first draft rejected, mismatch in the middle, zero drafts."""
    vocab, k = 13, 3
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [-1, -1, -1]])
    num_draft = torch.tensor([3, 3, 3, 0])
    target_ids = torch.tensor([[1, 2, 3, 11], [12, 5, 6, 0], [7, 8, 10, 1], [9, 0, 0, 0]])
    p = one_hot(target_ids, vocab)
    q = torch.full((4, k, vocab), 1.0 / vocab) if with_q else None
    tokens, accepted = run(sk.rejection_sample, drafts, q, p, num_draft, generator=device_generator(0),
                                           backend=backend)
    assert accepted.tolist() == [3, 0, 2, 0]
    assert tokens.tolist() == [[1, 2, 3, 11], [12, -1, -1, -1], [7, 8, 10, -1], [9, -1, -1, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_peer_cases(backend):
    vocab = 10
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, -1, -1]])
    num_draft = torch.tensor([3, 3, 3, 1])
    target_ids = torch.tensor([[1, 2, 3, 0], [0, 5, 6, 1], [7, 1, 9, 2], [1, 3, 0, 0]])
    logits = one_hot(target_ids, vocab) * 5
    tokens, accepted = run(sk.verify_greedy, drafts, logits, num_draft, backend=backend)
    assert accepted.tolist() == [3, 0, 1, 1]
    assert tokens.tolist() == [[1, 2, 3, 0], [0, -1, -1, -1], [7, 1, -1, -1], [1, 3, -1, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_probability_is_never_emitted(backend):
    """All drafts have target probability 0 (all rejected); the residual puts no mass on the zero entries."""
    gen = torch.Generator().manual_seed(7)
    batch, k, vocab = 16, 4, 31
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen), -1)
    p[..., :10] = 0  # ids 0..9 impossible under the target
    p = p / p.sum(-1, keepdim=True)
    drafts = torch.randint(0, 10, (batch, k), generator=gen)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen), -1)
    for trial in range(5):
        tokens, accepted = run(sk.rejection_sample, drafts, q, p, generator=device_generator(trial),
                                               backend=backend)
        assert (accepted == 0).all()
        assert (tokens[:, 0] >= 10).all() and (tokens[:, 1:] == -1).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_invalid_draft_ids_stay_in_range(backend, monkeypatch):
    """With value checks off a draft id outside [0, V) is rejected, never read out of bounds or emitted."""
    monkeypatch.setenv("SPECDEC_CHECKS", "0")
    vocab = 9
    drafts = torch.tensor([[vocab + 5, 1], [-3, 2], [1, 100]])
    p = torch.full((3, 3, vocab), 1.0 / vocab)
    tokens, accepted = run(sk.rejection_sample, drafts, None, p, generator=device_generator(1),
                                           backend=backend)
    assert accepted.tolist()[:2] == [0, 0] and int(accepted[2]) <= 1
    emitted = tokens[tokens >= 0]
    assert ((emitted >= 0) & (emitted < vocab)).all() and emitted.numel() == int((accepted + 1).sum())
    tokens, accepted = run(sk.verify_greedy, drafts, p.log(), backend=backend)
    assert accepted.tolist()[:2] == [0, 0]
    assert ((tokens[:, 0] >= 0) & (tokens[:, 0] < vocab)).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_padding_is_ignored(backend):
    """Whatever sits past num_draft (here -1 and garbage ids) does not change the result."""
    case = sampling_case(8, 5, 64, seed=8)
    garbage = case.draft_tokens.clone()
    slots = torch.arange(5)[None, :]
    garbage[slots >= case.num_draft[:, None]] = 3
    args = dict(uniform=case.uniform, exponential=case.exponential, backend=backend)
    a = run(sk.rejection_sample, case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft, **args)
    b = run(sk.rejection_sample, garbage, case.draft_probs, case.target_probs, case.num_draft, **args)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert (a[1] <= case.num_draft).all()
