// Vectors of W floats as GCC vector types, for kernels written once and
// compiled per variant (a target attribute on the variant's entry point):
// W = 16 (AVX-512), 8 (AVX2), 4 (the scalar set: SSE2 on x86-64, plain code
// elsewhere). Every helper is always_inline, so its code is the variant's
// ISA; never wrap them in a lambda or an out-of-line function, whose body
// would be compiled for the baseline instead. Vectors travel by reference
// (no function passes one by value, so no ABI question arises).
#pragma once

#include <cstring>

namespace moeserve::kernels::cpu::vec {

typedef float F4 __attribute__((vector_size(16)));
typedef float F8 __attribute__((vector_size(32)));
typedef float F16 __attribute__((vector_size(64)));
typedef int I4 __attribute__((vector_size(16)));
typedef int I8 __attribute__((vector_size(32)));
typedef int I16 __attribute__((vector_size(64)));

template <int W>
struct Of;
template <>
struct Of<4> {
  using F = F4;
  using I = I4;
};
template <>
struct Of<8> {
  using F = F8;
  using I = I8;
};
template <>
struct Of<16> {
  using F = F16;
  using I = I16;
};

template <class V>
[[gnu::always_inline]] inline void Load(V& v, const float* p) {
  std::memcpy(&v, p, sizeof v);
}
template <class V>
[[gnu::always_inline]] inline void Store(float* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

// x = e^x, x clamped to [-87, 88] (NaN stays NaN): the Cephes expf
// polynomial, as vec_exp.hpp, in W lanes.
template <int W>
[[gnu::always_inline]] inline void ExpInPlace(typename Of<W>::F& x) {
  using V = typename Of<W>::F;
  using I = typename Of<W>::I;
  const V zero{}, lo = zero - 87.0f, hi = zero + 88.0f;
  V t = x > hi ? hi : x;
  t = t < lo ? lo : t;
  // Round t log2 e to the nearest integer (the 1.5 2^23 trick: exact below 2^22).
  const V k = (t * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  V r = t - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  V p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^k built in the exponent field (-126 <= k <= 127 after the clamp).
  const I e = (__builtin_convertvector(k, I) + 127) << 23;
  x = p * __builtin_bit_cast(V, e);
}

// x[i] = e^{x[i]} for i < n, a multiple of W.
template <int W>
[[gnu::always_inline]] inline void ExpArray(float* x, int n) {
  for (int i = 0; i < n; i += W) {
    typename Of<W>::F v;
    Load(v, x + i);
    ExpInPlace<W>(v);
    Store(x + i, v);
  }
}

}  // namespace moeserve::kernels::cpu::vec
