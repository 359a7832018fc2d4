// Shared by the C++ sources of every op family (kernels/*/cpp/): output allocation and small helpers.
// The op families register their kernels into the specdec_kernels namespace themselves
// (TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL); csrc/extension.cpp makes the shared library a Python module.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

namespace specdec {

// int64 outputs, allocated here so the ops have functional schemas. Tests set a poison value
// (specdec_kernels._C._set_output_poison, through specdec_kernels.outputs.set_poison): every output then starts
// filled with it, so an element a kernel forgets to write fails the comparison instead of passing on zeroed memory.
at::Tensor new_int64(at::IntArrayRef shape, const at::Tensor& like);

// Rows per at::parallel_for task so that one task does about 32 K elements of work.
inline int64_t rows_grain(int64_t work_per_row) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_row));
}

}  // namespace specdec
