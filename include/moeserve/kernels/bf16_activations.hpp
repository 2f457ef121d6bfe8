// Products with the activations rounded to BF16: Y[n, out] = bf16(X)[n, in]
// W^T, for MXFP4 (packed) and BF16 weights, which BF16 holds exactly
// (E2M1 values times a power of two; BF16 as stored). With the activations
// in BF16 too, AVX-512 BF16's vdpbf16ps multiplies two pairs per fp32 lane:
// twice the products of an fp32 FMA per instruction, for the prefill GEMMs.
//
// Families matmul_mxfp4_bf16act and matmul_bf16_bf16act (cpu_kernels.hpp).
// Every variant computes the same thing, the products of the exact weights
// with X rounded to BF16 (nearest even; subnormal activations become 0),
// summed in fp32; they differ by summation order only:
//   reference: rounds X, then MatMulMxfp4PackedRef / MatMulBf16Ref;
//   scalar, AVX2: rounds X, then the set's matmul_mxfp4 / matmul_bf16;
//   AVX-512: the vdpbf16ps GEMM (matmul_bf16dot.cpp) when the CPU has
//     avx512_bf16 and n >= kMxfp4GemmMinRows, else as AVX2 does.
// vdpbf16ps treats subnormal BF16 inputs as zero: weights below 2^-126 in
// magnitude (MXFP4 blocks with E8M0 scale byte 0 or 1, which trained
// weights do not use) count as 0 there.
//
// Error against the fp32 product: rounding X to BF16 (8 significant bits)
// changes each x by at most 2^-8 |x|, so |y - y_fp32| <= 2^-8 sum_k |w_k x_k|
// plus fp32 summation error (for random signs, typically ~2^-9 sqrt(K) times
// a term, i.e. ~1e-3 of |y|). That is a BF16 path in model.md's sense (section 10 of
// docs/model-format.md); the engine uses it only where ModelOptions allow.
//
// Thread safety: pure functions over caller buffers; the threaded variants
// use the kernel thread pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moeserve/kernels/mxfp4_packed.hpp"

namespace moeserve::kernels {

// x rounded to the nearest BF16 (ties to even), returned as fp32; NaN stays
// NaN, subnormals become signed zero (as vcvtne2ps2bf16 does).
float RoundToBf16(float x);

void MatMulMxfp4Bf16ActRef(const Mxfp4PackedView& w, const float* X, size_t n, float* Y);
void MatMulBf16Bf16ActRef(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);

// Whether this CPU has vdpbf16ps (avx512_bf16 with AVX-512 F/BW).
bool CpuHasAvx512Bf16();

}  // namespace moeserve::kernels
