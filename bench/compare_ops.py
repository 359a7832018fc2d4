"""Side-by-side op timings for the README: every backend interleaved in one process.

    python bench/compare_ops.py [--threads 1] [--json results/ops.json]
"""

import argparse
import json
import os
import platform
import sys

import torch

from specdec_kernels import available_backends
from specdec_kernels.microbench import format_table, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    rows = run(args.device, quick=args.quick)
    print(f"torch threads {torch.get_num_threads()}, device {args.device}, backends {available_backends()}")
    print(format_table(rows))
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"machine": {"python": sys.version.split()[0], "torch": torch.__version__,
                                   "threads": torch.get_num_threads(), "platform": platform.platform(),
                                   "device": args.device},
                       "rows": [dict(vars(r), gb_per_s=r.gb_per_s) for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
