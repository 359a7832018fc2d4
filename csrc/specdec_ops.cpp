// C++ CPU backend of specdec_kernels: registers torch.ops.specdec.*. The torch reference
// (kernels/reference.py) is the specification; every op here reproduces it bit for bit.
// Outputs are allocated by the Python side (kernels/cpp_backend.py) so tests can poison them.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

namespace {

using at::Tensor;

// ------------------------------------------------------------------------------------------------ argmax

// What a row's argmax scores: x = p (kPlain: score x; kDivide: x / e), or the residual
// x = max(p - q, 0) with q a row (kResidual) or one-hot at `hot` (kOneHot), scored x / e.
enum Mode { kPlain, kDivide, kResidual, kOneHot };

struct Best {
  int64_t index;  // first maximal score, or the first NaN (torch.argmax puts NaN above everything)
  float value;
  bool positive;  // some x > 0 (kResidual/kOneHot): the residual is not all zero
  bool nan;
};

// One element, in the same float32 operations as the vector loop and the reference: a true IEEE
// division (no reciprocal, never -ffast-math) and clamp_min(0), which keeps NaN and -0.0.
template <Mode M>
inline float score_at(const float* p, const float* q, const float* e, int64_t hot, int64_t v, float& x) {
  x = p[v];
  if (M == kResidual) x = x - q[v];
  if (M == kOneHot) x = x - (v == hot ? 1.0f : 0.0f);
  if (M == kResidual || M == kOneHot) x = x < 0.0f ? 0.0f : x;
  return M == kPlain ? x : x / e[v];
}

typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

inline f32x4 load4(const float* p) {
  f32x4 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline f32x4 select4(i32x4 m, f32x4 a, f32x4 b) { return (f32x4)(((i32x4)a & m) | ((i32x4)b & ~m)); }

// argmax over n >= 1 float32 elements. U vectors of 4 lanes each keep their lane's first maximum
// (strict >); the merge takes the largest value, lowest index, so ties go to the lowest index.
template <Mode M>
Best argmax_f32(int64_t n, const float* p, const float* q, const float* e, int64_t hot) {
  constexpr int W = 4, U = 4;
  constexpr bool kPos = M == kResidual || M == kOneHot;
  const int32_t hot32 = hot >= 0 && hot < n ? int32_t(hot) : -1;  // an invalid id matches no v
  const i32x4 iota = {0, 1, 2, 3};
  const f32x4 ones = {1.0f, 1.0f, 1.0f, 1.0f};
  Best r{0, 0.0f, false, false};
  int64_t v = 0;
  if (n >= W * U) {
    f32x4 best[U];
    i32x4 idx[U], nan[U], pos[U];
    auto step = [&](int64_t at, int u, bool first) {
      const i32x4 vi = iota + int32_t(at);
      f32x4 x = load4(p + at);
      if (M == kResidual) x = x - load4(q + at);
      if (M == kOneHot) x = x - (f32x4)((vi == hot32) & (i32x4)ones);
      if (kPos) x = (f32x4)((i32x4)x & ~(x < 0.0f));
      const f32x4 s = M == kPlain ? x : x / load4(e + at);
      const i32x4 gt = first ? ~i32x4{} : s > best[u];
      best[u] = select4(gt, s, best[u]);
      idx[u] = (vi & gt) | (idx[u] & ~gt);
      nan[u] = (first ? i32x4{} : nan[u]) | (s != s);
      if (kPos) pos[u] = (first ? i32x4{} : pos[u]) | (x > 0.0f);
    };
    for (int u = 0; u < U; ++u) step(u * W, u, true);
    for (v = W * U; v + W * U <= n; v += W * U)
      for (int u = 0; u < U; ++u) step(v + u * W, u, false);
    r = {idx[0][0], best[0][0], false, false};
    for (int u = 0; u < U; ++u) {
      for (int l = 0; l < W; ++l) {
        if (best[u][l] > r.value || (best[u][l] == r.value && idx[u][l] < r.index)) {
          r.value = best[u][l];
          r.index = idx[u][l];
        }
        r.nan |= nan[u][l] != 0;
        if (kPos) r.positive |= pos[u][l] != 0;
      }
    }
  }
  for (; v < n; ++v) {  // tail: higher indices than every lane, so strict > keeps the first maximum
    float x;
    const float s = score_at<M>(p, q, e, hot32, v, x);
    if (v == 0 || s > r.value) r.value = s, r.index = v;
    r.nan |= s != s;
    r.positive |= kPos && x > 0.0f;
  }
  for (int64_t u = 0; r.nan && u < n; ++u) {
    float x;
    const float s = score_at<M>(p, q, e, hot32, u, x);
    if (s != s) r.index = u, r.value = s, u = n;
  }
  return r;
}

// The same for float16/bfloat16/float64 rows: widen chunks to float32 (as the reference's .float() does),
// then merge the chunks in order (strict >, the first NaN wins, positive over all chunks).
template <Mode M, typename T>
Best argmax_row(int64_t n, const T* p, const T* q, const float* e, int64_t hot) {
  if constexpr (std::is_same_v<T, float>) {
    return argmax_f32<M>(n, p, q, e, hot);
  } else {
    constexpr int64_t C = 2048;
    float pc[C], qc[M == kResidual ? C : 1];
    if (hot < 0 || hot >= n) hot = -1;
    Best out{0, 0.0f, false, false};
    for (int64_t c = 0; c < n; c += C) {
      const int64_t m = std::min(C, n - c);
      for (int64_t i = 0; i < m; ++i) pc[i] = float(p[c + i]);
      if (M == kResidual)
        for (int64_t i = 0; i < m; ++i) qc[i] = float(q[c + i]);
      const Best r = argmax_f32<M>(m, pc, qc, M == kPlain ? nullptr : e + c, hot < 0 ? -1 : hot - c);
      out.positive |= r.positive;
      if (!out.nan && (c == 0 || r.nan || r.value > out.value)) out = {c + r.index, r.value, out.positive, r.nan};
    }
    return out;
  }
}

// torch.argmax of a logits row: float64 compares in float64; float16/bfloat16 widen to float32 exactly,
// which keeps the order.
template <typename T>
int64_t greedy_argmax(int64_t n, const T* x) {
  if constexpr (std::is_same_v<T, double>) {
    int64_t bi = 0;
    for (int64_t v = 0; v < n; ++v) {
      if (x[v] != x[v]) return v;
      if (x[v] > x[bi]) bi = v;
    }
    return bi;
  } else {
    return argmax_row<kPlain>(n, x, x, nullptr, -1).index;
  }
}

// The last dim must be dense (rows are read as plain arrays); the leading strides are honoured.
Tensor last_dim_dense(const Tensor& x) { return x.stride(-1) == 1 || x.size(-1) <= 1 ? x : x.contiguous(); }

void check_out(const Tensor& out, at::IntArrayRef shape) {
  TORCH_CHECK(out.scalar_type() == at::kLong && out.is_contiguous() && out.sizes() == shape,
              "specdec: output must be a contiguous int64 tensor of shape ", shape);
}

// Write tokens[b] = drafts[:a], last, then -1.
void write_row(int64_t* tokens, const int64_t* drafts, int64_t k, int64_t a, int64_t last) {
  for (int64_t i = 0; i <= k; ++i) tokens[i] = i < a ? drafts[i] : (i == a ? last : -1);
}

int64_t rows_grain(int64_t work_per_row) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_row)); }

