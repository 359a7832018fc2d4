"""The ops are torch.library ops with fake implementations: they trace under torch.compile, and the compiled graph
runs the backend selected around it (a conflicting per-call backend= is refused).

The check runs in a fresh interpreter: Dynamo keeps process-wide state, and after the engine tests have run
in the same process torch 2.13's fake-tensor run of a custom op has been seen failing ('vector::reserve')
for reasons inside torch. A user compiles in their own process, which this reproduces.
"""

import os
import subprocess
import sys

import pytest
from conftest import backend_params

SCRIPT = r"""
import sys, torch
sys.path.insert(0, "tests")
from kernel_cases import greedy_case, sampling_case
import specdec_kernels as sk
backend = sys.argv[1]
sk.set_backend(backend)  # a compiled graph runs the process-wide backend (the kernel reads it when the graph runs)
drafts, logits, num_draft = greedy_case(4, 3, 50, seed=41)
case = sampling_case(4, 3, 50, seed=42)

def step(drafts, logits, num_draft, cache, uniform, exponential):
    tokens, accepted = sk.verify_greedy(drafts, logits, num_draft, backend=backend)
    sampled, _ = sk.rejection_sample(case.draft_tokens, case.draft_probs, case.target_probs, case.num_draft,
                                     uniform=uniform, exponential=exponential, backend=backend)
    kept = sk.compact_rows_(cache, torch.ones(4, 9, dtype=torch.bool), dim=-2, backend=backend)
    sk.shift_rows_(cache, accepted.max() - accepted, dim=-2, backend=backend)
    return tokens, sampled, cache * 2, kept

cache = torch.randn(4, 2, 9, 3)
eager = step(drafts, logits, num_draft, cache.clone(), case.uniform, case.exponential)
compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
traced = compiled(drafts, logits, num_draft, cache.clone(), case.uniform, case.exponential)
assert all(torch.equal(a, b) for a, b in zip(eager, traced)), "compiled results differ from eager"
print("compiled == eager")

other = "torch" if backend != "torch" else "cpp"
if other in sk.available_backends():  # a per-call override that cannot reach the graph is refused, loudly
    def mismatched(drafts, logits):
        return sk.verify_greedy(drafts, logits, backend=other)
    try:
        torch.compile(mismatched, backend="aot_eager", fullgraph=True)(drafts, logits)
        raise SystemExit("a conflicting backend= was accepted under torch.compile")
    except RuntimeError as e:
        assert "cannot travel into the graph" in str(e), str(e)[:500]
    print("override refused")
"""


@pytest.mark.parametrize("backend", [p for p in backend_params() if p.values[0] != "triton"])
def test_compiled_step_equals_eager(backend):
    env = dict(os.environ, SPECDEC_CHECKS="0")  # value checks read tensors on the host: a graph break by design
    run = subprocess.run([sys.executable, "-c", SCRIPT, backend], env=env, capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0 and "compiled == eager" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]
