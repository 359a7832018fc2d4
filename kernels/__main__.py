"""`python -m specdec_kernels [--quick] [--threads N] [--device cpu|cuda]`: backends and a timing table."""

import argparse
import os

import torch

from . import available_backends
from .microbench import format_table, run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m specdec_kernels", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and a 6-layer cache")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("SPECDEC_THREADS", "1")))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"backends available: {', '.join(available_backends())}; device {args.device}; "
          f"torch threads {torch.get_num_threads()}")
    print(format_table(run(args.device, quick=args.quick)))


if __name__ == "__main__":
    main()
