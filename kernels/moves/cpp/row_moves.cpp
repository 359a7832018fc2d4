// C++ CPU kernels of the row-move family: shift_rows_ and compact_rows_, one strided row-move engine.
// The torch reference (kernels/moves/reference.py) is the specification. Registered as
// specdec_kernels::shift_rows_cpp_ / compact_rows_cpp_ (in place, functional otherwise: compact returns the
// kept counts, allocated here); the public ops' CPU kernels (kernels/library.py) call them for the "cpp" backend.
// Arguments arrive validated by the dispatch layer (kernels/ops.py), including the aliasing rule: no tensor
// overlaps itself or another, so one thread owns each line and threads never share memory.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common.h"

namespace specdec {
namespace {

using at::Tensor;

// One tensor seen as [B, outer..., T, inner...] with byte strides; size-1 dims dropped, mergeable dims merged.
struct Geo {
  char* base = nullptr;
  int64_t esize = 0, T = 0, sB = 0, sT = 0, outer_n = 1, inner_n = 1;
  c10::SmallVector<int64_t, 6> osz, ost, isz, ist;
  bool dense = false;  // (T, inner...) is one contiguous chunk: a line moves with memmove
  alignas(16) unsigned char fill[16];
};

void coalesce(const Tensor& x, int64_t lo, int64_t hi, int64_t esize, c10::SmallVector<int64_t, 6>& sz,
              c10::SmallVector<int64_t, 6>& st) {
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t size = x.size(i), stride = x.stride(i) * esize;
    if (size == 1) continue;
    if (!sz.empty() && st.back() == stride * size) {
      sz.back() *= size;
      st.back() = stride;
    } else {
      sz.push_back(size);
      st.push_back(stride);
    }
  }
}

// The fill value in x's dtype, converted exactly as the reference's masked_fill_ does (same errors too).
// Scalar::to<T> is the conversion masked_fill_'s CPU kernel applies (same rounding, same overflow errors), without
// allocating two tensors per call; other dtypes take masked_fill_ itself.
void fill_bytes(const Tensor& x, const c10::Scalar& fill, unsigned char* out) {
  switch (x.scalar_type()) {
#define SPECDEC_FILL_CASE(ctype, name)    \
  case at::ScalarType::name: {           \
    const ctype v = fill.to<ctype>();     \
    std::memcpy(out, &v, sizeof v);       \
    return;                               \
  }
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX(SPECDEC_FILL_CASE)
#undef SPECDEC_FILL_CASE
    default: {
      const Tensor one = at::empty({1}, x.options().device(at::kCPU));
      one.masked_fill_(at::ones({1}, at::TensorOptions().dtype(at::kBool)), fill);
      std::memcpy(out, one.data_ptr(), one.element_size());
    }
  }
}

c10::SmallVector<Geo, 64> geometry(const at::TensorList tensors, int64_t dim, const c10::Scalar& fill) {
  c10::SmallVector<Geo, 64> geos;
  c10::SmallVector<std::pair<at::ScalarType, int>, 8> seen;  // one fill conversion per dtype
  for (const Tensor& x : tensors) {
    TORCH_CHECK(x.device().is_cpu(), "specdec: cpp backend needs CPU tensors");
    TORCH_CHECK(at::has_internal_overlap(x) != at::MemOverlap::Yes,
                "specdec: a tensor has elements that share memory; it cannot be shifted in place");
    const int64_t d = dim < 0 ? dim + x.dim() : dim;
    Geo g;
    g.esize = x.element_size();
    TORCH_CHECK(g.esize <= 16, "specdec: unsupported element size ", g.esize);
    auto it = std::find_if(seen.begin(), seen.end(), [&](auto& s) { return s.first == x.scalar_type(); });
    if (it == seen.end()) {
      fill_bytes(x, fill, g.fill);
      seen.emplace_back(x.scalar_type(), int(geos.size()));
    } else {
      std::memcpy(g.fill, geos[it->second].fill, 16);
    }
    if (x.numel() == 0) {
      g.outer_n = 0;  // nothing to move; kept so indices line up
      geos.push_back(g);
      continue;
    }
    g.base = static_cast<char*>(x.data_ptr());
    g.T = x.size(d);
    g.sB = x.stride(0) * g.esize;
    g.sT = x.stride(d) * g.esize;
    coalesce(x, 1, d, g.esize, g.osz, g.ost);
    coalesce(x, d + 1, x.dim(), g.esize, g.isz, g.ist);
    for (int64_t s : g.osz) g.outer_n *= s;
    for (int64_t s : g.isz) g.inner_n *= s;
    g.dense = (g.isz.empty() || (g.isz.size() == 1 && g.ist[0] == g.esize)) &&
              (g.T == 1 || g.sT == g.inner_n * g.esize);
    geos.push_back(g);
  }
  return geos;
}

template <int N>
struct Bytes {
  unsigned char b[N];
};

// Calls f(E{}) with an element type of the tensor's width, so moves and fills are plain typed loops.
template <typename F>
void with_elem(int64_t esize, F f) {
  switch (esize) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
    default: return f(Bytes<16>{});
  }
}

