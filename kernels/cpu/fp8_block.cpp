// FP8 block-scaled products (fp8_block.hpp): the E4M3 decode, the checked
// view, the reference, the portable variant's row kernel, and the threaded
// entries of every Isa, which split output rows across the kernel pool and
// run their Isa's single-threaded row kernel (fp8_block_avx2.cpp,
// fp8_block_avx512.cpp) on each piece.
#include "moeserve/kernels/fp8_block.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/variants.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::kernels {

size_t Fp8BlockScaleCount(size_t rows, size_t cols) {
  return ((rows + kFp8BlockSize - 1) / kFp8BlockSize) * ((cols + kFp8BlockSize - 1) / kFp8BlockSize);
}

Fp8BlockView MakeFp8BlockView(std::span<const uint8_t> codes, std::span<const float> scales, size_t rows,
                              size_t cols) {
  if (rows == 0 || cols == 0)
    throw std::invalid_argument("fp8 block matrix: empty shape [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  if (codes.size() != rows * cols)
    throw std::invalid_argument("fp8 block matrix [" + std::to_string(rows) + ", " + std::to_string(cols) +
                                "]: " + std::to_string(codes.size()) + " code bytes, expected " +
                                std::to_string(rows * cols));
  const size_t want = Fp8BlockScaleCount(rows, cols);
  if (scales.size() != want)
    throw std::invalid_argument("fp8 block matrix [" + std::to_string(rows) + ", " + std::to_string(cols) +
                                "]: " + std::to_string(scales.size()) + " block scales, expected " +
                                std::to_string(want) + " (128 x 128 blocks)");
  return {codes.data(), scales.data(), rows, cols};
}

float Fp8E4m3ToFloat(uint8_t code) {
  const bool negative = (code & 0x80) != 0;
  const int e = (code >> 3) & 0xF;
  const int m = code & 0x7;
  float mag;
  if (e == 0xF && m == 0x7)
    mag = std::numeric_limits<float>::quiet_NaN();
  else if (e == 0)
    mag = std::ldexp(static_cast<float>(m), -9);  // m/8 * 2^-6
  else
    mag = std::ldexp(static_cast<float>(8 + m), e - 10);  // (1 + m/8) * 2^(e-7)
  return negative ? -mag : mag;
}

namespace {

// Fp8E4m3ToFloat without branches (a NaN code decodes as 480): a normal
// code's exponent and mantissa moved into fp32's fields with the bias moved
// from 7 to 127, a subnormal m * 2^-9 from the integer, the sign OR-ed in.
// The choice between the two is a mask, not a branch, so that the loop
// below vectorises.
inline float DecodeE4m3Finite(uint8_t code) {
  const uint32_t mag = code & 0x7Fu;
  const uint32_t normal = (mag << 20) + (120u << 23);
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(mag & 7u)) * 0x1p-9f);
  const uint32_t is_normal = 0u - static_cast<uint32_t>((mag >> 3) != 0);
  const uint32_t bits = (normal & is_normal) | (subnormal & ~is_normal);
  return std::bit_cast<float>(bits | (static_cast<uint32_t>(code & 0x80u) << 24));
}

}  // namespace

namespace {

// out[(r - r_begin) * cols + k] = convert(code x its block's scale) for rows
// [r_begin, r_end): the one loop of the fp32 and the portable BF16 forms.
template <class T, class Convert>
void DecodeRows(const Fp8BlockView& w, size_t r_begin, size_t r_end, T* out, Convert convert) {
  for (size_t r = r_begin; r < r_end; ++r) {
    const uint8_t* codes = w.codes + r * w.cols;
    const float* srow = w.scales + (r / kFp8BlockSize) * w.scale_cols();
    T* o = out + (r - r_begin) * w.cols;
    for (size_t k0 = 0, b = 0; k0 < w.cols; k0 += kFp8BlockSize, ++b) {
      const float s = srow[b];
      const size_t k1 = std::min(w.cols, k0 + kFp8BlockSize);
      for (size_t k = k0; k < k1; ++k) o[k] = convert(DecodeE4m3Finite(codes[k]) * s);
    }
  }
}

}  // namespace

void Fp8BlockToF32(const Fp8BlockView& w, size_t r_begin, size_t r_end, float* out) {
  DecodeRows(w, r_begin, r_end, out, [](float x) { return x; });
}

