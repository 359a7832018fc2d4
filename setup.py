"""Builds the optional C++ extension specdec_kernels._C from csrc/.

The extension is skipped, with a message, when torch is not importable at build time or SPECDEC_NO_CPP=1;
the package then runs on its torch (and triton) backends. Build with `pip install --no-build-isolation -e .`
so the build sees the torch you run with (build isolation would download another one).
"""

import glob
import os
import sys

from setuptools import setup


def _extensions():
    if os.environ.get("SPECDEC_NO_CPP") == "1":
        print("specdec_kernels: SPECDEC_NO_CPP=1, skipping the C++ extension", file=sys.stderr)
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("specdec_kernels: torch is not importable at build time, skipping the C++ extension "
              "(install torch first and use --no-build-isolation)", file=sys.stderr)
        return [], {}
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    if not sources:
        print("specdec_kernels: no C++ sources in csrc/, skipping the C++ extension", file=sys.stderr)
        return [], {}
    openmp = [] if sys.platform == "darwin" else ["-fopenmp"]
    ext = CppExtension(
        "specdec_kernels._C",
        sources,
        extra_compile_args={"cxx": ["-O3", "-std=c++17"] + openmp},
        extra_link_args=openmp,
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
