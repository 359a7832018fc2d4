"""`make demo`: the embedded pair on the shipped prompts, plain batched decoding against EQSPEC with the target's
first 2 layers as its draft (early exit over the target's own cache, and the same layers as a draft model with a
cache of its own) and with the n-gram drafter, every output checked against plain greedy decoding."""

from __future__ import annotations

import json
import os
import time

import torch

import specdec_kernels as sk

from .check import plain_greedy
from ..decoder import SpeculativeDecoder
from ..drafting.early_exit import EarlyExitDrafter
from ..drafting.ngram import NgramDrafter
from ..models.demo import DRAFT_LAYERS, build_default_pair, shipped_prompts
from .report import format_runs, run_summary


def run_demo(threads: int = 1, backend: str | None = None, batch_size: int = 8, k: int = 4,
             max_new_tokens: int = 64, json_out: str | None = None) -> list[dict]:
    torch.set_num_threads(threads)
    target, draft, tokenizer = build_default_pair()
    prompts = [tokenizer.encode(p["text"]) for p in shipped_prompts()]
    chosen = backend or sk.get_backend()
    header = (f"specdec demo: {len(prompts)} shipped prompts, batch {batch_size}, K={k}, {max_new_tokens} new tokens, "
              f"{threads} thread(s), kernels backend {chosen!r} (available: {', '.join(sk.available_backends())})")
    print(header)
    print("target: 8-layer random Llama (byte vocabulary) whose late layers only refine; draft: its first 2 "
          "layers, run over the target's own cache (early exit) or as a model of their own (see "
          "specdec/models/demo.py)\n")
    start = time.perf_counter()
    reference = [plain_greedy(target, p, max_new_tokens)[0] for p in prompts]
    print(f"plain greedy reference (target.generate, one prompt at a time): {time.perf_counter() - start:.1f} s")
    runs = [("autoregressive (batched)", "autoregressive", None),
            ("eqspec + layer-skip, early exit", "eqspec", EarlyExitDrafter(target, DRAFT_LAYERS)),
            ("eqspec + layer-skip, own cache", "eqspec", draft),
            ("eqspec + n-gram drafter", "eqspec", NgramDrafter())]
    rows = []
    for name, scheduler, drafter in runs:
        decoder = SpeculativeDecoder(target, drafter, num_draft_tokens=k, scheduler=scheduler, backend=backend)
        result = decoder.generate(prompts, max_new_tokens=max_new_tokens, batch_size=batch_size)
        exact = sum(a == b for a, b in zip(result.sequences, reference)) / len(prompts)
        rows.append(run_summary(name, result.stats, threads, exact=exact))
    print(format_runs(rows, baseline=rows[0]["tokens_per_s"]))
    if json_out:
        os.makedirs(os.path.dirname(json_out) or ".", exist_ok=True)
        with open(json_out, "w") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)
    print("\ncolumns: tokens/s over the whole run; speed-up over batched autoregressive decoding; accept = accepted "
          "drafts / proposed drafts; tokens/step = tokens a row gains per step; phase % = share of wall time; "
          "exact = prompts whose output equals plain greedy decoding token for token")
    return rows
