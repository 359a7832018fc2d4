"""Benchmarks run with one torch thread unless SPECDEC_THREADS says otherwise, stated in the header."""

import os

os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("SPECDEC_THREADS", "1"))

import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("SPECDEC_THREADS", "1")))


def pytest_report_header(config):
    import specdec_kernels as sk
    return [f"specdec bench: torch threads={torch.get_num_threads()}, backends={sk.available_backends()}, "
            f"cuda={torch.cuda.is_available()}"]
