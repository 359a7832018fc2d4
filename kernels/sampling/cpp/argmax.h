// Row argmax for the sampling ops: torch.argmax semantics (first maximal index; the first NaN wins), in the same
// float32 operations as the reference (kernels/sampling/reference.py), so results are equal bit for bit.
//
// The float32 loop is vectorised with GCC/Clang vector extensions (4 lanes x 4 accumulators). Other compilers,
// or a build with -DSPECDEC_PORTABLE=1, take the scalar loop, which gives the same index by construction
// (same scores, strict > keeps the first maximum, NaN pass after).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if (defined(__GNUC__) || defined(__clang__)) && !SPECDEC_PORTABLE
#define SPECDEC_VECTOR_EXT 1
#else
#define SPECDEC_VECTOR_EXT 0
#endif

namespace specdec {

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

#if SPECDEC_VECTOR_EXT
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

inline f32x4 load4(const float* p) {
  f32x4 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline f32x4 select4(i32x4 m, f32x4 a, f32x4 b) { return (f32x4)(((i32x4)a & m) | ((i32x4)b & ~m)); }
#endif

// argmax over n >= 1 float32 elements. U vectors of 4 lanes each keep their lane's first maximum
// (strict >); the merge takes the largest value, lowest index, so ties go to the lowest index.
template <Mode M>
Best argmax_f32(int64_t n, const float* p, const float* q, const float* e, int64_t hot) {
  constexpr bool kPos = M == kResidual || M == kOneHot;
  const int32_t hot32 = hot >= 0 && hot < n ? int32_t(hot) : -1;  // an invalid id matches no v
  Best r{0, 0.0f, false, false};
  int64_t v = 0;
#if SPECDEC_VECTOR_EXT
  constexpr int W = 4, U = 4;
  const i32x4 iota = {0, 1, 2, 3};
  const f32x4 ones = {1.0f, 1.0f, 1.0f, 1.0f};
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
#endif
  for (; v < n; ++v) {  // tail (or the whole row on the portable path): strict > keeps the first maximum
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

}  // namespace specdec
