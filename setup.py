"""Builds the optional C++ extension specdec_kernels._C from each op family's C++ sources (kernels/*/cpp/*.cpp)
and the shared module code in csrc/ (extension.cpp, common.h).

The extension is skipped, with a message, when torch is not importable at build time or SPECDEC_NO_CPP=1;
the package then runs on its torch (and triton) backends. Build with `pip install --no-build-isolation -e .`
so the build sees the torch you run with (build isolation would download another one).
SPECDEC_PORTABLE_CPP=1 builds without GCC/Clang vector extensions (the portable scalar argmax; same results).
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
    families = sorted(glob.glob(os.path.join("kernels", "*", "cpp")))
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp"))) + sorted(
        f for d in families for f in glob.glob(os.path.join(d, "*.cpp")))
    if not sources:
        print("specdec_kernels: no C++ sources in csrc/ or kernels/*/cpp/, skipping the C++ extension",
              file=sys.stderr)
        return [], {}
    openmp = [] if sys.platform == "darwin" else ["-fopenmp"]
    portable = ["-DSPECDEC_PORTABLE=1"] if os.environ.get("SPECDEC_PORTABLE_CPP") == "1" else []
    ext = CppExtension(
        "specdec_kernels._C",
        sources,
        include_dirs=[os.path.abspath("csrc")] + [os.path.abspath(d) for d in families],
        extra_compile_args={"cxx": ["-O3", "-std=c++17"] + openmp + portable},
        extra_link_args=openmp,
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
