"""The sampling op family: accept_lengths, verify_greedy, rejection_sample.

    naive.py            the rules as naive per-row loops (the readable specification)
    reference.py        vectorised torch reference (the "torch" backend)
    triton_kernels.py   GPU-shaped Triton kernels (the "triton" backend)
    triton_rowwise.py   the previous one-program-per-row Triton kernels, kept for bench/gpu_check's comparison
    cpp/                C++ kernels (the "cpp" backend): argmax.h (SIMD argmax), sampling_ops.cpp
"""
