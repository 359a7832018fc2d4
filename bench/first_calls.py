"""How fast are a fresh decoder's first calls? Plain decoding, the early exit judging plain steps (at each
--judge-shares, the default's JUDGE_SHARE first), the early exit not judging them, and fixed K on the demo pair,
each trial with fresh decoders (nothing learned yet), called --calls times in a shuffled order per call.

    python bench/first_calls.py --category english --batch-size 1 --trials 8 --judge-shares 0.005 0.01

A controller's first call is where it has the least evidence: a few early misses can keep it plain for most of
the call (README, "Speculation that pays for itself"). bench/controller_ab.py reuses its decoders across
repeats, so after its first repeat it measures steady state; this measures the start, trial by trial. A
speed-up is plain's CPU time over the decoder's in the same call of the same trial; the table gives the
median and mean over trials, the mean width and the plain steps a call. Every decoder's output is checked
against plain decoding's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import torch

from specdec.apps.prompts import by_category, encode, load_prompt_records
from specdec.decoder import SpeculativeDecoder
from specdec.drafting.early_exit import JUDGE_SHARE, EarlyExitDrafter
from specdec.models.demo import DRAFT_LAYERS, build_default_pair


def decoder_names(shares) -> list[str]:
    return [f"judging {s:g}" for s in shares] + ["not judging", "fixed K"]


def fresh_decoders(target, k: int, shares) -> dict:
    def early(**kw):
        return EarlyExitDrafter(target, DRAFT_LAYERS, **kw)
    out = {"plain": SpeculativeDecoder(target, None, scheduler="autoregressive")}
    for name, share in zip(decoder_names(shares), shares):
        out[name] = SpeculativeDecoder(target, early(judge_share=share), num_draft_tokens=k)
    out["not judging"] = SpeculativeDecoder(target, early(judge_plain=False), num_draft_tokens=k)
    out["fixed K"] = SpeculativeDecoder(target, early(), num_draft_tokens=k, adaptive=False)
    return out


def measure(target, ids, batch_size: int, *, trials: int, calls: int, max_new: int, k: int = 4,
            shares=(JUDGE_SHARE,), seed: int = 0) -> list[dict]:
    """Per call index: {decoder: {speedups (one per trial), mean_width, plain_steps (means over trials)}}."""
    if trials < 1 or calls < 1:
        raise ValueError(f"trials and calls must be >= 1, got {trials} and {calls}")
    names = decoder_names(shares)
    out = [{n: {"speedups": [], "widths": [], "plain": []} for n in names} for _ in range(calls)]
    want = None
    for trial in range(trials):
        decoders = fresh_decoders(target, k, shares)
        order = random.Random(seed + trial)
        for call in range(calls):
            seconds = {}
            for name in order.sample(list(decoders), len(decoders)):
                c = time.process_time()
                res = decoders[name].generate(ids, max_new_tokens=max_new, batch_size=batch_size)
                seconds[name] = time.process_time() - c
                want = res.sequences if want is None and name == "plain" else want
                if want is not None and res.sequences != want:
                    raise AssertionError(f"{name}: output differs from plain decoding (trial {trial}, call {call})")
                if name != "plain":
                    out[call][name]["widths"].append(res.stats.get("mean_width", 1.0))
                    out[call][name]["plain"].append(res.stats.get("plain_steps", 0))
            for name in names:
                out[call][name]["speedups"].append(seconds["plain"] / seconds[name])
    return [{name: {"speedups": r["speedups"], "median": statistics.median(r["speedups"]),
                    "mean": statistics.mean(r["speedups"]), "mean_width": statistics.mean(r["widths"]),
                    "plain_steps": statistics.mean(r["plain"])} for name, r in by_call.items()} for by_call in out]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--category", default="english")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--judge-shares", type=float, nargs="+", default=[JUDGE_SHARE],
                   help="EarlyExitDrafter(judge_share=...) of each judging decoder")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="write the per-trial speed-ups here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, _, tokenizer = build_default_pair()
    ids = encode(tokenizer, by_category(load_prompt_records(None))[args.category], False)
    rows = measure(target, ids, args.batch_size, trials=args.trials, calls=args.calls, max_new=args.max_new_tokens,
                   shares=args.judge_shares)
    print(f"demo pair, {args.category}: {len(ids)} prompts, batch {args.batch_size}, early exit, "
          f"{args.max_new_tokens} new tokens, {args.trials} trials of fresh decoders, {args.threads} thread(s), "
          f"process CPU time; x plain: median (mean) over trials")
    print(f"{'call':>4}  " + "  ".join(f"{n:>26}" for n in rows[0]))
    for call, by_name in enumerate(rows, 1):
        cells = [f"{r['median']:.3f}x ({r['mean']:.3f}) w {r['mean_width']:.2f} p {r['plain_steps']:.0f}"
                 for r in by_name.values()]
        print(f"{call:>4}  " + "  ".join(f"{c:>26}" for c in cells))
    print("w: mean width; p: plain steps a call")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "calls": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
