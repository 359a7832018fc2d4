"""Does speculation pay? Plain batched decoding against every drafter, adaptive (the controller) and fixed K,
per category and batch size, side by side in one process (specdec.apps.speed).

    python bench/speculation.py --json docs/speculation_demo.json                 the embedded demo pair
    python bench/speculation.py --target ~/.cache/specdec/smollm2-135m-instruct \\
        --prompts ../shared/data/spec_bench_questions.jsonl --per-category 5 --drafters ngram fp16 \\
        --transformers --json docs/speculation_smollm2.json                      SmolLM2 on SpecBench

Threads are pinned (1 by default): on this 2-core machine oversubscription costs far more than it gains.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from specdec.apps.prompts import by_category, encode, load_prompt_records
from specdec.apps.speed import measure, report, table
from specdec.drafting.early_exit import EarlyExitDrafter
from specdec.drafting.ngram import NgramDrafter
from specdec.models.demo import DRAFT_LAYERS, build_default_pair
from specdec.models.hf import cheap_copy, load_causal_lm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="local Hugging Face folder (default: the embedded demo pair)")
    p.add_argument("--prompts", default=None, help="prompts file, or 'specbench-style' (shipped)")
    p.add_argument("--per-category", type=int, default=None)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--drafters", nargs="+", default=None,
                   help="ngram, fp16 (a float16 copy), earlyexit (the demo target's first 2 layers over its own "
                        "cache), layerskip (the same layers as a separate draft model with its own cache)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--min-seconds", type=float, default=0.0,
                   help="repeat a cell past --repeats until plain has run this long (short cells are noisiest)")
    p.add_argument("--no-fixed", action="store_true", help="skip the fixed-K runs")
    p.add_argument("--noise-gauge", action="store_true",
                   help="add a second plain decoder per cell: its ratio to plain reads the cell's noise")
    p.add_argument("--transformers", action="store_true", help="also time transformers' own generate")
    p.add_argument("--whole-cell", action="store_true",
                   help="run each configuration over a whole cell at a time (the old way), not one batch of prompts "
                        "at a time with every configuration in turn (specdec.apps.speed.measure's block)")
    p.add_argument("--copies", type=int, default=1,
                   help="decoders per adaptive configuration, each its own controller path; a row's time is their "
                        "mean (specdec.apps.speed.measure)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="see specdec.apps.speed.measure")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.target:
        target, tokenizer = load_causal_lm(args.target)
        layerskip = None
        drafters = args.drafters or ["ngram", "fp16"]
    else:
        target, layerskip, tokenizer = build_default_pair()
        drafters = args.drafters or ["earlyexit", "ngram"]
    factories, assistants = {}, {}
    for name in drafters:
        if name == "ngram":
            factories["n-gram"] = NgramDrafter
        elif name == "fp16":
            copy = cheap_copy(target, torch.float16)
            factories["float16 copy"] = lambda copy=copy: copy
            assistants["float16 copy"] = copy
        elif name == "earlyexit" and layerskip is not None:
            factories["layer-skip, early exit"] = lambda: EarlyExitDrafter(target, DRAFT_LAYERS)
        elif name == "layerskip" and layerskip is not None:
            factories["layer-skip, own cache"] = lambda: layerskip
            assistants["layer-skip draft"] = layerskip
        else:
            p.error(f"unknown drafter {name!r} (ngram, fp16; earlyexit and layerskip with the demo pair)")
    records = load_prompt_records(args.prompts, args.limit, args.per_category)
    chat = args.target is not None
    categories = {c: encode(tokenizer, texts, chat) for c, texts in by_category(records).items()}
    header = (f"{'demo pair' if not args.target else os.path.basename(os.path.normpath(args.target))}: "
              f"{len(records)} prompts, {args.max_new_tokens} new tokens, K={args.k}, {args.repeats} repeats, "
              f"{args.threads} thread(s), {args.clock} clock"
              + (f", repeats until plain has run {args.min_seconds:g} s" if args.min_seconds else "")
              + (", whole cells" if args.whole_cell else ", one batch of prompts per block")
              + (f", {args.copies} decoders an adaptive row" if args.copies > 1 else ""))
    print(header, flush=True)
    rows = measure(target, factories, categories, args.batch_sizes, max_new=args.max_new_tokens, k=args.k,
                   repeats=args.repeats, fixed=not args.no_fixed, transformers=args.transformers,
                   assistants=assistants, show=lambda line: print(line, flush=True), clock=args.clock,
                   min_seconds=args.min_seconds, noise_gauge=args.noise_gauge,
                   block=None if args.whole_cell else 0, copies=args.copies)
    report("speed-up over the engine's plain batched decoding at the same batch size", table(rows), args.json,
           header, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