namespace {

// fp32 to BF16, round to nearest even (no NaN reaches here).
inline uint16_t Bf16BitsNearestEven(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

void Fp8BlockToBf16Ref(const Fp8BlockView& w, size_t r_begin, size_t r_end, uint16_t* out) {
  std::vector<float> row(w.cols);
  for (size_t r = r_begin; r < r_end; ++r) {
    Fp8BlockToF32(w, r, r + 1, row.data());
    for (size_t k = 0; k < w.cols; ++k) out[(r - r_begin) * w.cols + k] = Bf16BitsNearestEven(row[k]);
  }
}

void Fp8BlockToBf16(const Fp8BlockView& w, size_t r_begin, size_t r_end, uint16_t* out, bool avx512) {
  if (avx512 && IsaSupported(Isa::kAvx512)) return cpu::fp8_block_to_bf16_avx512(w, r_begin, r_end, out);
  // Portable: the decode and the rounding fused per element, branch-free so
  // that the compiler vectorises the inner loop.
  DecodeRows(w, r_begin, r_end, out, Bf16BitsNearestEven);
}

void Fp8BlockGemmRef(const Fp8BlockView& w, const float* X, size_t n, float* Y) {
  std::vector<float> wf(w.rows * w.cols);
  Fp8BlockToF32(w, 0, w.rows, wf.data());
  cpu::f32_matmul_cols_avx512(wf.data(), w.rows, w.cols, X, n, Y, 0, w.rows);
}

void Fp8BlockGemm(const Fp8BlockView& w, const float* X, size_t n, float* Y) {
  if (n == 0 || w.rows == 0) return;
  if (n <= kSmallBatchMaxRows) return Fp8BlockGemmRef(w, X, n, Y);
  ThreadPool& pool = DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size()), cols = w.cols, kc = cpu::kGemmPanelK;
  // X chunked as the GEMM reads it (each chunk's rows contiguous), once for
  // all the pieces below: per piece of rows, as the fp32 GEMM copies it,
  // that copy was n x cols floats each time (14.7 MB at 512 x 7168).
  // Uninitialised, and freed after the call (not held per thread: a
  // 2048-row chunk of an 18432-column input is 151 MB).
  const std::unique_ptr<float[]> xc_buffer(new float[n * cols]);
  float* const xc = xc_buffer.get();
  const size_t row_tasks = std::min(n, 8 * threads);
  pool.ParallelFor(row_tasks, [&](size_t t) {
    const size_t i0 = n * t / row_tasks, i1 = n * (t + 1) / row_tasks;
    for (size_t k0 = 0; k0 < cols; k0 += kc) {
      const size_t len = std::min(kc, cols - k0);
      for (size_t i = i0; i < i1; ++i) std::copy_n(X + i * cols + k0, len, xc + n * k0 + i * len);
    }
  });
  // Pieces of whole 32-row strips (the panel width), about 8 a thread: the
  // threads finish within a piece of each other (576-row kv_a made 5 pieces
  // of 128 rows for 2 threads), and each piece decodes its rows once.
  const size_t strips = (w.rows + 31) / 32;
  const size_t per_task = std::max<size_t>(1, strips / (8 * threads));
  const size_t tasks = (strips + per_task - 1) / per_task;
  pool.ParallelFor(tasks, [&](size_t t) {
    const size_t o0 = t * per_task * 32, o1 = std::min(w.rows, (t + 1) * per_task * 32);
    cpu::fp8_block_gemm_cols_avx512(w, xc, n, Y, o0, o1);
  });
}

long long Fp8FindNan(const uint8_t* codes, size_t n) {
  if (IsaSupported(Isa::kAvx512)) return cpu::fp8_find_nan_avx512(codes, n);
  // Chunks scanned without an early exit (vectorised), the first hit then
  // located in the chunk that has one.
  constexpr size_t kChunk = 4096;
  for (size_t i0 = 0; i0 < n; i0 += kChunk) {
    const size_t i1 = std::min(n, i0 + kChunk);
    uint8_t any = 0;
    for (size_t i = i0; i < i1; ++i) any |= static_cast<uint8_t>((codes[i] & 0x7F) == 0x7F);
    if (!any) continue;
    for (size_t i = i0; i < i1; ++i)
      if ((codes[i] & 0x7F) == 0x7F) return static_cast<long long>(i);
  }
  return -1;
}

void MatMulFp8BlockRef(const Fp8BlockView& w, const float* X, size_t n, float* Y) {
  for (size_t i = 0; i < n; ++i) {
    const float* x = X + i * w.cols;
    for (size_t r = 0; r < w.rows; ++r) {
      const uint8_t* codes = w.codes + r * w.cols;
      float acc = 0.0f;
      for (size_t k = 0; k < w.cols; ++k) {
        const float weight = Fp8E4m3ToFloat(codes[k]) * w.scale(r, k);
        acc += weight * x[k];
      }
      Y[i * w.rows + r] = acc;
    }
  }
}

namespace cpu {

const float* Fp8E4m3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = Fp8E4m3ToFloat(static_cast<uint8_t>(c));
    return t;
  }();
  return table.data();
}

