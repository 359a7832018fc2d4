"""The ops are torch.library custom ops with fake implementations: they trace under torch.compile."""

import pytest
import torch
from conftest import backend_params
from kernel_cases import greedy_case, sampling_case

import specdec_kernels as sk


@pytest.mark.parametrize("backend", [p for p in backend_params() if p.values[0] != "triton"])
def test_compiled_step_equals_eager(backend, monkeypatch):
    monkeypatch.setenv("SPECDEC_CHECKS", "0")  # value checks read tensors on the host: a graph break by design
    drafts, logits, num_draft = greedy_case(4, 3, 50, seed=41)
    case = sampling_case(4, 3, 50, seed=42)

    def step(drafts, logits, num_draft, cache, uniform, exponential):
        tokens, accepted = sk.verify_greedy(drafts, logits, num_draft, backend=backend)
        sampled, _ = sk.rejection_sample(case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                                         uniform=uniform, exponential=exponential, backend=backend)
        sk.shift_rows_(cache, accepted.max() - accepted, dim=-2, backend=backend)
        return tokens, sampled, cache * 2

    cache = torch.randn(4, 2, 9, 3)
    eager = step(drafts, logits, num_draft, cache.clone(), case.uniform, case.exponential)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    traced = compiled(drafts, logits, num_draft, cache.clone(), case.uniform, case.exponential)
    for a, b in zip(eager, traced):
        assert torch.equal(a, b)
