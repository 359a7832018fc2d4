"""bench/controller_ab.py: a controller loaded from a git revision runs beside today's, and every decoder is exact."""

import importlib.util
import os
import statistics

import pytest
import torch

from specdec.drafting.ngram import NgramDrafter
from specdec.models.hf import load_causal_lm
from specdec.scheduling.control import SpeculationController

HERE = os.path.dirname(__file__)


def _bench():
    path = os.path.join(HERE, "..", "bench", "controller_ab.py")
    spec = importlib.util.spec_from_file_location("controller_ab", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_revisions_controller_runs_beside_todays(tiny_folder):
    bench = _bench()
    old = bench.controller_at("HEAD")
    assert old is not SpeculationController and old.__module__.startswith("specdec.scheduling._control_at_")
    # the revision's own cost and acceptance tables, not today's (an A/B of an estimates change compares them)
    assert type(old(4).target_costs).__module__.startswith("specdec.scheduling._estimates_at_")
    # and its rest and early-stop rules (the controller's own modules beside control.py)
    assert [base.__module__.split("_at_")[0] for base in old.__mro__[1:-1]] == \
        ["specdec.scheduling._rest", "specdec.scheduling._early_stop"]
    model, _ = load_causal_lm(tiny_folder)
    torch.manual_seed(0)
    rows = bench.measure(model, NgramDrafter, [[3, 4, 3, 4, 3, 4], [5, 6, 5, 6], [7, 8, 9]], 2, old,
                         repeats=2, max_new=6)
    assert list(rows) == ["plain", "new", "old", "fixed"]
    assert rows["plain"]["speedup"] == 1.0
    for name, r in rows.items():
        assert r["exact"], name
        assert r["speedup"] > 0 and r["mean_width"] >= 1.0
    assert rows["fixed"]["mean_width"] > 1.0  # fixed K verifies its n-gram matches
    # time outside the target's forwards: some, and less than a whole call per plain step
    for name, r in rows.items():
        total = 1e6 * statistics.median(r["seconds"]) / rows["plain"]["steps_per_call"]
        assert 0 < r["outside_us_per_plain_step"] < total, name
    assert [len(r["copies"]) for r in rows.values()] == [1, 1, 1, 1]
    assert all(len(r["seconds"]) == 2 for r in rows.values())


def test_copies_each_run_and_their_mean_is_the_controllers_time(tiny_folder):
    bench = _bench()
    model, _ = load_causal_lm(tiny_folder)
    torch.manual_seed(0)
    rows = bench.measure(model, NgramDrafter, [[3, 4, 3, 4, 3, 4], [5, 6, 5, 6]], 2, SpeculationController,
                         repeats=3, max_new=5, copies=3)
    assert list(rows) == ["plain", "new", "old", "fixed"]
    for name in ("new", "old"):
        r = rows[name]
        assert r["exact"] and len(r["copies"]) == 3 and len(r["copy_seconds"]) == 3
        assert r["seconds"] == [statistics.mean(t) for t in zip(*r["copy_seconds"])]  # per repeat, the copies' mean
        plain = rows["plain"]["seconds"]
        assert r["speedup"] == statistics.median(p / q for p, q in zip(plain, r["seconds"]))
        assert r["copies"] == [statistics.median(p / q for p, q in zip(plain, c)) for c in r["copy_seconds"]]
    assert len(rows["fixed"]["copies"]) == 1 and len(rows["plain"]["copies"]) == 1
    with pytest.raises(ValueError, match="copies must be an int >= 1, got 0"):
        bench.measure(model, NgramDrafter, [[3, 4]], 1, SpeculationController, repeats=1, max_new=2, copies=0)


def test_bad_revision_and_repeats_are_named(tiny_folder):
    bench = _bench()
    with pytest.raises(ValueError, match="rev 'no-such-rev': git show failed"):
        bench.controller_at("no-such-rev")
    model, _ = load_causal_lm(tiny_folder)
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        bench.measure(model, NgramDrafter, [[3, 4]], 1, SpeculationController, repeats=0, max_new=2)


def test_paired_ratio_brackets_the_median_and_narrows_with_agreement():
    bench = _bench()
    # a constant ratio: every resample has the same median, so the interval is that point
    assert bench.paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == (2.0, 2.0, 2.0)
    rng = __import__("random").Random(3)
    base = [1.0 + rng.random() for _ in range(15)]
    noisy = [b / (1.0 + 0.1 * (rng.random() - 0.5)) for b in base]  # ratios within 0.95-1.05
    mid, low, high = bench.paired_ratio(base, noisy, seed=1)
    assert low <= mid <= high and 0.95 <= low < high <= 1.05
    assert bench.paired_ratio(base, noisy, seed=1) == (mid, low, high)  # seeded: the same interval again
    wider = bench.paired_ratio(base, noisy, level=0.99, seed=1)
    assert wider[1] <= low and wider[2] >= high
    # paired: reversing one list's order changes the ratios, so the answer must change too
    assert bench.paired_ratio(base, noisy[::-1], seed=1) != (mid, low, high)


def test_paired_ratio_bad_input_is_named():
    bench = _bench()
    with pytest.raises(ValueError, match="need paired, non-empty timings, got 2 and 1"):
        bench.paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="need paired, non-empty timings, got 0 and 0"):
        bench.paired_ratio([], [])
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\), got 1.5"):
        bench.paired_ratio([1.0], [1.0], level=1.5)


def test_category_all_mixes_every_category_in_order_and_a_missing_one_is_named():
    bench = _bench()
    groups = {"qa": ["q1", "q2"], "rag": ["r1"], "math": ["m1", "m2"]}
    assert bench.category_prompts(groups, "rag") == ["r1"]
    assert bench.category_prompts(groups, bench.ALL) == ["q1", "q2", "r1", "m1", "m2"]
    with pytest.raises(ValueError, match=r"--category 'code' is not in the prompts; they have \['math', 'qa', 'rag'\]"):
        bench.category_prompts(groups, "code")