// A line: the T positions of one (b, outer) of one tensor. move() has memmove semantics along T.
struct Line {
  const Geo& g;
  char* p;

  void move(int64_t dst, int64_t src, int64_t count) const {
    if (count <= 0 || dst == src) return;
    if (g.dense) {
      const int64_t block = g.inner_n * g.esize;
      std::memmove(p + dst * block, p + src * block, count * block);
      return;
    }
    with_elem(g.esize, [&](auto tag) {
      using E = decltype(tag);
      for_inner([&](char* q) {  // each inner index is its own 1-D sequence along T: copy in the safe direction
        auto at = [&](int64_t t) { return reinterpret_cast<E*>(q + t * g.sT); };
        if (dst > src) {
          for (int64_t t = count - 1; t >= 0; --t) std::memcpy(at(dst + t), at(src + t), sizeof(E));
        } else {
          for (int64_t t = 0; t < count; ++t) std::memcpy(at(dst + t), at(src + t), sizeof(E));
        }
      });
    });
  }

  void fill(int64_t start, int64_t count) const {
    if (count <= 0) return;
    with_elem(g.esize, [&](auto tag) {
      using E = decltype(tag);
      E value;
      std::memcpy(&value, g.fill, sizeof(E));
      if (g.dense) {
        char* q = p + start * g.inner_n * g.esize;
        const int64_t m = count * g.inner_n;
        for (int64_t i = 0; i < m; ++i) std::memcpy(q + i * sizeof(E), &value, sizeof(E));
        return;
      }
      for_inner([&](char* q) {
        for (int64_t t = start; t < start + count; ++t) std::memcpy(q + t * g.sT, &value, sizeof(E));
      });
    });
  }

  template <typename F>
  void for_inner(F f) const {  // odometer over the inner dims
    const int64_t nd = int64_t(g.isz.size());
    c10::SmallVector<int64_t, 6> i(nd, 0);
    char* q = p;
    for (int64_t n = 0; n < g.inner_n; ++n) {
      f(q);
      for (int64_t j = nd - 1; j >= 0; --j) {
        q += g.ist[j];
        if (++i[j] < g.isz[j]) break;
        q -= g.ist[j] * g.isz[j];
        i[j] = 0;
      }
    }
  }
};

