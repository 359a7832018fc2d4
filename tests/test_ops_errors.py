"""Bad input: a ValueError (or RuntimeError for backends) naming the argument, raised before anything is
modified, on every backend."""

import re

import pytest
import torch
from conftest import backend_params

import specdec_kernels as sk

BACKENDS = backend_params()


def good_sampling(batch=3, k=4, vocab=11):
    gen = torch.Generator().manual_seed(31)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen), -1)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen), -1)
    return drafts, q, p


def bad(**overrides):
    drafts, q, p = good_sampling()
    args = dict(draft_tokens=drafts, draft_probs=q, target_probs=p, num_draft=None, uniform=None, exponential=None)
    args.update(overrides)
    return args


def nan_at(x, index):
    x = x.clone()
    x[index] = float("nan")
    return x


SAMPLING_ERRORS = [
    pytest.param(bad(target_probs=good_sampling(k=3)[2]), r"target_probs.*\(3, 5, V\)", id="K-mismatch"),
    pytest.param(bad(target_probs=good_sampling(batch=2)[2]), r"target_probs.*\(3, 5, V\)", id="batch-mismatch"),
    pytest.param(bad(draft_probs=good_sampling(vocab=12)[1]), r"draft_probs.*\(3, 4, 11\)", id="V-mismatch"),
    pytest.param(bad(draft_tokens=torch.zeros(3, 4, dtype=torch.int32)), r"draft_tokens.*int64", id="int32-ids"),
    pytest.param(bad(target_probs=torch.zeros(3, 5, 11, dtype=torch.int64)), r"target_probs.*dtype", id="int-probs"),
    pytest.param(bad(draft_tokens=torch.zeros(3, 4, 1, dtype=torch.int64)), r"draft_tokens.*2 dimensions",
                 id="3d-ids"),
    pytest.param(bad(num_draft=torch.tensor([0, 5, 1])), r"num_draft.*0\.\.K=4", id="num_draft-too-big"),
    pytest.param(bad(num_draft=torch.tensor([0, -1, 1])), r"num_draft.*0\.\.K=4", id="num_draft-negative"),
    pytest.param(bad(num_draft=torch.tensor([1, 2])), r"num_draft.*\(3,\)", id="num_draft-length"),
    pytest.param(bad(draft_tokens=torch.tensor([[0, 1, 2, 11]] * 3)), r"draft_tokens.*outside \[0, V=11\)",
                 id="id-too-big"),
    pytest.param(bad(draft_tokens=torch.tensor([[0, -1, 2, 3]] * 3)), r"draft_tokens.*outside", id="id-negative"),
    pytest.param(bad(target_probs=nan_at(good_sampling()[2], (1, 2, 3))), r"target_probs.*NaN", id="nan-target"),
    pytest.param(bad(draft_probs=nan_at(good_sampling()[1], (0, 0, 0))), r"draft_probs.*NaN", id="nan-draft"),
    pytest.param(bad(target_probs=-good_sampling()[2]), r"target_probs.*negative", id="negative-probs"),
    pytest.param(bad(uniform=torch.ones(3, 4)), r"uniform.*\[0, 1\)", id="uniform-range"),
    pytest.param(bad(uniform=torch.ones(3, 5)), r"uniform.*\(3, 4\)", id="uniform-shape"),
    pytest.param(bad(exponential=torch.zeros(3, 11)), r"exponential.*positive", id="exponential-zero"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("args,message", SAMPLING_ERRORS)
def test_rejection_sample_rejects(backend, args, message):
    with pytest.raises(ValueError, match=message):
        sk.rejection_sample(**args, backend=backend)


GREEDY_ERRORS = [
    pytest.param(dict(target_logits=torch.randn(3, 4, 11)), r"target_logits.*\(3, 5, V\)", id="K-mismatch"),
    pytest.param(dict(target_logits=torch.randn(3, 5, 0)), r"vocabulary", id="empty-vocab"),
    pytest.param(dict(target_logits=nan_at(torch.randn(3, 5, 11), (2, 4, 0))), r"target_logits.*NaN", id="nan"),
    pytest.param(dict(draft_tokens=torch.full((3, 4), 11)), r"outside \[0, V=11\)", id="id-too-big"),
    pytest.param(dict(num_draft=torch.tensor([1, 2, 5])), r"num_draft", id="num_draft-too-big"),
    pytest.param(dict(num_draft=torch.tensor([1.0, 2.0, 3.0])), r"num_draft.*int64", id="num_draft-float"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("override,message", GREEDY_ERRORS)
def test_verify_greedy_rejects(backend, override, message):
    args = dict(draft_tokens=torch.zeros(3, 4, dtype=torch.int64), target_logits=torch.randn(3, 5, 11),
                num_draft=None)
    args.update(override)
    with pytest.raises(ValueError, match=message):
        sk.verify_greedy(**args, backend=backend)


def test_accept_lengths_rejects():
    with pytest.raises(ValueError, match=r"matches.*bool"):
        sk.accept_lengths(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"num_draft.*0\.\.K=3"):
        sk.accept_lengths(torch.ones(2, 3, dtype=torch.bool), torch.tensor([1, 4]))


def kv_and_mask():
    gen = torch.Generator().manual_seed(32)
    return [torch.randn(3, 2, 9, 4, generator=gen), torch.randn(3, 2, 9, 4, generator=gen)], torch.ones(3, 9)


MOVE_ERRORS = [
    pytest.param(lambda kv, m: dict(tensors=kv, shifts=torch.tensor([1, 2])), r"tensors\[0\] has batch 3.*2 rows",
                 id="shifts-length"),
    pytest.param(lambda kv, m: dict(tensors=kv, shifts=torch.tensor([1.0, 2.0, 0.0])), r"shifts.*int64",
                 id="shifts-float"),
    pytest.param(lambda kv, m: dict(tensors=kv + [m], shifts=torch.tensor([1, 2, 0])), r"dim=-2.*tensors\[2\]",
                 id="dim-is-batch"),
    pytest.param(lambda kv, m: dict(tensors=kv, shifts=torch.tensor([1, 2, 0]), dim=4), r"dim=4", id="dim-range"),
    pytest.param(lambda kv, m: dict(tensors=[], shifts=torch.tensor([1, 2, 0])), r"non-empty", id="empty-list"),
    pytest.param(lambda kv, m: dict(tensors=kv + [torch.ones(2, 9, 1)], shifts=torch.tensor([1, 2, 0])),
                 r"tensors\[2\] has batch 2", id="batch-mismatch"),
    pytest.param(lambda kv, m: dict(tensors=kv + ["x"], shifts=torch.tensor([1, 2, 0])), r"tensors\[2\]",
                 id="not-a-tensor"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make,message", MOVE_ERRORS)
def test_shift_rows_rejects_and_modifies_nothing(backend, make, message):
    kv, mask = kv_and_mask()
    before = [x.clone() for x in kv]
    args = make(kv, mask)
    with pytest.raises(ValueError, match=message):
        sk.shift_rows_(**args, backend=backend)
    for x, y in zip(kv, before):
        assert torch.equal(x, y), "a rejected call modified a tensor"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("keep,message", [
    pytest.param(torch.ones(3, 8, dtype=torch.bool), r"length 9 along dim=-2.*T=8", id="keep-length"),
    pytest.param(torch.ones(2, 9, dtype=torch.bool), r"batch 3.*2 rows", id="keep-batch"),
    pytest.param(torch.ones(3, 9), r"keep.*bool", id="keep-float"),
])
def test_compact_rows_rejects_and_modifies_nothing(backend, keep, message):
    kv, _ = kv_and_mask()
    before = [x.clone() for x in kv]
    with pytest.raises(ValueError, match=message):
        sk.compact_rows_(kv, keep, backend=backend)
    for x, y in zip(kv, before):
        assert torch.equal(x, y)


def test_rejected_sampling_call_names_shapes():
    drafts, q, p = good_sampling()
    with pytest.raises(ValueError) as info:
        sk.rejection_sample(drafts, q, p[:, :4])
    assert re.search(r"shape \(3, 4, 11\)", str(info.value)), str(info.value)
