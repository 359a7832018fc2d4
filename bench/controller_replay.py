"""Does a controller change keep every decision? Record the speculation controller's calls on the demo pair (the
timings it was fed, the offers, the outcomes), replay them through the working tree's controller and the one at a
git revision, and compare every plan (width, draft counts, exploration) and every early-stop answer.

    python bench/controller_replay.py --rev HEAD --drafter earlyexit --category english --batch-size 1

A replay feeds both controllers the same timings, so it is deterministic: a trimming change must replay
identically, and a first divergence is printed with its call. It also times both replays hot (back to back,
best of --timing-repeats), which is not what a call costs in situ (there the forward before it has evicted the
interpreter's working set, 2-3x slower) but moves with it.
"""

from __future__ import annotations

import argparse
import copy
import gc
import inspect
import math
import sys
import time

import torch

from controller_ab import controller_at
from specdec.apps.prompts import by_category, encode, load_prompt_records
from specdec.decoder import SpeculativeDecoder
from specdec.drafting.early_exit import EarlyExitDrafter
from specdec.drafting.ngram import NgramDrafter
from specdec.models.demo import DRAFT_LAYERS, build_default_pair

CALLS = ("observe_target", "observe_prefill", "observe_draft", "plan", "keep_drafting", "record", "judge", "begin_run", "forget")


def record_trace(controller) -> list:
    """Wrap `controller`'s calls (on the instance) so that each appends (name, args, kwargs) to the returned list;
    a Plan argument is stored as the index of the plan call that made it."""
    trace: list = []
    plans: dict[int, int] = {}

    def wrap(name, method):
        def call(*args, **kwargs):
            stored = tuple(("plan", plans[id(a)]) if id(a) in plans else copy.deepcopy(a) for a in args)
            trace.append((name, stored, copy.deepcopy(kwargs)))
            out = method(*args, **kwargs)
            if name == "plan":
                plans[id(out)] = len(trace) - 1
            return out
        return call

    for name in CALLS:
        setattr(controller, name, wrap(name, getattr(controller, name)))
    return trace


def decision(name: str, out):
    if name == "plan":
        return out.width, list(out.num_draft), out.explore
    return out if name == "keep_drafting" else None


def replay(cls, options: dict, k: int, trace: list) -> tuple[list, dict[str, float]]:
    """(the decisions of every plan and keep_drafting call, seconds the calls took by call name)."""
    ctrl = cls(k, **options)
    plans, out, seconds = {}, [], dict.fromkeys(CALLS, 0.0)
    for i, (name, args, kwargs) in enumerate(trace):
        args = tuple(plans[a[1]] if isinstance(a, tuple) and len(a) == 2 and a[0] == "plan" else a for a in args)
        t = time.perf_counter()
        call = getattr(ctrl, name, None)
        if call is None and name == "observe_prefill":  # a revision before the prefill table took them as steps
            call = ctrl.observe_target
        result = call(*args, **kwargs)
        seconds[name] += time.perf_counter() - t
        if name == "plan":
            plans[i] = result
        if name in ("plan", "keep_drafting"):
            out.append((i, name, decision(name, result)))
    return out, seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", default="HEAD", help="git revision of the controller to compare with")
    p.add_argument("--category", default="english")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--drafter", choices=("earlyexit", "layerskip", "ngram"), default="earlyexit")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=2, help="generate calls recorded (the controller carries over)")
    p.add_argument("--timing-repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    old_cls = controller_at(args.rev)
    target, layerskip, tokenizer = build_default_pair()
    ids = encode(tokenizer, by_category(load_prompt_records(None))[args.category], False)
    make = {"earlyexit": lambda: EarlyExitDrafter(target, DRAFT_LAYERS), "layerskip": lambda: layerskip,
            "ngram": NgramDrafter}[args.drafter]
    decoder = SpeculativeDecoder(target, make(), num_draft_tokens=4)
    live = decoder.controller
    options = {"draft_cost_ratio": live.draft_ratio, "draft_first_columns": live.first_columns}
    trace = record_trace(live)
    for _ in range(args.runs):
        decoder.generate(ids, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    new_cls = type(live)
    old_opts = {n: v for n, v in options.items() if n in inspect.signature(old_cls).parameters}
    new, _ = replay(new_cls, options, decoder.k, trace)
    old, _ = replay(old_cls, old_opts, decoder.k, trace)
    steps = sum(name == "plan" for name, _, _ in trace)
    print(f"demo pair, {args.category}, batch {args.batch_size}, {args.drafter}: {len(trace)} calls, {steps} plans "
          f"over {args.runs} run(s); new = working tree, old = {args.rev}")
    first = next((a, b) for a, b in zip(new + [None], old + [None]) if a != b) if new != old else None
    if first is None:
        print(f"decisions: identical ({len(new)} plan and keep_drafting answers)")
    else:
        a, b = first
        print(f"decisions: DIFFER at call {(a or b)[0]} ({(a or b)[1]}): new {a and a[2]}, old {b and b[2]}")
    best = {"new": {n: math.inf for n in CALLS}, "old": {n: math.inf for n in CALLS}}
    gc.disable()  # the trace's copies are many small objects: a collection inside one replay would be timed
    for _ in range(args.timing_repeats):  # alternating, so that a slow spell of the machine meets both
        for label, cls, opts in (("new", new_cls, options), ("old", old_cls, old_opts)):
            for name, seconds in replay(cls, opts, decoder.k, trace)[1].items():
                best[label][name] = min(best[label][name], seconds)
    gc.enable()
    for label, by_call in best.items():  # each call's best replay: their sum is a little under a whole replay's
        calls = ", ".join(f"{n} {s / steps * 1e6:.1f}" for n, s in by_call.items() if s > 0)
        print(f"{label}: {sum(by_call.values()) / steps * 1e6:6.1f} us a step, hot (best of "
              f"{args.timing_repeats} replays; by call: {calls})")
    return 0 if first is None else 1


if __name__ == "__main__":
    sys.exit(main())
