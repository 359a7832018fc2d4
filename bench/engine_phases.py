"""Issue-3 targets for the engine, measured side by side in one process:

    python bench/engine_phases.py [--threads 1] [--new 128] [--json results/engine_phases.json]

batch 8, K=4, 128 new tokens, 16 prompts of 32 to 256 random tokens, the 8-layer demo target and its 2-layer
draft (specdec/models/demo.py). For each kernel backend and realignment mode: the realign phase (seconds and
share of the run) and the engine's own overhead = everything but the model forwards (timed with forward hooks
on the target and draft models; prefill forwards count as model time).
"""

import argparse
import json
import os
import statistics
import time

import torch

import specdec_kernels as sk
from specdec import SpeculativeDecoder
from specdec.models.demo import build_default_pair


class ForwardClock:
    """Wall time spent inside a module's forward (hooks around the outermost call)."""

    def __init__(self, *models):
        self.seconds = 0.0
        self._start = None
        for m in models:
            m.register_forward_pre_hook(self._pre)
            m.register_forward_hook(self._post)

    def _pre(self, module, args):
        self._start = time.perf_counter()

    def _post(self, module, args, out):
        self.seconds += time.perf_counter() - self._start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, draft, _ = build_default_pair()
    clock = ForwardClock(target, draft)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(32, 257, (16,), generator=gen).tolist()
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths]
    configs = [(b, r) for b in ("torch", "cpp") if b in sk.available_backends() for r in ("shift", "mask", "paper")]
    results = {c: [] for c in configs}
    for _ in range(args.rounds):  # interleaved rounds, medians: the machine is shared
        for backend, realign in configs:
            dec = SpeculativeDecoder(target, draft, num_draft_tokens=4, backend=backend, realign=realign,
                                     adaptive=False)
            clock.seconds = 0.0
            res = dec.generate(prompts, max_new_tokens=args.new, batch_size=8)
            s = res.stats
            results[(backend, realign)].append({
                "total": s["total_seconds"], "realign_s": s["phase_seconds"]["realign"], "model": clock.seconds,
                "tokens_per_s": s["tokens_per_s"]})
    rows = []
    print(f"{args.threads} thread(s); batch 8, K=4, {args.new} new tokens, 16 prompts of {min(lengths)}-{max(lengths)}")
    print("| backend | realign | tokens/s | realign s | realign % | engine overhead % (not model forwards) |")
    print("|---|---|---:|---:|---:|---:|")
    for (backend, realign), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        row = {"backend": backend, "realign": realign, **med, "realign_share": med["realign_s"] / med["total"],
               "overhead_share": 1 - med["model"] / med["total"]}
        rows.append(row)
        print(f"| {backend} | {realign} | {med['tokens_per_s']:.1f} | {med['realign_s']:.3f} | "
              f"{100 * row['realign_share']:.1f} | {100 * row['overhead_share']:.1f} |")
    by = {(r["backend"], r["realign"]): r for r in rows}
    if ("cpp", "shift") in by and ("torch", "shift") in by:
        ratio = by["cpp", "shift"]["realign_s"] / by["torch", "shift"]["realign_s"]
        print(f"cpp/torch realign time (shift): {ratio:.3f}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        json.dump({"threads": args.threads, "rows": rows}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
