"""Engine throughput for one or more checkouts side by side: every scheduler and realign mode, fixed K.

    python bench/engine_compare.py --root /tmp/old --root . [--rounds 5] [--json docs/engine_compare.json]

The workload is the demo pair, 16 prompts of 32-256 tokens, 96 new tokens, batch 8, K=4 drafted every step
(adaptive=False, so both trees do the same work), cpp kernels, 1 thread. Each round runs one fresh
subprocess per root, alternating, so a noisy machine hits both alike. A root's number is the median over
rounds, and the per-round ratios are kept to show the spread. A root is imported through a shim folder
(symlinks to its specdec/ and to its kernels/ as specdec_kernels), so an old commit checked out with
`git worktree add /tmp/old <commit>` works as long as its kernels/ holds a built _C extension.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import inspect, json, sys, torch
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
out = {}
for sched, realign in (("eqspec", "shift"), ("eqspec", "mask"), ("exspec", "shift"), ("exspec", "mask"),
                       ("autoregressive", "shift")):
    plain = sched == "autoregressive"
    dec = SpeculativeDecoder(target, None if plain else draft, num_draft_tokens=4, scheduler=sched, backend="cpp",
                             realign=realign, **({} if plain else fixed))
    dec.generate(prompts[:2], max_new_tokens=8, batch_size=2)  # warm-up
    r = dec.generate(prompts, max_new_tokens=96, batch_size=8)
    out[f"{sched}/{realign}"] = {"tokens_per_s": r.stats["tokens_per_s"], "steps": r.stats["steps"],
                                 **{f"{k}_s": v for k, v in r.stats["phase_seconds"].items()}}
print(json.dumps(out))
"""


def shim_for(root: str) -> str:
    shim = tempfile.mkdtemp(prefix="specdec_shim_")
    root = os.path.abspath(root)
    os.symlink(os.path.join(root, "specdec"), os.path.join(shim, "specdec"))
    os.symlink(os.path.join(root, "kernels"), os.path.join(shim, "specdec_kernels"))
    return shim


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", action="append", default=None, help="a checkout (default: this one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    roots = args.root or [os.path.dirname(HERE)]
    shims = {root: shim_for(root) for root in roots}
    runs: dict[str, list[dict]] = {root: [] for root in roots}
    for _ in range(args.rounds):
        for root in roots:
            env = dict(os.environ, PYTHONPATH=shims[root], OMP_NUM_THREADS="1")
            res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                                 cwd=tempfile.gettempdir())
            if res.returncode != 0:
                raise SystemExit(f"{root}: {res.stderr[-3000:]}")
            runs[root].append(json.loads(res.stdout.strip().splitlines()[-1]))
    keys = list(runs[roots[0]][0])
    table = {root: {k: statistics.median(r[k]["tokens_per_s"] for r in rs) for k in keys} for root, rs in runs.items()}
    base = roots[0]
    print("| scheduler/realign | " + " | ".join(f"{r} tokens/s" for r in roots) + " | ratios per round |")
    print("|---|" + "---:|" * len(roots) + "---|")
    for k in keys:
        ratios = "; ".join(", ".join(f"{b[k]['tokens_per_s'] / a[k]['tokens_per_s']:.2f}"
                                     for a, b in zip(runs[base], runs[r])) for r in roots[1:])
        print(f"| {k} | " + " | ".join(f"{table[r][k]:.0f}" for r in roots) + f" | {ratios} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python bench/engine_compare.py " + " ".join(sys.argv[1:] if argv is None else argv),
                       "roots": roots, "median_tokens_per_s": table, "rounds": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
