#include "moeserve/kernels/gating.hpp"

#include "moeserve/kernels/cpu_ops.hpp"

#include "moeserve/kernels/x86_intrinsics.hpp"

namespace moeserve::kernels {

void SiluMulRef(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Silu(a[i]) * b[i];
}

void SigmoidMulRef(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Sigmoid(a[i]) * b[i];
}

namespace {

// exp(x) = 2^k e^r, k = round(x log2 e), r = x - k ln 2 (ln 2 in two parts so
// r is exact), e^r by the degree-6 polynomial of the Cephes expf.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

enum class Gate { kSilu, kSigmoid };

#if defined(__x86_64__)
__attribute__((target("avx512f"))) inline __m512 Exp512(__m512 x) {
  // Outside [-104, 89] e^x is 0 or inf in float; clamping keeps r exact, and
  // scalef gives the denormals, zeros and infinities.
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

template <Gate G>
__attribute__((target("avx512f"))) void GateAvx512(const float* a, const float* b, float* out, size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 av = _mm512_maskz_loadu_ps(m, a + i), bv = _mm512_maskz_loadu_ps(m, b + i);
    const __m512 den = _mm512_add_ps(one, Exp512(_mm512_sub_ps(_mm512_setzero_ps(), av)));
    __m512 g = G == Gate::kSilu ? _mm512_div_ps(av, den) : _mm512_div_ps(one, den);
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(av, av, _CMP_UNORD_Q), av);  // NaN stays NaN
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(g, bv));
  }
}

__attribute__((target("avx2,fma"))) inline __m256 Exp256(__m256 x) {
  // 2^k is built in the exponent field, so k stays in [-126, 127].
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i pow2k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2k));
}

template <Gate G>
__attribute__((target("avx2,fma"))) void GateAvx2(const float* a, const float* b, float* out, size_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 av = _mm256_loadu_ps(a + i), bv = _mm256_loadu_ps(b + i);
    const __m256 den = _mm256_add_ps(one, Exp256(_mm256_sub_ps(_mm256_setzero_ps(), av)));
    __m256 g = G == Gate::kSilu ? _mm256_div_ps(av, den) : _mm256_div_ps(one, den);
    g = _mm256_blendv_ps(g, av, _mm256_cmp_ps(av, av, _CMP_UNORD_Q));  // NaN stays NaN
    _mm256_storeu_ps(out + i, _mm256_mul_ps(g, bv));
  }
  for (; i < n; ++i) out[i] = (G == Gate::kSilu ? Silu(a[i]) : Sigmoid(a[i])) * b[i];
}
#endif

template <Gate G>
void Dispatch(const float* a, const float* b, float* out, size_t n, CpuIsa isa) {
  if (!CpuSupports(isa)) isa = CpuIsa::kScalar;
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx512) return GateAvx512<G>(a, b, out, n);
  if (isa == CpuIsa::kAvx2) return GateAvx2<G>(a, b, out, n);
#endif
  if (G == Gate::kSilu) SiluMulRef(a, b, out, n);
  else SigmoidMulRef(a, b, out, n);
}

}  // namespace

void SiluMul(const float* a, const float* b, float* out, size_t n, CpuIsa isa) {
  Dispatch<Gate::kSilu>(a, b, out, n, isa);
}

void SigmoidMul(const float* a, const float* b, float* out, size_t n, CpuIsa isa) {
  Dispatch<Gate::kSigmoid>(a, b, out, n, isa);
}

}  // namespace moeserve::kernels
