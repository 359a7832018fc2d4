"""bench/controller_ab.py: a controller loaded from a git revision runs beside today's, and every decoder is exact."""

import importlib.util
import os

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


def test_bad_revision_and_repeats_are_named(tiny_folder):
    bench = _bench()
    with pytest.raises(ValueError, match="rev 'no-such-rev': git show failed"):
        bench.controller_at("no-such-rev")
    model, _ = load_causal_lm(tiny_folder)
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        bench.measure(model, NgramDrafter, [[3, 4]], 1, SpeculationController, repeats=0, max_new=2)
