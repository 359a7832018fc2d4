"""Per-call overhead of every public op on tiny inputs, for one or more checkouts side by side.

    python bench/op_overhead.py --threads 1 [--root /tmp/old --root .] [--rounds 5] [--json docs/ops_overhead.json]

Each round runs one fresh subprocess per root, alternating (old, new, old, new, ...), so a noisy machine hits
both alike; a root's number is the median over rounds of each subprocess's best mean over repeated loops.
A root is imported as `specdec_kernels` through a shim folder (a symlink to its kernels/), so an old commit
checked out with `git worktree add /tmp/old <commit>` works as long as its kernels/ holds a built _C extension.
The inputs are tiny (B=4, K=4, V=16, T=16), so the time is the Python dispatch, validation and launch cost,
not the kernel. Value checks are measured on (the default) and off (SPECDEC_CHECKS=0).

It also times, in this checkout only, the design choices whose costs the code's comments cite ("micro" in the
JSON, docs/ops_overhead.json): a torch.library.custom_op call against a Library.define + impl op, reading
SPECDEC_CHECKS through os.environ.get against its backing dict, the per-tensor cost of the Triton row-move plan
key and of the in-place memory checks.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, os, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
import specdec_kernels as sk
backends = [b for b in ("torch", "cpp") if b in sk.available_backends()]
gen = torch.Generator().manual_seed(0)
B, K, V, T = 4, 4, 16, 16
matches = torch.rand(B, K, generator=gen) < 0.7
nd = torch.tensor([0, 4, 2, 3])
logits = torch.randn(B, K + 1, V, generator=gen)
drafts = logits[:, :K].argmax(-1)
p = torch.softmax(torch.randn(B, K + 1, V, generator=gen), -1)
q = torch.softmax(torch.randn(B, K, V, generator=gen), -1)
u, e = sk.draw_noise(B, K, V, torch.device("cpu"), gen)
x = torch.randn(B, 2, T, 4, generator=gen)
xs = [torch.randn(B, 2, T, 4, generator=gen) for _ in range(16)]
shifts = torch.tensor([0, 1, 2, 0])
keep = torch.rand(B, T, generator=gen) < 0.8
cases = {
    "accept_lengths": lambda b: sk.accept_lengths(matches, nd, backend=b),
    "verify_greedy": lambda b: sk.verify_greedy(drafts, logits, nd, backend=b),
    "rejection_sample": lambda b: sk.rejection_sample(drafts, q, p, nd, uniform=u, exponential=e, backend=b),
    "shift_rows_ 1 tensor": lambda b: sk.shift_rows_(x, shifts, dim=-2, backend=b),
    "shift_rows_ 16 tensors": lambda b: sk.shift_rows_(xs, shifts, dim=-2, backend=b),
    "compact_rows_ 1 tensor": lambda b: sk.compact_rows_(x, keep, dim=-2, backend=b),
}
out = {}
with torch.no_grad():
    for checks in ("1", "0"):
        os.environ["SPECDEC_CHECKS"] = checks
        for name, fn in cases.items():
            for b in backends:
                n = 400
                fn(b)
                best = float("inf")
                for _ in range(7):
                    start = time.perf_counter()
                    for _ in range(n):
                        fn(b)
                    best = min(best, (time.perf_counter() - start) / n * 1e6)
                out[f"{name} | {b} | checks {'on' if checks == '1' else 'off'}"] = best
print(json.dumps(out))
"""


