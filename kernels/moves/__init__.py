"""The row-move op family: shift_rows_, compact_rows_ (in place).

    naive.py            the rules as naive per-row loops (the readable specification)
    reference.py        vectorised torch reference (the "torch" backend)
    triton_kernels.py   the Triton row-move kernel (the "triton" backend)
    cpp/                C++ strided row-move engine (the "cpp" backend): row_moves.cpp
"""
