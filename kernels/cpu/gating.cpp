#include "moeserve/kernels/gating.hpp"

#include "moeserve/kernels/cpu_ops.hpp"

#include "variants.hpp"
#include "vec_exp.hpp"

namespace moeserve::kernels {

void SiluMulRef(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Silu(a[i]) * b[i];
}

void SigmoidMulRef(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Sigmoid(a[i]) * b[i];
}

namespace {

enum class Gate { kSilu, kSigmoid };

#if defined(__x86_64__)
template <Gate G>
__attribute__((target("avx512f"))) void GateAvx512(const float* a, const float* b, float* out, size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 av = _mm512_maskz_loadu_ps(m, a + i), bv = _mm512_maskz_loadu_ps(m, b + i);
    const __m512 den = _mm512_add_ps(one, simd::Exp512(_mm512_sub_ps(_mm512_setzero_ps(), av)));
    __m512 g = G == Gate::kSilu ? _mm512_div_ps(av, den) : _mm512_div_ps(one, den);
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(av, av, _CMP_UNORD_Q), av);  // NaN stays NaN
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(g, bv));
  }
}

template <Gate G>
__attribute__((target("avx2,fma"))) void GateAvx2(const float* a, const float* b, float* out, size_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 av = _mm256_loadu_ps(a + i), bv = _mm256_loadu_ps(b + i);
    const __m256 den = _mm256_add_ps(one, simd::Exp256(_mm256_sub_ps(_mm256_setzero_ps(), av)));
    __m256 g = G == Gate::kSilu ? _mm256_div_ps(av, den) : _mm256_div_ps(one, den);
    g = _mm256_blendv_ps(g, av, _mm256_cmp_ps(av, av, _CMP_UNORD_Q));  // NaN stays NaN
    _mm256_storeu_ps(out + i, _mm256_mul_ps(g, bv));
  }
  for (; i < n; ++i) out[i] = (G == Gate::kSilu ? Silu(a[i]) : Sigmoid(a[i])) * b[i];
}
#endif

}  // namespace

#if defined(__x86_64__)
namespace cpu {
void silu_mul_avx2(const float* a, const float* b, float* out, size_t n) { GateAvx2<Gate::kSilu>(a, b, out, n); }
void sigmoid_mul_avx2(const float* a, const float* b, float* out, size_t n) { GateAvx2<Gate::kSigmoid>(a, b, out, n); }
void silu_mul_avx512(const float* a, const float* b, float* out, size_t n) { GateAvx512<Gate::kSilu>(a, b, out, n); }
void sigmoid_mul_avx512(const float* a, const float* b, float* out, size_t n) {
  GateAvx512<Gate::kSigmoid>(a, b, out, n);
}
}  // namespace cpu
#endif

}  // namespace moeserve::kernels
