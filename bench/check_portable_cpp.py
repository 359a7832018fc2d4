"""Build the C++ kernels with -DSPECDEC_PORTABLE=1 (no GCC/Clang vector extensions: the scalar argmax path) into a
throwaway extension and check every *_cpp op against the torch reference, exactly. About a minute of compiling.

    SPECDEC_NO_CPP=1 python bench/check_portable_cpp.py
"""
import glob
import os
import sys
import tempfile

os.environ["SPECDEC_NO_CPP"] = "1"  # the installed extension must not register the same ops first
import torch  # noqa: E402
from torch.utils.cpp_extension import load  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
families = sorted(glob.glob(os.path.join(ROOT, "kernels", "*", "cpp")))
sources = sorted(glob.glob(os.path.join(ROOT, "csrc", "*.cpp"))) + sorted(
    f for d in families for f in glob.glob(os.path.join(d, "*.cpp")))
load("specdec_portable", sources, extra_include_paths=[os.path.join(ROOT, "csrc")] + families,
     extra_cflags=["-O2", "-std=c++17", "-DSPECDEC_PORTABLE=1"], build_directory=tempfile.mkdtemp(), verbose=False)

sys.path.insert(0, os.path.join(ROOT, "tests"))
from kernel_cases import greedy_case, sampling_case  # noqa: E402

from specdec_kernels import reference as ref  # noqa: E402

ops = torch.ops.specdec_kernels
fails = 0
for seed in range(40):
    b, k, v = 1 + seed % 5, seed % 4, (17, 111, 257, 1000, 2049)[seed % 5]
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        drafts, logits, nd = greedy_case(b, k, v, seed, dtype, ties=seed % 2 == 1)
        fails += not all(torch.equal(x, y) for x, y in zip(ops.verify_greedy_cpp(drafts, logits, nd),
                                                           ref.verify_greedy(drafts, logits, nd)))
        if dtype == torch.float64:
            continue
        for with_q in (True, False):
            c = sampling_case(b, k, v, seed, dtype, with_q=with_q)
            got = ops.rejection_sample_cpp(c.draft_tokens, c.draft_probs, c.target_probs, c.num_draft, c.uniform,
                                           c.exponential)
            want = ref.rejection_sample(c.draft_tokens, c.draft_probs, c.target_probs, c.num_draft,
                                        uniform=c.uniform, exponential=c.exponential)
            fails += not all(torch.equal(x, y) for x, y in zip(got, want))
    x = torch.randn(b, 3, 9, 2)
    y = x.clone()
    s = torch.randint(-9, 10, (b,))
    ops.shift_rows_cpp_([x], s, -2, -7)
    ref.shift_rows_([y], s, dim=-2, fill=-7)
    fails += not torch.equal(x, y)
print("portable C++ build: FAILS", fails)
sys.exit(1 if fails else 0)
