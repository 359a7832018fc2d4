// C++ CPU kernels of the sampling family: accept_lengths, verify_greedy, rejection_sample. The torch reference
// (kernels/sampling/reference.py) is the specification; every op here reproduces it bit for bit.
// Registered as specdec_kernels::*_cpp with functional schemas (outputs allocated here, poisonable for tests);
// the public ops' CPU kernels (kernels/library.py) call them when the "cpp" backend is chosen.
// Arguments arrive validated by the dispatch layer (kernels/ops.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "argmax.h"
#include "common.h"

namespace specdec {
namespace {

using at::Tensor;

// The last dim must be dense (rows are read as plain arrays); the leading strides are honoured.
Tensor last_dim_dense(const Tensor& x) { return x.stride(-1) == 1 || x.size(-1) <= 1 ? x : x.contiguous(); }

// Write tokens[b] = drafts[:a], last, then -1.
void write_row(int64_t* tokens, const int64_t* drafts, int64_t k, int64_t a, int64_t last) {
  for (int64_t i = 0; i <= k; ++i) tokens[i] = i < a ? drafts[i] : (i == a ? last : -1);
}

// ---------------------------------------------------------------------------------------- accept_lengths

Tensor accept_lengths(const Tensor& matches_in, const c10::optional<Tensor>& num_draft_in) {
  const Tensor matches = matches_in.contiguous();
  const int64_t batch = matches.size(0), k = matches.size(1);
  Tensor out = new_int64({batch}, matches);
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
  return out;
}

// ----------------------------------------------------------------------------------------- verify_greedy

std::tuple<Tensor, Tensor> verify_greedy(const Tensor& drafts_in, const Tensor& logits_in,
                                         const c10::optional<Tensor>& num_draft_in) {
  const Tensor drafts = drafts_in.contiguous(), logits = last_dim_dense(logits_in);
  const Tensor nd = num_draft_in ? num_draft_in->contiguous() : Tensor();
  const int64_t batch = drafts.size(0), k = drafts.size(1), vocab = logits.size(2);
  TORCH_CHECK(vocab < std::numeric_limits<int32_t>::max(), "specdec: vocabulary too large");
  Tensor tokens = new_int64({batch, k + 1}, drafts), num_accepted = new_int64({batch}, drafts);
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
  return {tokens, num_accepted};
}

// -------------------------------------------------------------------------------------- rejection_sample

std::tuple<Tensor, Tensor> rejection_sample(const Tensor& drafts_in, const c10::optional<Tensor>& q_in,
                                            const Tensor& p_in, const c10::optional<Tensor>& num_draft_in,
                                            const Tensor& uniform_in, const Tensor& exponential_in) {
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
  Tensor tokens = new_int64({batch, k + 1}, drafts), num_accepted = new_int64({batch}, drafts);
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
  return {tokens, num_accepted};
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_kernels, m) {
  m.def("accept_lengths_cpp(Tensor matches, Tensor? num_draft) -> Tensor");
  m.def("verify_greedy_cpp(Tensor draft_tokens, Tensor target_logits, Tensor? num_draft) -> (Tensor, Tensor)");
  m.def("rejection_sample_cpp(Tensor draft_tokens, Tensor? draft_probs, Tensor target_probs, Tensor? num_draft, "
        "Tensor uniform, Tensor exponential) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(specdec_kernels, CPU, m) {
  m.impl("accept_lengths_cpp", &specdec::accept_lengths);
  m.impl("verify_greedy_cpp", &specdec::verify_greedy);
  m.impl("rejection_sample_cpp", &specdec::rejection_sample);
}
