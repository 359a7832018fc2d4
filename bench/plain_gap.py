"""Where does a decoder that only decodes plainly lose time against the autoregressive one?

Runs identical-output decoders on the demo pair side by side in one process, in a seeded shuffled order per
repeat, and prints per decoder the median process CPU time of a run and of each phase (specdec.timing), the
controller's own seconds and the step count. Two autoregressive decoders gauge the noise.

    python bench/plain_gap.py --category math --batch-size 8 --repeats 12

Decoders: "plain" and "plain again" (scheduler="autoregressive"); "no-op drafter" (a drafter that never offers:
every plan is plain at once, so the difference to plain is the drafter/controller plumbing); and each real drafter
with the controller on (layer-skip, n-gram), whose steps are mostly plain on this pair.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

from specdec.apps.prompts import by_category, encode, load_prompt_records
from specdec.decoder import SpeculativeDecoder
from specdec.drafting.base import Proposal
from specdec.drafting.ngram import NgramDrafter
from specdec.models.demo import build_default_pair


class NoOpDrafter:
    """Never has a draft to offer: every step is planned plain before any drafting."""

    kv_model = None

    def start(self, seq, prompt, first):
        pass

    def lag(self, batch):
        return 0

    def offer(self, batch, k):
        return [[] for _ in batch.seqs]

    def propose(self, batch, k, sampling=None, generator=None, stop=None):  # never reached: plans are plain
        return Proposal(torch.empty(batch.size, 0, dtype=torch.int64))

    def commit(self, batch, proposal, emitted):
        return None

    def finish(self, seq):
        pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--category", default="math")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, layerskip, tokenizer = build_default_pair()
    texts = by_category(load_prompt_records(None))[args.category]
    ids = encode(tokenizer, texts, False)
    decoders = {
        "plain": SpeculativeDecoder(target, None, scheduler="autoregressive"),
        "plain again": SpeculativeDecoder(target, None, scheduler="autoregressive"),
        "no-op drafter": SpeculativeDecoder(target, NoOpDrafter()),
        "layer-skip, adaptive": SpeculativeDecoder(target, layerskip),
        "n-gram, adaptive": SpeculativeDecoder(target, NgramDrafter()),
    }
    cpu = {name: [] for name in decoders}
    phases = {name: [] for name in decoders}
    outputs = {}
    order_rng = random.Random(0)
    for rep in range(args.repeats):
        for name in order_rng.sample(list(decoders), len(decoders)):
            c = time.process_time()
            res = decoders[name].generate(ids, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
            cpu[name].append(time.process_time() - c)
            st = res.stats
            phases[name].append(dict(st["phase_seconds"], prefill=st["prefill_seconds"],
                                     control=st.get("control_seconds", 0.0), steps=st["steps"],
                                     plain=st.get("plain_steps", st["steps"])))
            outputs[name] = res.sequences
    base = statistics.median(cpu["plain"])
    print(f"demo pair, {args.category}: {len(ids)} prompts, batch {args.batch_size}, {args.max_new_tokens} new "
          f"tokens, {args.repeats} repeats, {args.threads} thread(s), process CPU time, medians\n")
    keys = ["draft", "verify", "sample", "realign", "schedule", "prefill", "control", "other"]
    print(f"{'decoder':22s} {'run ms':>8s} {'x plain':>8s} " + " ".join(f"{k:>8s}" for k in keys)
          + f" {'steps':>6s} {'plain':>6s} exact")
    result = {}
    for name in decoders:
        med = {k: statistics.median(ph[k] for ph in phases[name]) for k in keys + ["steps", "plain"]}
        run = statistics.median(cpu[name])
        result[name] = {"run_seconds": run, "all_runs": cpu[name], **med}
        print(f"{name:22s} {run * 1e3:8.1f} {base / run:8.3f} " + " ".join(f"{med[k] * 1e3:8.1f}" for k in keys)
              + f" {med['steps']:6.0f} {med['plain']:6.0f} {outputs[name] == outputs['plain']}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "decoders": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