// ---------------------------------------------------------------------------------------- accept_lengths

void accept_lengths(const Tensor& matches_in, const c10::optional<Tensor>& num_draft_in, Tensor out) {
  const Tensor matches = matches_in.contiguous();
  const int64_t batch = matches.size(0), k = matches.size(1);
  check_out(out, {batch});
  const Tensor nd = num_draft_in ? num_draft_in->contiguous() : Tensor();
  const bool* m = matches.data_ptr<bool>();
  const int64_t* n = nd.defined() ? nd.data_ptr<int64_t>() : nullptr;
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t limit = n ? std::min(n[b], k) : k;
    int64_t a = 0;
    while (a < limit && m[b * k + a]) ++a;
    o[b] = a;
  }
}

// ----------------------------------------------------------------------------------------- verify_greedy

void verify_greedy(const Tensor& drafts_in, const Tensor& logits_in, const c10::optional<Tensor>& num_draft_in,
                   Tensor tokens, Tensor num_accepted) {
  const Tensor drafts = drafts_in.contiguous(), logits = last_dim_dense(logits_in);
  const Tensor nd = num_draft_in ? num_draft_in->contiguous() : Tensor();
  const int64_t batch = drafts.size(0), k = drafts.size(1), vocab = logits.size(2);
  TORCH_CHECK(vocab < std::numeric_limits<int32_t>::max(), "specdec: vocabulary too large");
  check_out(tokens, {batch, k + 1});
  check_out(num_accepted, {batch});
  const int64_t* d = drafts.data_ptr<int64_t>();
  const int64_t* n = nd.defined() ? nd.data_ptr<int64_t>() : nullptr;
  int64_t* tok = tokens.data_ptr<int64_t>();
  int64_t* acc = num_accepted.data_ptr<int64_t>();
  const int64_t s0 = logits.stride(0), s1 = logits.stride(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "specdec_verify_greedy", [&] {
    const scalar_t* x = logits.data_ptr<scalar_t>();
    at::parallel_for(0, batch, rows_grain(vocab), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t limit = n ? std::min(n[b], k) : k;
        int64_t a = 0, last = 0;
        for (;; ++a) {  // argmax lazily: only the slots up to the first mismatch matter
          last = greedy_argmax(vocab, x + b * s0 + a * s1);
          if (a >= limit || d[b * k + a] != last) break;
        }
        acc[b] = a;
        write_row(tok + b * (k + 1), d + b * k, k, a, last);
      }
    });
  });
}

