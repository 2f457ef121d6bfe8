// The bf16act families (bf16_activations.hpp): the reference, the composed
// form that rounds and reuses a set's fp32 products (every registry row
// without code of its own for them, dispatch.cpp), and the AVX-512 entry that
// dispatches to the vdpbf16ps GEMM when the CPU has it.
#include "moeserve/kernels/bf16_activations.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "moeserve/kernels/bf16_matmul.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels {

float RoundToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7F800000u) == 0) {
    u &= 0x80000000u;  // zero or subnormal: signed zero
  } else if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    u |= 0x00400000u;  // NaN: quiet, payload's top kept
    u &= 0xFFFF0000u;
  } else {
    u += 0x7FFFu + ((u >> 16) & 1u);  // nearest, ties to even (may carry into the exponent: to inf)
    u &= 0xFFFF0000u;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

std::vector<float> Rounded(const float* X, size_t count) {
  std::vector<float> r(count);
  for (size_t i = 0; i < count; ++i) r[i] = RoundToBf16(X[i]);
  return r;
}

// Columns [0, out) in one contiguous, 32-aligned range per thread.
template <class Fn>
void SplitColumns(size_t out, size_t in, size_t n, Fn fn) {
  ThreadPool& pool = DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  if (threads == 1 || static_cast<double>(out) * static_cast<double>(in) * static_cast<double>(n) < 65536.0) {
    fn(0, out);
    return;
  }
  size_t chunk = (out + threads - 1) / threads;
  chunk = (chunk + 31) / 32 * 32;
  pool.ParallelFor((out + chunk - 1) / chunk, [&](size_t i) { fn(i * chunk, std::min(out, (i + 1) * chunk)); });
}

// X as BF16 rows, shared by the threads; the row stride is padded to 32
// elements (and off multiples of 1 KiB, which would alias cache sets).
struct Bf16Rows {
  std::vector<uint16_t> data;
  size_t ld = 0;
  void Fill(const float* X, size_t n, size_t in) {
    ld = (in + 31) / 32 * 32;
    if (ld % 512 == 0) ld += 32;
    data.resize(n * ld);
    // On the pool: a call's rounding, alone on one thread, was a tenth of
    // BF16 prefill's time with the other threads waiting.
    constexpr size_t kRowsPerTask = 32;
    uint16_t* d = data.data();
    const size_t stride = ld;
    DefaultThreadPool().ParallelFor((n + kRowsPerTask - 1) / kRowsPerTask, [&](size_t c) {
      const size_t t0 = c * kRowsPerTask, rows = std::min(kRowsPerTask, n - t0);
      cpu::round_bf16_rows_avx512bf16(X + t0 * in, rows, in, d + t0 * stride, stride);
    });
  }
};

}  // namespace

// CpuHasAvx512Bf16: the AVX-512 row of the ISA registry (dispatch.cpp).

void MatMulMxfp4Bf16ActRef(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  const std::vector<float> r = Rounded(X, n * w.in);
  MatMulMxfp4PackedRef(w, r.data(), n, Y);
}

void MatMulBf16Bf16ActRef(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  const std::vector<float> r = Rounded(X, n * in);
  MatMulBf16Ref(W, out, in, r.data(), n, Y);
}

namespace cpu {

void MatMulMxfp4Bf16ActOver(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, const KernelSet& k) {
  const std::vector<float> r = Rounded(X, n * w.in);
  k.matmul_mxfp4(w, r.data(), n, Y);
}

void MatMulBf16Bf16ActOver(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                           const KernelSet& k) {
  const std::vector<float> r = Rounded(X, n * in);
  k.matmul_bf16(W, out, in, r.data(), n, Y);
}

void matmul_mxfp4_bf16act_avx512(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  if (w.out == 0 || n == 0) return;
  if (n < kGemmMinRows || !CpuHasAvx512Bf16() || w.in == 0)
    return MatMulMxfp4Bf16ActOver(w, X, n, Y, Kernels(Isa::kAvx512));
  thread_local Bf16Rows xb;
  xb.Fill(X, n, w.in);
  const uint16_t* data = xb.data.data();  // workers must not name the thread_local
  const size_t ld = xb.ld;
  SplitColumns(w.out, w.in, n, [&](size_t o0, size_t o1) { mxfp4_gemm_bf16dot(w, data, ld, n, Y, o0, o1); });
}

void matmul_bf16_bf16act_avx512(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  if (out == 0 || n == 0) return;
  if (n < kGemmMinRows || !CpuHasAvx512Bf16() || in == 0)
    return MatMulBf16Bf16ActOver(W, out, in, X, n, Y, Kernels(Isa::kAvx512));
  thread_local Bf16Rows xb;
  xb.Fill(X, n, in);
  const uint16_t* data = xb.data.data();
  const size_t ld = xb.ld;
  SplitColumns(out, in, n, [&](size_t o0, size_t o1) { bf16_gemm_bf16dot(W, out, in, data, ld, n, Y, o0, o1); });
}

}  // namespace cpu
}  // namespace moeserve::kernels