// Runs op(line, b) over every (tensor, row in rows, outer index), in parallel.
template <typename Op>
void for_lines(const c10::SmallVector<Geo, 64>& geos, const std::vector<int64_t>& rows, Op op) {
  if (rows.empty()) return;
  std::vector<int64_t> start(geos.size() + 1, 0);
  int64_t bytes = 0;
  for (size_t i = 0; i < geos.size(); ++i) {
    const int64_t lines = int64_t(rows.size()) * geos[i].outer_n;
    start[i + 1] = start[i] + lines;
    bytes += lines * geos[i].T * geos[i].inner_n * geos[i].esize;
  }
  const int64_t total = start.back();
  if (total == 0) return;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, bytes / total));
  at::parallel_for(0, total, grain, [&](int64_t i0, int64_t i1) {
    size_t t = std::upper_bound(start.begin(), start.end(), i0) - start.begin() - 1;
    for (int64_t i = i0; i < i1; ++i) {
      while (i >= start[t + 1]) ++t;
      const Geo& g = geos[t];
      const int64_t local = i - start[t], b = rows[local / g.outer_n];
      int64_t o = local % g.outer_n;
      char* p = g.base + b * g.sB;
      for (int64_t j = int64_t(g.osz.size()) - 1; j >= 0; --j) {
        p += (o % g.osz[j]) * g.ost[j];
        o /= g.osz[j];
      }
      op(Line{g, p}, b);
    }
  });
}

void shift_rows_(at::TensorList tensors, const Tensor& shifts_in, int64_t dim, const c10::Scalar& fill) {
  const Tensor shifts = shifts_in.contiguous();
  const auto geos = geometry(tensors, dim, fill);
  const int64_t* s = shifts.data_ptr<int64_t>();
  std::vector<int64_t> rows;  // rows with shift 0 cost nothing
  for (int64_t b = 0; b < shifts.numel(); ++b)
    if (s[b] != 0) rows.push_back(b);
  for_lines(geos, rows, [s](const Line& line, int64_t b) {
    const int64_t T = line.g.T, sh = s[b];
    if (sh >= T || sh <= -T) {
      line.fill(0, T);
    } else if (sh > 0) {
      line.move(sh, 0, T - sh);
      line.fill(0, sh);
    } else {
      line.move(0, -sh, T + sh);
      line.fill(T + sh, -sh);
    }
  });
}

Tensor compact_rows_(at::TensorList tensors, const Tensor& keep_in, int64_t dim, const c10::Scalar& fill) {
  const Tensor keep = keep_in.contiguous();
  const int64_t batch = keep.size(0), T = keep.size(1);
  Tensor kept = new_int64({batch}, keep);
  const auto geos = geometry(tensors, dim, fill);
  const bool* m = keep.data_ptr<bool>();
  int64_t* out = kept.data_ptr<int64_t>();
  // Runs of kept positions (dst, src, len), last run first: every dst >= src, so moving runs from the end
  // backward never overwrites a source that is still to be read.
  std::vector<int64_t> rows, runs, run_start(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const bool* mb = m + b * T;
    int64_t dst = T;
    for (int64_t t = T - 1; t >= 0;) {
      if (!mb[t]) {
        --t;
        continue;
      }
      int64_t len = 0;
      while (t - len >= 0 && mb[t - len]) ++len;
      dst -= len;
      runs.insert(runs.end(), {dst, t - len + 1, len});
      t -= len;
    }
    out[b] = T - dst;
    run_start[b + 1] = int64_t(runs.size());
    if (dst > 0) rows.push_back(b);  // a fully kept row is already in place
  }
  for_lines(geos, rows, [&](const Line& line, int64_t b) {
    for (int64_t r = run_start[b]; r < run_start[b + 1]; r += 3) line.move(runs[r], runs[r + 1], runs[r + 2]);
    line.fill(0, T - out[b]);
  });
  return kept;
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_kernels, m) {
  m.def("shift_rows_cpp_(Tensor(a!)[] tensors, Tensor shifts, int dim, Scalar fill) -> ()");
  m.def("compact_rows_cpp_(Tensor(a!)[] tensors, Tensor keep, int dim, Scalar fill) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec_kernels, CPU, m) {
  m.impl("shift_rows_cpp_", &specdec::shift_rows_);
  m.impl("compact_rows_cpp_", &specdec::compact_rows_);
}
