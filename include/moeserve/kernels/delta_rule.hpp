// The gated delta rule of Gated DeltaNet (model.md 5.3) for one head, in its
// two equal forms: the recurrent step (decode) and the chunked WY form
// (prefill). State S is [dk, dv], row-major; q, k have `qk_stride` floats
// between tokens, v has `v_stride`, o has `o_stride`; beta and g (log-decay)
// are per token. q is expected already scaled by dk^-0.5.
//
// Thread safety: pure functions over caller buffers.
#pragma once

#include <cstddef>

namespace moeserve::kernels {

// Per token: S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
void DeltaRuleRecurrent(const float* q, const float* k, const float* v, const float* beta, const float* g, int T, int dk,
                        int dv, size_t qk_stride, size_t v_stride, float* S, float* o, size_t o_stride);

// The same over chunks of C tokens: dense [C, C] products within a chunk
// and one state update per chunk instead of C. The reference of the
// delta_rule_chunked family (cpu_kernels.hpp), whose other variants run it
// as blocked, vectorised products (delta_rule_chunked.cpp).
void DeltaRuleChunked(const float* q, const float* k, const float* v, const float* beta, const float* g, int T, int dk,
                      int dv, size_t qk_stride, size_t v_stride, float* S, float* o, size_t o_stride, int C);

}  // namespace moeserve::kernels
