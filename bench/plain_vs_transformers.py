"""The engine's plain decoding against transformers' plain `generate`, at batch 1, per prompt category.

Both decode greedily, one prompt at a time, with the same model object; the outputs must match. The two runs of
a prompt are adjacent, in ABBA order over the pairs (engine first in even pairs, transformers first in odd ones),
because this machine's speed drifts by a quarter over seconds: a pair a few seconds apart shares its spell, and
alternating the order cancels what a run leaves to the next (its heap, its caches). A category's ratio is
transformers' time over the engine's, summed over the category's prompts, each prompt's time the median over
its pairs (so a prompt's slow spell does not move it, and longer prompts weigh what they cost).

    python bench/plain_vs_transformers.py --target ~/.cache/specdec/smollm2-135m-instruct \\
        --prompts ../shared/data/spec_bench_questions.jsonl --per-category 3 --pairs 4 \\
        --json docs/plain_vs_transformers.json

Without --target it runs the embedded demo pair's target (no model hub needed). Threads are pinned (1 by
default); times are the process's CPU time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from specdec.apps.prompts import by_category, encode, load_prompt_records
from specdec.apps.speed import EngineRun, TransformersRun, eos_and_pad, report, trim_after_eos
from specdec.models.demo import build_default_pair
from specdec.models.hf import load_causal_lm


def measure(target, categories: dict, *, max_new: int, pairs: int, show=print) -> list[dict]:
    """Rows {category, prompts, engine_s, transformers_s, speedup, pair_ratios, exact}; categories: {name:
    [token ids]}. speedup > 1: the engine is faster."""
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    eos, pad = eos_and_pad(target)
    engine = EngineRun(target, None, True, 1, "autoregressive")
    transformers = TransformersRun(target, "plain", pad_id=pad)
    rows = []
    for category, prompts in categories.items():
        times = {"engine": [], "transformers": []}  # per prompt, per pair
        exact = True
        for ids in prompts:
            spent = {"engine": [], "transformers": []}
            for pair in range(pairs):
                order = ("engine", "transformers") if pair % 2 == 0 else ("transformers", "engine")
                outs = {}
                for name in order:
                    run = engine if name == "engine" else transformers
                    t = time.process_time()
                    outs[name] = run.run([ids], max_new, 1)[0]
                    spent[name].append(time.process_time() - t)
                exact &= trim_after_eos(list(outs["engine"]), eos) == trim_after_eos(list(outs["transformers"]), eos)
            for name in times:
                times[name].append(spent[name])
        engine_s = sum(statistics.median(t) for t in times["engine"])
        transformers_s = sum(statistics.median(t) for t in times["transformers"])
        ratios = [sum(t[p] for t in times["transformers"]) / sum(t[p] for t in times["engine"])
                  for p in range(pairs)]
        row = {"category": category, "prompts": len(prompts), "pairs": pairs, "engine_s": engine_s,
               "transformers_s": transformers_s, "speedup": transformers_s / engine_s, "pair_ratios": ratios,
               "exact": exact}
        rows.append(row)
        show(f"{str(category):15s} engine {engine_s:7.2f} s  transformers {transformers_s:7.2f} s  "
             f"{row['speedup']:.3f}x  pairs {' '.join(f'{r:.2f}' for r in ratios)}  "
             f"{'exact' if exact else 'DIFFERS'}")
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| category | prompts | engine s | transformers s | engine speed-up | per pair | exact |",
             "|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['category']} | {r['prompts']} | {r['engine_s']:.2f} | {r['transformers_s']:.2f} | "
                     f"{r['speedup']:.3f}x | {' '.join(f'{x:.2f}' for x in r['pair_ratios'])} | "
                     f"{'yes' if r['exact'] else 'NO'} |")
    engine = sum(r["engine_s"] for r in rows)
    theirs = sum(r["transformers_s"] for r in rows)
    lines.append(f"| all | {sum(r['prompts'] for r in rows)} | {engine:.2f} | {theirs:.2f} | {theirs / engine:.3f}x"
                 f" | | {'yes' if all(r['exact'] for r in rows) else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="local Hugging Face folder (default: the embedded demo pair's target)")
    p.add_argument("--prompts", default=None, help="prompts file, or 'specbench-style' (shipped)")
    p.add_argument("--per-category", type=int, default=None)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--pairs", type=int, default=4, help="paired runs of every prompt (ABBA order)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs must be >= 1, got {args.pairs}")
    torch.set_num_threads(args.threads)
    if args.target:
        target, tokenizer = load_causal_lm(args.target)
    else:
        target, _, tokenizer = build_default_pair()
    records = load_prompt_records(args.prompts, args.limit, args.per_category)
    categories = {c: encode(tokenizer, texts, args.target is not None) for c, texts in by_category(records).items()}
    name = os.path.basename(os.path.normpath(args.target)) if args.target else "demo pair target"
    header = (f"{name}: {len(records)} prompts at batch 1, {args.max_new_tokens} new tokens, {args.pairs} ABBA pairs "
              f"per prompt, {args.threads} thread(s), process CPU time")
    print(header, flush=True)
    rows = measure(target, categories, max_new=args.max_new_tokens, pairs=args.pairs,
                   show=lambda line: print(line, flush=True))
    report("the engine's plain decoding over transformers' plain generate (> 1: the engine is faster)",
           table(rows), args.json, header, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