// -------------------------------------------------------------------------------------- rejection_sample

void rejection_sample(const Tensor& drafts_in, const c10::optional<Tensor>& q_in, const Tensor& p_in,
                      const c10::optional<Tensor>& num_draft_in, const Tensor& uniform_in,
                      const Tensor& exponential_in, Tensor tokens, Tensor num_accepted) {
  Tensor p = last_dim_dense(p_in);
  Tensor q = q_in ? last_dim_dense(*q_in) : Tensor();
  if (q.defined() && q.scalar_type() != p.scalar_type()) {  // mixed dtypes: widen both, as .float() does
    p = p.to(at::kFloat);
    q = q.to(at::kFloat);
  }
  const Tensor drafts = drafts_in.contiguous(), uniform = uniform_in.contiguous();
  const Tensor expo = last_dim_dense(exponential_in);
  const Tensor nd = num_draft_in ? num_draft_in->contiguous() : Tensor();
  const int64_t batch = drafts.size(0), k = drafts.size(1), vocab = p.size(2);
  TORCH_CHECK(vocab < std::numeric_limits<int32_t>::max(), "specdec: vocabulary too large");
  TORCH_CHECK(uniform.scalar_type() == at::kFloat && expo.scalar_type() == at::kFloat,
              "specdec: uniform and exponential must be float32");
  check_out(tokens, {batch, k + 1});
  check_out(num_accepted, {batch});
  const int64_t* d = drafts.data_ptr<int64_t>();
  const int64_t* n = nd.defined() ? nd.data_ptr<int64_t>() : nullptr;
  const float* u = uniform.data_ptr<float>();
  const float* e = expo.data_ptr<float>();
  const int64_t es0 = expo.stride(0);
  int64_t* tok = tokens.data_ptr<int64_t>();
  int64_t* acc = num_accepted.data_ptr<int64_t>();
  const int64_t ps0 = p.stride(0), ps1 = p.stride(1);
  const int64_t qs0 = q.defined() ? q.stride(0) : 0, qs1 = q.defined() ? q.stride(1) : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.scalar_type(), "specdec_rejection_sample", [&] {
    const scalar_t* P = p.data_ptr<scalar_t>();
    const scalar_t* Q = q.defined() ? q.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, batch, rows_grain(vocab), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t* db = d + b * k;
        const int64_t nb = n ? n[b] : k;  // compared raw with a below, like the reference's bonus test
        const int64_t limit = std::min(nb, k);
        int64_t a = 0;
        for (; a < limit; ++a) {  // accept iff u * q < p in float32; an invalid id is never accepted
          const int64_t id = db[a];
          if (id < 0 || id >= vocab) break;
          const float pv = float(P[b * ps0 + a * ps1 + id]);
          const float qv = Q ? float(Q[b * qs0 + a * qs1 + id]) : 1.0f;
          if (!(u[b * k + a] * qv < pv)) break;
        }
        const scalar_t* prow = P + b * ps0 + a * ps1;
        const float* eb = e + b * es0;
        Best r{0, 0.0f, false, false};
        if (a != nb) {  // rejected at slot j = a (clamped like the reference): residual max(p - q, 0)
          const int64_t j = std::min(a, std::max<int64_t>(k - 1, 0));
          if (k > 0 && Q) {
            r = argmax_row<kResidual>(vocab, prow, Q + b * qs0 + j * qs1, eb, -1);
          } else {  // q = one-hot(draft); an invalid id (or K = 0) matches no v
            r = argmax_row<kOneHot>(vocab, prow, prow, eb, k > 0 ? db[j] : -1);
          }
        }
        if (!r.positive) r = argmax_row<kDivide>(vocab, prow, prow, eb, -1);  // bonus row, or an all-zero residual
        acc[b] = a;
        write_row(tok + b * (k + 1), db, k, a, r.index);
      }
    });
  });
}

