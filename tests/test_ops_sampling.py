"""accept_lengths, verify_greedy and rejection_sample: every backend equals the reference exactly, and the
reference equals the naive per-row loop written straight from the contract (specdec_kernels/sampling/naive.py)."""

import pytest
import torch
from conftest import backend_params, device_generator, run
from kernel_cases import FLOAT_DTYPES, SAMPLING_SHAPES, greedy_case, poisoned_outputs, sampling_case  # noqa: F401

import specdec_kernels as sk
from specdec_kernels import reference as ref
from specdec_kernels.sampling import naive

BACKENDS = backend_params()


# ------------------------------------------------------------------- the naive per-row oracle (sampling/naive.py)

@pytest.mark.parametrize("batch,k,vocab", SAMPLING_SHAPES)
@pytest.mark.parametrize("ties", [False, True], ids=["peaked", "ties"])
def test_reference_greedy_matches_naive_loop(batch, k, vocab, ties):
    drafts, logits, num_draft = greedy_case(batch, k, vocab, seed=1, ties=ties)
    got = ref.verify_greedy(drafts, logits, num_draft)
    want = naive.verify_greedy(drafts, logits, num_draft)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("batch,k,vocab", SAMPLING_SHAPES)
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "no-q"])
def test_reference_rejection_matches_naive_loop(batch, k, vocab, with_q):
    case = sampling_case(batch, k, vocab, seed=2, with_q=with_q)
    got = ref.rejection_sample(case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                               uniform=case.uniform, exponential=case.exponential)
    want = naive.rejection_sample(case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                                  uniform=case.uniform, exponential=case.exponential)
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


# ------------------------------------------------------------------ the GPU-shaped split paths of the triton kernels

@pytest.fixture
def split_everything(monkeypatch):
    """Make the triton backend spread every call over (row, position, vocab chunk) programs and merge partials,
    as it does on a GPU with a small batch (the interpreter's default is one program per row)."""
    from specdec_kernels import triton_utils
    from specdec_kernels.sampling import triton_kernels
    monkeypatch.setattr(triton_kernels, "PROGRAMS", 10**6)
    monkeypatch.setattr(triton_kernels, "MIN_CHUNK", 16)
    monkeypatch.setattr(triton_kernels, "SPLIT_BLOCK", 16)
    monkeypatch.setattr(triton_utils, "MAX_TILE", 64)


SPLIT_SHAPES = [pytest.param(1, 1, 111, id="B1-K1-V111"), pytest.param(3, 4, 50, id="B3-K4-V50"),
                pytest.param(2, 0, 37, id="B2-K0-V37"), pytest.param(2, 2, 1000, id="B2-K2-V1000")]


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] == "triton"])
@pytest.mark.parametrize("batch,k,vocab", SPLIT_SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [pytest.param(torch.float64, id="f64")])
def test_triton_split_verify_greedy_equals_reference(backend, batch, k, vocab, dtype, split_everything,
                                                     poisoned_outputs):  # noqa: F811
    for seed, ties in ((81, False), (82, True)):
        drafts, logits, num_draft = greedy_case(batch, k, vocab, seed, dtype, ties=ties)
        if ties:
            logits[..., vocab // 2:] = logits.amax(-1, keepdim=True)  # the maximum in several chunks
        got = run(sk.verify_greedy, drafts, logits, num_draft, backend=backend)
        want = ref.verify_greedy(drafts, logits, num_draft)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] == "triton"])
@pytest.mark.parametrize("batch,k,vocab", SPLIT_SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "no-q"])
def test_triton_split_rejection_sample_equals_reference(backend, batch, k, vocab, dtype, with_q, split_everything,
                                                        poisoned_outputs):  # noqa: F811
    for ragged in (True, False):
        case = sampling_case(batch, k, vocab, seed=83, dtype=dtype, with_q=with_q, ragged=ragged)
        args = (case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft)
        noise = dict(uniform=case.uniform, exponential=case.exponential)
        got = run(sk.rejection_sample, *args, **noise, backend=backend)
        want = ref.rejection_sample(*args, **noise)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] == "triton"])
def test_triton_split_ties_and_zero_residual(backend, split_everything):
    """Equal scores in different chunks go to the lowest index; an all-zero residual falls back to p; a row whose
    every logit is -inf gives index 0; unchecked NaN logits give the first NaN, as torch.argmax does."""
    vocab = 64
    p = torch.zeros(3, 2, vocab)
    p[:, :, 5] = p[:, :, 40] = 0.5  # ties across chunks (chunks of 16)
    drafts = torch.tensor([[5], [40], [7]])
    q = p[:, :1].clone()  # q == p at the rejected slot: residual all zero -> sample from p
    e = torch.ones(3, vocab)
    u = torch.tensor([[0.99], [1.0 - 2**-24], [0.0]])
    args = (drafts, q, p, None)
    got = run(sk.rejection_sample, *args, uniform=u, exponential=e, backend=backend)
    want = ref.rejection_sample(*args, uniform=u, exponential=e)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    logits = torch.full((2, 2, vocab), float("-inf"))
    logits[1, :, 33] = float("nan")
    logits[1, :, 50] = float("nan")
    logits[1, 1, 20] = 3.0
    d = torch.tensor([[0], [33]])
    got = run(sk.verify_greedy, d, logits, backend=backend, check_values=False)
    want = ref.verify_greedy(d, logits)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