namespace {

// Up to this many activation rows share one decoded weight.
constexpr size_t kScalarTile = 4;

template <size_t R>
void ScalarTile(const Fp8BlockView& w, const float* X, float* Y, size_t r, const float* table) {
  const uint8_t* codes = w.codes + r * w.cols;
  const float* srow = w.scales + (r / kFp8BlockSize) * w.scale_cols();
  float acc[R] = {};
  for (size_t k0 = 0, b = 0; k0 < w.cols; k0 += kFp8BlockSize, ++b) {
    const float s = srow[b];
    const size_t k1 = std::min(w.cols, k0 + kFp8BlockSize);
    for (size_t k = k0; k < k1; ++k) {
      const float weight = table[codes[k]] * s;
      for (size_t j = 0; j < R; ++j) acc[j] += weight * X[j * w.cols + k];
    }
  }
  for (size_t j = 0; j < R; ++j) Y[j * w.rows + r] = acc[j];
}

}  // namespace

void fp8_block_rows_scalar(const Fp8BlockView& w, const float* X, size_t n, float* Y, size_t r_begin,
                           size_t r_end) {
  const float* table = Fp8E4m3Table();
  for (size_t r = r_begin; r < r_end; ++r) {
    size_t i = 0;
    for (; i + kScalarTile <= n; i += kScalarTile) ScalarTile<kScalarTile>(w, X + i * w.cols, Y + i * w.rows, r, table);
    for (; i < n; ++i) ScalarTile<1>(w, X + i * w.cols, Y + i * w.rows, r, table);
  }
}

namespace {

// Output rows split across the pool: pieces small enough that both threads
// finish close together, large enough to amortise a hand-out. Small products
// run on the calling thread.
void OverRows(Fp8BlockRowsFn rows_fn, const Fp8BlockView& w, const float* X, size_t n, float* Y) {
  ThreadPool& pool = DefaultThreadPool();
  const size_t work = w.rows * w.cols * n;
  if (pool.size() == 1 || work < (size_t{1} << 16) || w.rows < 8) return rows_fn(w, X, n, Y, 0, w.rows);
  const size_t threads = static_cast<size_t>(pool.size());
  const size_t piece = std::clamp<size_t>(w.rows / (16 * threads), 4, 64);
  const size_t tasks = (w.rows + piece - 1) / piece;
  pool.ParallelFor(tasks, [&](size_t t) {
    const size_t b = t * piece;
    rows_fn(w, X, n, Y, b, std::min(w.rows, b + piece));
  });
}

}  // namespace

void matmul_fp8_block_scalar(const Fp8BlockView& w, const float* X, size_t n, float* Y) {
  OverRows(fp8_block_rows_scalar, w, X, n, Y);
}
void matmul_fp8_block_avx2(const Fp8BlockView& w, const float* X, size_t n, float* Y) {
  OverRows(fp8_block_rows_avx2, w, X, n, Y);
}
void matmul_fp8_block_avx512(const Fp8BlockView& w, const float* X, size_t n, float* Y) {
  // The activations in the order the row kernel decodes the weights in,
  // once per call on the calling thread (n x cols floats against rows x cols
  // weights decoded).
  // Started at a 64-byte boundary, so that a row's 16-float loads do not
  // straddle two cache lines (rows of a multiple of 16 columns).
  thread_local std::vector<float> permuted;
  permuted.resize(n * w.cols + 15);
  float* xp = permuted.data() + (-reinterpret_cast<uintptr_t>(permuted.data()) / sizeof(float) & 15);
  fp8_block_permute_x_avx512(X, n, w.cols, xp);
  OverRows(fp8_block_rows_avx512, w, xp, n, Y);
}

}  // namespace cpu
}  // namespace moeserve::kernels