// ------------------------------------------------------------------------- row moves: shift and compact

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
void fill_bytes(const Tensor& x, const c10::Scalar& fill, unsigned char* out) {
  const Tensor one = at::empty({1}, x.options().device(at::kCPU));
  one.masked_fill_(at::ones({1}, at::TensorOptions().dtype(at::kBool)), fill);
  std::memcpy(out, one.data_ptr(), one.element_size());
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

void compact_rows_(at::TensorList tensors, const Tensor& keep_in, int64_t dim, const c10::Scalar& fill,
                   Tensor kept) {
  const Tensor keep = keep_in.contiguous();
  const int64_t batch = keep.size(0), T = keep.size(1);
  check_out(kept, {batch});
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
}

}  // namespace

TORCH_LIBRARY(specdec, m) {
  m.def("accept_lengths(Tensor matches, Tensor? num_draft, Tensor(a!) out) -> ()");
  m.def("verify_greedy(Tensor draft_tokens, Tensor target_logits, Tensor? num_draft, Tensor(a!) tokens, "
        "Tensor(b!) num_accepted) -> ()");
  m.def("rejection_sample(Tensor draft_tokens, Tensor? draft_probs, Tensor target_probs, Tensor? num_draft, "
        "Tensor uniform, Tensor exponential, Tensor(a!) tokens, Tensor(b!) num_accepted) -> ()");
  m.def("shift_rows_(Tensor(a!)[] tensors, Tensor shifts, int dim, Scalar fill) -> ()");
  m.def("compact_rows_(Tensor(a!)[] tensors, Tensor keep, int dim, Scalar fill, Tensor(b!) kept) -> ()");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("accept_lengths", &accept_lengths);
  m.impl("verify_greedy", &verify_greedy);
  m.impl("rejection_sample", &rejection_sample);
  m.impl("shift_rows_", &shift_rows_);
  m.impl("compact_rows_", &compact_rows_);
}

// A plain Python module: importing specdec_kernels._C runs the registrations above.
#define SPECDEC_CONCAT2(a, b) a##b
#define SPECDEC_CONCAT(a, b) SPECDEC_CONCAT2(a, b)
#define SPECDEC_STR2(a) #a
#define SPECDEC_STR(a) SPECDEC_STR2(a)
PyMODINIT_FUNC SPECDEC_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, SPECDEC_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr,
                               nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