MICRO = r"""
import json, os, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
import specdec_kernels as sk
from specdec_kernels import checks

def best_us(fn, n=2000, repeat=7):
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best

x = torch.zeros(3)
@torch.library.custom_op("specdec_bench::via_custom_op", mutates_args=())
def via_custom_op(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty(0)
lib = torch.library.Library("specdec_bench", "FRAGMENT")
lib.define("via_library(Tensor t) -> Tensor")
lib.impl("via_library", lambda t: t.new_empty(0), "CPU")
via_library = torch.ops.specdec_bench.via_library.default
out = {
    "custom_op call (functional, 1 tensor)": best_us(lambda: via_custom_op(x)),
    "Library.define + impl call (same op)": best_us(lambda: via_library(x)),
    "os.environ.get(SPECDEC_CHECKS)": best_us(lambda: os.environ.get("SPECDEC_CHECKS", "1")),
    "checks.value_checks_enabled()": best_us(lambda: checks.value_checks_enabled()),
}
slab = torch.zeros(8, 48, 4, 64, 16)
for n in (1, 16, 48):
    views = [slab[:, i] for i in range(n)]
    shifts = torch.zeros(8, dtype=torch.int64)
    key = lambda: tuple([(v.data_ptr(), v.shape, v.stride(), v.dtype) for v in views])
    out[f"triton plan key, {n} tensors, per tensor"] = best_us(key, n=500) / n
    out[f"in-place checks (all rules), {n} interleaved slab views, per tensor"] = best_us(
        lambda: checks.check_inplace("tensors", views, shifts, "shifts", -2, 0), n=500) / n
    bufs = [torch.zeros(8, 4, 64, 16) for _ in range(n)]
    out[f"in-place checks (all rules), {n} separate buffers, per tensor"] = best_us(
        lambda: checks.check_inplace("tensors", bufs, shifts, "shifts", -2, 0), n=500) / n
print(json.dumps(out))
"""


def shim_for(root: str) -> str:
    shim = tempfile.mkdtemp(prefix="specdec_overhead_")
    os.symlink(os.path.join(os.path.abspath(root), "kernels"), os.path.join(shim, "specdec_kernels"))
    return shim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", action="append", default=None, help="a checkout (default: this one)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    roots = args.root or [os.path.dirname(HERE)]
    shims = {root: shim_for(root) for root in roots}
    runs: dict[str, list[dict]] = {root: [] for root in roots}
    for _ in range(args.rounds):
        for root in roots:
            env = dict(os.environ, PYTHONPATH=shims[root], OMP_NUM_THREADS=str(args.threads),
                       TRITON_INTERPRET="1")
            res = subprocess.run([sys.executable, "-c", CHILD, str(args.threads)], env=env, capture_output=True,
                                 text=True, cwd=tempfile.gettempdir(), timeout=600)
            if res.returncode:
                raise SystemExit(f"{root}: {res.stderr[-3000:]}")
            runs[root].append(json.loads(res.stdout.strip().splitlines()[-1]))
    table = {root: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for root, rs in runs.items()}
    here = os.path.dirname(HERE)
    micro_runs = []
    for _ in range(max(1, args.rounds // 2)):
        env = dict(os.environ, PYTHONPATH=shim_for(here), OMP_NUM_THREADS=str(args.threads), TRITON_INTERPRET="1")
        res = subprocess.run([sys.executable, "-c", MICRO, str(args.threads)], env=env, capture_output=True,
                             text=True, cwd=tempfile.gettempdir(), timeout=600)
        if res.returncode:
            raise SystemExit(f"micro: {res.stderr[-3000:]}")
        micro_runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    micro = {k: statistics.median(r[k] for r in micro_runs) for k in micro_runs[0]}
    keys = list(table[roots[0]])
    header = "| op | backend | checks | " + " | ".join(f"{os.path.basename(os.path.abspath(r)) or r} us"
                                                        for r in roots) + " |"
    print(header)
    print("|---|---|---|" + "---:|" * len(roots))
    for k in keys:
        op, backend, checks = k.split(" | ")
        cells = " | ".join(f"{table[r].get(k, float('nan')):.1f}" for r in roots)
        print(f"| {op} | {backend} | {checks.split()[1]} | {cells} |")
    print()
    for k, v in micro.items():
        print(f"{k}: {v:.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": {"python": sys.version.split()[0], "threads": args.threads,
                                   "platform": platform.platform(), "rounds": args.rounds},
                       "command": "python bench/op_overhead.py " + " ".join(sys.argv[1:]),
                       "roots": roots, "us_per_call": table, "micro_us": micro}, f, indent=1)


if __name__ == "__main__":
    main()
