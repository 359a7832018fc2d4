"""Engine throughput for two or more checkouts side by side: every scheduler and realign mode, fixed K.

    python bench/engine_compare.py --root /tmp/old --root . [--pairs 7] [--json docs/engine_compare.json]

The workload is the demo pair, 16 prompts of 32-256 tokens, 96 new tokens, batch 8, K=4 drafted every step
(adaptive=False, so both trees do the same work), cpp kernels, 1 thread.

Why paired runs: on this shared 2-core machine the same run varies by 10-20% from one minute to the next, more
than the differences worth finding. So each root gets one long-lived worker process (models built once), and
the parent asks the workers in turn for one run of one configuration: a pair is the same configuration run once
in each tree, seconds apart, in alternating order (first root first in even pairs, last root first in odd ones).
A root's ratio is the median over pairs of (its tokens/s / the first root's) from the same pair; the CPU ratio
uses tokens per CPU second of the worker, which waiting for a core does not inflate. A root is imported through
a shim folder (symlinks to its specdec/ and to its kernels/ as specdec_kernels), so an old commit checked out
with `git worktree add /tmp/old <commit>` works as long as its kernels/ holds a built _C extension.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = ("eqspec/shift", "eqspec/mask", "exspec/shift", "exspec/mask", "autoregressive/shift")

WORKER = r"""
import inspect, json, sys, time, torch
torch.set_num_threads(1)
from specdec import SpeculativeDecoder
try:
    from specdec.models.demo import build_default_pair
except ImportError:  # before the package was split into layers
    from specdec.demo_models import build_default_pair
target, draft, _ = build_default_pair()
gen = torch.Generator().manual_seed(0)
lengths = torch.randint(32, 257, (16,), generator=gen).tolist()
prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths]
fixed = {"adaptive": False} if "adaptive" in inspect.signature(SpeculativeDecoder).parameters else {}
decoders = {}
for name in sys.argv[1].split(","):
    sched, realign = name.split("/")
    plain = sched == "autoregressive"
    dec = SpeculativeDecoder(target, None if plain else draft, num_draft_tokens=4, scheduler=sched, backend="cpp",
                             realign=realign, **({} if plain else fixed))
    dec.generate(prompts[:2], max_new_tokens=8, batch_size=2)  # warm-up
    decoders[name] = dec
print("ready", flush=True)
for line in sys.stdin:
    dec = decoders[line.strip()]
    cpu = time.process_time()
    r = dec.generate(prompts, max_new_tokens=96, batch_size=8)
    cpu = time.process_time() - cpu
    print(json.dumps({"tokens_per_s": r.stats["tokens_per_s"], "cpu_tokens_per_s": r.stats["new_tokens"] / cpu,
                      "steps": r.stats["steps"], "tokens": r.sequences,
                      **{f"{k}_s": v for k, v in r.stats["phase_seconds"].items()}}), flush=True)
"""


def shim_for(root: str) -> str:
    shim = tempfile.mkdtemp(prefix="specdec_shim_")
    root = os.path.abspath(root)
    os.symlink(os.path.join(root, "specdec"), os.path.join(shim, "specdec"))
    os.symlink(os.path.join(root, "kernels"), os.path.join(shim, "specdec_kernels"))
    return shim


class Worker:
    def __init__(self, root: str):
        env = dict(os.environ, PYTHONPATH=shim_for(root), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.root = root
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, ",".join(CONFIGS)], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tempfile.gettempdir())
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"{root}: the worker did not start (its error is above)")

    def run(self, config: str) -> dict:
        self.proc.stdin.write(config + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.root}: the worker died running {config}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", action="append", default=None, help="a checkout (give two or more)")
    parser.add_argument("--pairs", type=int, default=7, help="paired runs per configuration")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    roots = args.root or [os.path.dirname(HERE)]
    workers = [Worker(root) for root in roots]
    runs: dict[str, dict[str, list[dict]]] = {root: {c: [] for c in CONFIGS} for root in roots}
    for pair in range(args.pairs):
        for config in CONFIGS:
            for w in (workers if pair % 2 == 0 else workers[::-1]):
                runs[w.root][config].append(w.run(config))
    for w in workers:
        w.close()
    base = roots[0]
    for root in roots[1:]:
        for config in CONFIGS:
            if any(a["tokens"] != b["tokens"] for a, b in zip(runs[base][config], runs[root][config])):
                raise SystemExit(f"{root} {config}: the tokens differ from {base}'s: not the same work")

    def ratio(root, config, key):
        return statistics.median(b[key] / a[key] for a, b in zip(runs[base][config], runs[root][config]))

    table = {root: {c: {"median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[root][c]),
                        "ratio_wall": ratio(root, c, "tokens_per_s"), "ratio_cpu": ratio(root, c, "cpu_tokens_per_s"),
                        "ratios_per_pair": [round(b["tokens_per_s"] / a["tokens_per_s"], 3)
                                            for a, b in zip(runs[base][c], runs[root][c])]}
                    for c in CONFIGS} for root in roots}
    print(f"{args.pairs} pairs per configuration; ratios: root / {base}, median over pairs")
    print("| scheduler/realign | " + " | ".join(f"{r} tokens/s" for r in roots)
          + "".join(f" | {r}: ratio (wall) | ratio (CPU time)" for r in roots[1:]) + " |")
    print("|---|" + "---:|" * (len(roots) + 2 * (len(roots) - 1)))
    for c in CONFIGS:
        cells = [f"{table[r][c]['median_tokens_per_s']:.0f}" for r in roots]
        cells += [f"{table[r][c][k]:.3f}" for r in roots[1:] for k in ("ratio_wall", "ratio_cpu")]
        print(f"| {c} | " + " | ".join(cells) + " |")
    if args.json:
        for root in roots:  # the tokens were compared above; keep the file small
            for rs in runs[root].values():
                for r in rs:
                    r.pop("tokens")
        with open(args.json, "w") as f:
            json.dump({"command": "python bench/engine_compare.py " + " ".join(sys.argv[1:] if argv is None else argv),
                       "roots": roots, "table": table, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
