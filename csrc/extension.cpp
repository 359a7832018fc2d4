// The Python module specdec_kernels._C: importing it runs the op registrations of every family's C++ source
// (kernels/sampling/cpp, kernels/moves/cpp), linked into this one shared library, and gives tests the
// output-poison switch.
#include <Python.h>

#include <atomic>

#include "common.h"

namespace specdec {
namespace {
std::atomic<bool> g_poisoned{false};
std::atomic<int64_t> g_poison{0};
}  // namespace

at::Tensor new_int64(at::IntArrayRef shape, const at::Tensor& like) {
  const auto options = like.options().dtype(at::kLong);
  if (g_poisoned.load(std::memory_order_relaxed)) return at::full(shape, g_poison.load(), options);
  return at::empty(shape, options);
}
}  // namespace specdec

// _set_output_poison(value: int | None): every output the C++ ops allocate starts as `value` (None: at::empty).
static PyObject* set_output_poison(PyObject*, PyObject* value) {
  if (value == Py_None) {
    specdec::g_poisoned = false;
    Py_RETURN_NONE;
  }
  const long long v = PyLong_AsLongLong(value);
  if (v == -1 && PyErr_Occurred()) return nullptr;
  specdec::g_poison = v;
  specdec::g_poisoned = true;
  Py_RETURN_NONE;
}

static PyMethodDef kMethods[] = {
    {"_set_output_poison", set_output_poison, METH_O, "Poison value for outputs the C++ ops allocate (tests)."},
    {nullptr, nullptr, 0, nullptr}};

#define SPECDEC_CONCAT2(a, b) a##b
#define SPECDEC_CONCAT(a, b) SPECDEC_CONCAT2(a, b)
#define SPECDEC_STR2(a) #a
#define SPECDEC_STR(a) SPECDEC_STR2(a)
PyMODINIT_FUNC SPECDEC_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, SPECDEC_STR(TORCH_EXTENSION_NAME), nullptr, -1, kMethods,
                               nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
