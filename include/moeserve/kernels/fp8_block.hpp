// FP8 block-scaled weights, held as published (DeepSeek-V3.x checkpoints):
// an E4M3 matrix [rows, cols] of one-byte codes, row-major, with one fp32
// scale per 128 x 128 block ([ceil(rows/128), ceil(cols/128)], row-major:
// the checkpoint's `weight_scale_inv`). The real weight is
// E4M3(code) * scale, and the scale may be any float (not only a power of
// two, so converting to BF16 at load is not exact in general).
//
// The products multiply each decoded code by its block's scale in fp32 (one
// rounding, as upstream's dequantisation does) and accumulate the products
// with the activations in fp32. Conventions as cpu_ops.hpp: W [out = rows,
// in = cols], Y[n, rows] = X[n, cols] W^T. The threaded variants are the
// family matmul_fp8_block of cpu_kernels.hpp; they differ from
// MatMulFp8BlockRef only by fp32 summation order, and a row's result does
// not depend on the other rows of the call (the same bits alone or batched).
//
// Thread safety: pure functions over caller buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace moeserve::kernels {

// Rows and columns a scale covers.
inline constexpr size_t kFp8BlockSize = 128;

// A view of one FP8 block-scaled matrix (the buffers are the caller's).
struct Fp8BlockView {
  const uint8_t* codes = nullptr;  // [rows, cols] E4M3 codes, row-major
  const float* scales = nullptr;   // [scale_rows(), scale_cols()], row-major
  size_t rows = 0;                 // output features
  size_t cols = 0;                 // input features
  size_t scale_rows() const { return (rows + kFp8BlockSize - 1) / kFp8BlockSize; }
  size_t scale_cols() const { return (cols + kFp8BlockSize - 1) / kFp8BlockSize; }
  float scale(size_t row, size_t col) const {
    return scales[(row / kFp8BlockSize) * scale_cols() + col / kFp8BlockSize];
  }
};

// How many scales a [rows, cols] matrix has: ceil(rows/128) * ceil(cols/128).
size_t Fp8BlockScaleCount(size_t rows, size_t cols);

// The view of a tensor pair as a checkpoint holds it, checked: throws
// std::invalid_argument (saying which size is wrong) unless codes holds
// rows * cols bytes and scales Fp8BlockScaleCount(rows, cols) floats.
Fp8BlockView MakeFp8BlockView(std::span<const uint8_t> codes, std::span<const float> scales, size_t rows,
                              size_t cols);

// The value of an E4M3 code (OCP FP8 E4M3, "e4m3fn": sign, 4 exponent bits
// with bias 7, 3 mantissa bits; exponent 0 is subnormal, m/8 * 2^-6; no
// infinities; S.1111.111 is NaN; the largest finite value is 448). Exact in
// fp32.
float Fp8E4m3ToFloat(uint8_t code);

// The weights themselves, for rows [r_begin, r_end) into out ([r_end -
// r_begin, cols], row-major): E4M3(code) * scale rounded to fp32 once, the
// values every product multiplies by (what a loader that needs the elements,
// not a product, converts to). Branch-free per element, so the compiler
// vectorises it. NaN codes must have been refused first (Fp8FindNan): this
// decodes them as a finite value.
void Fp8BlockToF32(const Fp8BlockView& w, size_t r_begin, size_t r_end, float* out);

// Fp8BlockToF32's values rounded to BF16 (to nearest, ties to even; an
// infinite product stays infinite), rows [r_begin, r_end) into out: what a
// loader that holds the weights in BF16 (routed experts) converts to.
// Fp8BlockToBf16Ref is the plain loop (Fp8BlockToF32, then the rounding
// element by element); Fp8BlockToBf16 gives the same bits with the AVX-512
// decode where this CPU has it (avx512 = false forces the portable loop, for
// tests), single-threaded (callers split rows). NaN codes must have been
// refused first (Fp8FindNan).
void Fp8BlockToBf16Ref(const Fp8BlockView& w, size_t r_begin, size_t r_end, uint16_t* out);
void Fp8BlockToBf16(const Fp8BlockView& w, size_t r_begin, size_t r_end, uint16_t* out, bool avx512 = true);

// Y[n, rows] = X[n, cols] W^T through the AVX-512 fp32 GEMM (the avx512
// set's f32_matmul_cols), threaded over output rows on the kernel pool:
// the bits of Fp8BlockGemmRef, without an fp32 copy of W (each 32-row
// panel is decoded from the codes as the GEMM packs it) and with X
// reordered once per call rather than once per block of rows. Requires
// IsaSupported(Isa::kAvx512); meant for prefill row counts, more than
// kSmallBatchMaxRows (64; fewer run Fp8BlockGemmRef itself, whose
// f32_matmul_cols then takes its matrix-vector tiles). The GEMM sums in
// another order than matmul_fp8_block's row kernels.
// NaN codes must have been refused first (Fp8FindNan).
void Fp8BlockGemm(const Fp8BlockView& w, const float* X, size_t n, float* Y);
// Its reference: Fp8BlockToF32 of all rows, then the avx512 set's
// f32_matmul_cols over them on the calling thread.
void Fp8BlockGemmRef(const Fp8BlockView& w, const float* X, size_t n, float* Y);

// The index of the first NaN code (S.1111.111) in codes[0, n), or -1.
long long Fp8FindNan(const uint8_t* codes, size_t n);

// The reference product (single-threaded plain loops, the ground truth):
// Y[i * rows + r] = sum_k (E4M3(codes[r, k]) * scale(r, k)) * X[i * cols + k],
// the weight rounded to fp32 once, the sum in fp32 in k order.
void MatMulFp8BlockRef(const Fp8BlockView& w, const float* X, size_t n, float* Y);

// The family's signature (cpu_kernels.hpp: KernelSet::matmul_fp8_block).
using MatMulFp8BlockFn = void (*)(const Fp8BlockView& w, const float* X, size_t n, float* Y);

}  // namespace moeserve::kernels
