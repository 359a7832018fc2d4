"""Memory follows the real length of the sequences, not max_new_tokens.

The KV slabs (the target's and the draft's: EQSPEC's RaggedKV, EXSPEC's SlotPool) start with a bounded room
past the prompt (specdec.kv.ragged.initial_room) and grow by doubling as rows really grow. Two checks:

- max_new_tokens=2**20 with an EOS as the first token costs the process under 64 MiB of peak RSS. When the slabs
  were preallocated for max_new_tokens (rounded up to a power of two), this very measurement read 2.0 GiB
  (autoregressive, n-gram) to 3.0 GiB (with a draft model) for these two-row batches of a tiny model. Peak RSS is measured in a fresh subprocess from
  the kernel's own high-water mark (VmHWM in /proc/self/status, reset through /proc/self/clear_refs), so it sees
  every page torch touches, whichever allocator it went through (tracemalloc sees only Python's own
  allocations, not torch's). The measurement is calibrated in the same process: a 128 MiB torch tensor must read
  as at least 120 MiB, or the test fails rather than pass on a method that measures nothing.
- greedy equivalence holds for runs that cross several growth steps (the initial room set to 0 here), for
  EQSPEC and EXSPEC under shift and mask realignment, with the target and draft slabs both growing.
"""

import json
import os
import subprocess
import sys

import pytest

from engine_models import SPEC_SCHEDULERS, decoder, draft, prompts, reference, target
from specdec.kv import ragged as batch_module
from specdec.scheduling import exspec as exspec_module
from specdec.kv.slab import SlabCache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_MIB = 64

MEASURE = r"""
import json, sys
import torch
torch.set_num_threads(1)
from specdec import SpeculativeDecoder
from specdec.models import tiny_model
from specdec.drafting.ngram import NgramDrafter

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)

def peak_growth(fn):
    reset_peak()
    before = status("VmRSS")
    keep = fn()
    return status("VmHWM") - before, keep

max_new = int(sys.argv[1])
# rotary positions: no position table, so a limit of 2**21 costs nothing
target = tiny_model("llama", vocab_size=64, max_positions=2 ** 21, seed=1)
draft = tiny_model("llama", vocab_size=64, num_layers=1, max_positions=2 ** 21, seed=2)
prompt = [[3, 1, 4, 1, 5, 9, 2, 6]]
with torch.no_grad():
    eos = int(target(torch.tensor(prompt)).logits[0, -1].argmax())  # the first token: EOS at once
calibration, _ = peak_growth(lambda: torch.zeros(128 * 2 ** 20 // 4).add_(1))
out = {"calibration": calibration}
for name, make in [("autoregressive", lambda: SpeculativeDecoder(target, None, scheduler="autoregressive")),
                   ("eqspec-model", lambda: SpeculativeDecoder(target, draft, num_draft_tokens=4)),
                   ("exspec-model", lambda: SpeculativeDecoder(target, draft, num_draft_tokens=4, scheduler="exspec")),
                   ("eqspec-ngram", lambda: SpeculativeDecoder(target, NgramDrafter(), num_draft_tokens=4))]:
    dec = make()
    dec.generate(prompt, max_new_tokens=8, eos_token_id=[])  # warm-up: lazy imports, kernels, allocator pools
    growth, res = peak_growth(lambda: dec.generate(prompt * 2, max_new_tokens=max_new, eos_token_id=eos))
    assert res.sequences == [[eos], [eos]], res.sequences
    out[name] = growth
print(json.dumps(out))
"""


def measure(max_new: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(max_new)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc to measure peak RSS")
def test_huge_max_new_tokens_with_immediate_eos_costs_little_memory():
    mib = {k: v / 2 ** 20 for k, v in measure(2 ** 20).items()}
    assert mib["calibration"] >= 120, f"the peak-RSS measurement does not see torch allocations: {mib}"
    for name in ("autoregressive", "eqspec-model", "exspec-model", "eqspec-ngram"):
        assert mib[name] < LIMIT_MIB, f"{name}: peak RSS grew by {mib[name]:.1f} MiB ({mib})"


def test_initial_room_is_bounded():
    room = batch_module.initial_room
    assert room(2 ** 20, 4) <= batch_module.RESERVE_COLUMNS + 2 * 5
    assert room(3, 4) == 3 + 2 * 5  # short runs still get everything at once
    assert room(0, 1) == 4


class GrowthCounter:
    """Counts the slabs' real reallocations: SlabCache.relocate to a larger capacity, SlotPool._grow."""

    def __init__(self, monkeypatch):
        self.slab = self.pool = 0
        relocate, grow = SlabCache.relocate, exspec_module.SlotPool._grow
        counter = self

        def counted_relocate(cache, capacity, new_start):
            counter.slab += capacity > cache.capacity
            return relocate(cache, capacity, new_start)

        def counted_grow(pool, capacity):
            counter.pool += capacity > pool.slab.shape[-2]
            return grow(pool, capacity)

        monkeypatch.setattr(SlabCache, "relocate", counted_relocate)
        monkeypatch.setattr(exspec_module.SlotPool, "_grow", counted_grow)


@pytest.mark.parametrize("realign", ["shift", "mask"])
@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_greedy_equivalence_across_growth_steps(monkeypatch, scheduler, realign):
    monkeypatch.setattr(batch_module, "RESERVE_COLUMNS", 0)  # room for one step only: grow from the start
    growth = GrowthCounter(monkeypatch)
    ps = prompts((3, 1, 6, 2, 9), seed=90)
    dec = decoder(target("llama"), draft("llama", "agree"), scheduler, window=3, num_draft_tokens=4,
                  realign=realign)
    res = dec.generate(ps, max_new_tokens=70, batch_size=3, eos_token_id=[])
    assert res.sequences == reference("llama", ps, 70)
    assert res.stats["ragged_steps"] > 0
    # prompts of at most 9 tokens start in 16- or 32-column slabs and end near 80 columns: several doublings
    # of the target's and the draft's slabs (EQSPEC: RaggedKV.reserve; EXSPEC: the pools' scatter)
    grown = growth.pool if scheduler == "exspec" else growth.slab
    assert grown >= 4, (growth.slab, growth.pool)
