"""Did a controller change help? The working tree's speculation controller against the one at a git revision,
side by side in one process on the demo pair, with fixed K and plain decoding beside them.

    python bench/controller_ab.py --rev HEAD~1 --category math --batch-size 4 --repeats 15
    python bench/controller_ab.py --rev HEAD~1 --drafter ngram --target ~/.cache/specdec/smollm2-135m-instruct \
        --prompts ../shared/data/spec_bench_questions.jsonl --per-category 5 --category math_reasoning --batch-size 1

Each repeat runs every decoder once in a seeded shuffled order (fresh decoders per process, so the controllers
learn from the same start); a speed-up is the median over repeats of plain's CPU time over the decoder's in the
same repeat. A cell of bench/speculation.py is path-dependent (a noisy early sample can keep a controller plain
for a whole call), so a change is read here, two controllers under the same noise, not across two table runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from specdec.apps.prompts import by_category, encode, load_prompt_records
from specdec.decoder import SpeculativeDecoder
from specdec.drafting.early_exit import EarlyExitDrafter
from specdec.drafting.ngram import NgramDrafter
from specdec.models.demo import DRAFT_LAYERS, build_default_pair
from specdec.models.hf import cheap_copy, load_causal_lm

ALL = "all"  # --category: every category's prompts, in order


def _source_at(rev: str, path: str) -> str:
    """specdec/scheduling/<path> as git revision `rev` holds it."""
    try:
        return subprocess.run(["git", "show", f"{rev}:specdec/scheduling/{path}"], check=True,
                              capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout
    except subprocess.CalledProcessError as e:
        raise ValueError(f"rev {rev!r}: git show failed: {e.stderr.strip()}") from None


def _load(name: str, source: str):
    """`source` loaded as module `name` (a module of today's specdec.scheduling package)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    try:
        spec = importlib.util.spec_from_file_location(name, f.name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    finally:
        os.unlink(f.name)
    return module


def _load_at(rev: str, module: str, tag: str, loaded: dict) -> str:
    """Load specdec/scheduling/<module>.py as git revision `rev` holds it, and first every sibling module it
    imports (`from .x import`), each as a module of today's package named by `tag`; its name, once per module."""
    if module in loaded:
        return loaded[module]
    source = _source_at(rev, f"{module}.py")
    for sibling in sorted(set(re.findall(r"^from \.(\w+) import", source, flags=re.M))):
        name = _load_at(rev, sibling, tag, loaded)
        source = re.sub(rf"^from \.{sibling} import", f"from .{name.rsplit('.', 1)[1]} import", source, flags=re.M)
    loaded[module] = f"specdec.scheduling._{module}_at_{tag}"
    _load(loaded[module], source)
    return loaded[module]


def category_prompts(groups: dict, category: str) -> list:
    """The prompts of `category` in groups ({category: [texts]}), or of every category in order for ALL."""
    if category == ALL:
        return [text for texts in groups.values() for text in texts]
    if category not in groups:
        raise ValueError(f"--category {category!r} is not in the prompts; they have {sorted(map(str, groups))} "
                         f"or {ALL!r}")
    return groups[category]


def controller_at(rev: str) -> type:
    """SpeculationController as specdec/scheduling/control.py defines it at git revision `rev`, over that
    revision's copies of every module of the package it imports (the cost and acceptance tables of estimates.py,
    the margins, the rest and early-stop rules: a change to any is what an A/B compares). All are loaded as
    modules of the current specdec.scheduling package, each import pointed at the revision's copy."""
    tag = "".join(c if c.isalnum() else "_" for c in rev)
    return sys.modules[_load_at(rev, "control", tag, {})].SpeculationController


def paired_ratio(baseline: list[float], seconds: list[float], *, level: float = 0.9, draws: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high) of baseline[i] / seconds[i] over paired repeats, with a `level` percentile-bootstrap
    interval of that median (repeats resampled with replacement, seeded). It covers the noise from repeat to
    repeat only. A decoder keeps its controller across repeats, and where one copy's early steps took it
    elsewhere its repeats stay alike: two copies of one controller (--rev HEAD) read 1.039x apart, interval
    1.014-1.065x, on english early exit at batch 1 (10 repeats; docs/controller_ab_earlyexit_english_b1.json).
    So a change is read against such an A/A run's spread, not against 1."""
    if len(baseline) != len(seconds) or not seconds:
        raise ValueError(f"need paired, non-empty timings, got {len(baseline)} and {len(seconds)}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    ratios = [b / s for b, s in zip(baseline, seconds)]
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    tail = (1 - level) / 2
    return (statistics.median(ratios), medians[int(tail * (draws - 1))], medians[int(round((1 - tail) * (draws - 1)))])


class TargetForwardClock:
    """Process CPU time inside the target model's outermost forwards, in `seconds`. What a decoder spends outside
    them (its drafting, planning, sampling, bookkeeping) is a few percent of a call, and barely moved by the
    forwards' own noise: a change to the controller's overhead reads there, where the speed-ups read noise."""

    def __init__(self, model):
        self.model, self.seconds, self._start, self._depth, self._hooks = model, 0.0, 0.0, 0, []

    def __enter__(self):
        self._hooks = [self.model.register_forward_pre_hook(self._pre),
                       self.model.register_forward_hook(self._post)]
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()

    def _pre(self, module, args):
        if not self._depth:
            self._start = time.process_time()
        self._depth += 1

    def _post(self, module, args, out):
        self._depth -= 1
        if not self._depth:
            self.seconds += time.process_time() - self._start


def measure(target, make_drafter, ids, batch_size: int, old_controller: type, *, repeats: int, max_new: int,
            k: int = 4, seed: int = 0, copies: int = 1) -> dict:
    """{decoder: {speedup, mean_width, explore_steps, steps_per_call, control_us_per_step, outside_us_per_plain_step,
    exact, seconds, copy_seconds, copies}}: the
    rows of plain, the working tree's controller ("new"), the revision's ("old") and fixed K; make_drafter() gives
    each its own drafter. Each controller runs in `copies` decoders of its own, every copy once a repeat: its
    seconds per repeat are its copies' mean (each copy's in copy_seconds), and "copies" holds each copy's own
    speed-up (median over repeats). A copy keeps its
    controller across repeats, so copies apart are what one controller's path is worth (see paired_ratio).
    outside_us_per_plain_step: a call's CPU time outside the target's forwards (a draft model's forwards and an
    early exit's layers count as outside), median over repeats, per copy, over plain decoding's step count."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be an int >= 1, got {copies!r}")
    options = None
    decoders = {"plain": SpeculativeDecoder(target, None, scheduler="autoregressive")}
    for c in range(copies):
        new = decoders[("new", c)] = SpeculativeDecoder(target, make_drafter(), num_draft_tokens=k)
        old = decoders[("old", c)] = SpeculativeDecoder(target, make_drafter(), num_draft_tokens=k)
        if options is None:
            options = {"draft_cost_ratio": new.controller.draft_ratio}
            if "draft_first_columns" in inspect.signature(old_controller).parameters:  # an older one prices 2
                options["draft_first_columns"] = new.controller.first_columns
        old.controller = old_controller(k, **options)
    decoders["fixed"] = SpeculativeDecoder(target, make_drafter(), num_draft_tokens=k, adaptive=False)
    seconds = {n: [] for n in decoders}
    outside = {n: [] for n in decoders}  # seconds outside the target's forwards (TargetForwardClock)
    stats = {n: [] for n in decoders}
    outputs = {}
    order = random.Random(seed)
    with TargetForwardClock(target) as forwards:
        for _ in range(repeats):
            for name in order.sample(list(decoders), len(decoders)):
                forwards.seconds = 0.0
                c = time.process_time()
                res = decoders[name].generate(ids, max_new_tokens=max_new, batch_size=batch_size)
                seconds[name].append(time.process_time() - c)
                outside[name].append(seconds[name][-1] - forwards.seconds)
                stats[name].append(res.stats)
                outputs[name] = res.sequences
    plain = seconds["plain"]

    def speedup(times):
        return statistics.median(p / q for p, q in zip(plain, times))

    plain_steps = max(1, stats["plain"][-1]["steps"])
    out = {}
    for label in ("plain", "new", "old", "fixed"):
        names = [n for n in decoders if n == label or (isinstance(n, tuple) and n[0] == label)]
        st = [s for n in names for s in stats[n]]
        mean_seconds = [statistics.mean(t) for t in zip(*(seconds[n] for n in names))]
        steps = sum(s["steps"] for s in st)
        out[label] = {
            "speedup": speedup(mean_seconds),
            "mean_width": statistics.mean(s.get("mean_width", 1.0) for s in st),
            "explore_steps": sum(s.get("explore_steps", 0) for s in st),
            "steps_per_call": steps / len(st),
            "control_us_per_step": 1e6 * sum(s.get("control_seconds", 0.0) for s in st) / max(1, steps),
            # per step of plain decoding: its steps, since every decoder emits the same tokens (exact)
            "outside_us_per_plain_step": 1e6 * statistics.median(
                sum(t) for t in zip(*(outside[n] for n in names))) / len(names) / plain_steps,
            "exact": all(outputs[n] == outputs["plain"] for n in names),
            "seconds": mean_seconds,
            "copy_seconds": [seconds[n] for n in names],
            "copies": [speedup(seconds[n]) for n in names],
        }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", default="HEAD~1", help="git revision of the controller to compare with")
    p.add_argument("--category", default="math",
                   help=f"a category of the prompts, or {ALL!r}: every category's prompts in order (real-demo's "
                        "'all (mixed)' cell at a batch larger than a category)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--drafter", choices=("earlyexit", "layerskip", "ngram", "fp16"), default="earlyexit",
                   help="the demo target's first 2 layers over its own cache (earlyexit) or as a draft model with its "
                        "own cache (layerskip), the n-gram drafter, or a float16 copy of --target (fp16)")
    p.add_argument("--target", help="a local Hugging Face folder instead of the demo pair (drafters ngram, fp16)")
    p.add_argument("--prompts", default=None, help="prompts file, or 'specbench-style' (default: the shipped ones)")
    p.add_argument("--per-category", type=int, default=None, help="the first N prompts of each category")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--copies", type=int, default=1,
                   help="decoders per controller (each its own path; a controller's time is their mean)")
    p.add_argument("--json", help="write every decoder's row (with its per-repeat seconds) here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    old = controller_at(args.rev)
    if args.target:
        if args.drafter not in ("ngram", "fp16"):
            p.error(f"--drafter {args.drafter} is the demo pair's; with --target use ngram or fp16")
        target, tokenizer = load_causal_lm(args.target)
        copy = cheap_copy(target) if args.drafter == "fp16" else None
        make = {"ngram": NgramDrafter, "fp16": lambda: copy}[args.drafter]
    else:
        if args.drafter == "fp16":
            p.error("--drafter fp16 needs --target")
        target, layerskip, tokenizer = build_default_pair()
        make = {"earlyexit": lambda: EarlyExitDrafter(target, DRAFT_LAYERS), "layerskip": lambda: layerskip,
                "ngram": NgramDrafter}[args.drafter]
    groups = by_category(load_prompt_records(args.prompts, per_category=args.per_category))
    try:
        texts = category_prompts(groups, args.category)
    except ValueError as e:
        p.error(str(e))
    ids = encode(tokenizer, texts, args.target is not None)
    rows = measure(target, make, ids, args.batch_size, old, repeats=args.repeats, max_new=args.max_new_tokens,
                   copies=args.copies)
    print(f"{args.target or 'demo pair'}, {args.category}: {len(ids)} prompts, batch {args.batch_size}, "
          f"{args.drafter}, {args.max_new_tokens} new tokens, {args.repeats} repeats, {args.threads} thread(s), process CPU time; "
          f"new = working tree, old = {args.rev}, {args.copies} decoder(s) each\n")
    print(f"{'decoder':8s} {'x plain':>8s} {'width':>6s} {'explore':>8s} {'control us/step':>16s} "
          f"{'outside us/plain step':>22s} exact")
    for name, r in rows.items():
        print(f"{name:8s} {r['speedup']:8.3f} {r['mean_width']:6.2f} {r['explore_steps']:8d} "
              f"{r['control_us_per_step']:16.1f} {r['outside_us_per_plain_step']:22.1f} {r['exact']}"
              + (f"  copies {' '.join(f'{x:.3f}' for x in r['copies'])}" if len(r["copies"]) > 1 else ""))
    mid, low, high = paired_ratio(rows["old"]["seconds"], rows["new"]["seconds"])
    print(f"\nnew over old: {mid:.3f}x, 90% bootstrap interval {low:.3f}-{high:.3f} over {args.repeats} paired "
          f"repeats (repeat-to-repeat noise only: an A/A run, --rev HEAD, has read 1.039x, 1.014-1.065x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "new_over_old": [mid, low, high]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
