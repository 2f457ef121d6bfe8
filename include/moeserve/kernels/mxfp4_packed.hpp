// MXFP4 weights repacked at load time for the CPU kernels, and the
// matrix-vector/matrix-matrix products over them.
//
// Why repack: the file layout keeps each row's blocks together, so a
// matrix-vector product must reduce every row to one number (a horizontal sum
// per row) and can only scale one block of one row per vector operation. Here
// rows go in groups of 16 and, within a group, 4 consecutive elements of each
// of the 16 rows sit side by side: one 64-byte line of codes is 16 rows x 8
// elements. An integer dot-product instruction (AVX-512 VNNI vpdpbusd, or
// AVX2 vpmaddubsw) then multiplies 16 rows x 4 elements against 4 broadcast
// activation bytes and leaves one running sum per row in each 32-bit lane;
// the per-block scales are applied once per 16 rows x 32 elements. The bytes
// read per weight stay 4.25 bits.
//
// Layout of one [out, in] matrix (in % 32 == 0), G = ceil(out / 16) groups,
// nb = in / 32 blocks per row:
//   codes  [G][nb][4][16][4] bytes: byte (g, b, c, r, j) holds, in its low
//          nibble, the E2M1 code of W[16g + r][32b + 8c + j] and, in its high
//          nibble, that of W[16g + r][32b + 8c + 4 + j].
//   scales [G][nb][16]: the E8M0 scale of row 16g + r, block b.
// Rows past `out` in the last group are zero (code 0, scale 127).
//
// Matrix-vector products (fewer than kMxfp4GemmMinRows activation rows)
// quantise each activation block of 32 to a 21-bit integer split into three
// int8 parts (q = 16384 hi + 128 mid + lo, |q| <= 2^20, scale = max|x| /
// 2^20): the integer sums are exact, so the only error is that rounding, at
// most 2^-21 of the block's largest activation per element, within fp32
// summation noise. (Two parts, 16 bits, miss model.md's 1e-4 for batched vs
// alone: a last-bit difference upstream becomes a whole 2^-15 step; they and
// one part remain an option, at every row count as integer products:
// mxfp4_activation_bits.hpp.) Every dispatch variant
// (scalar, AVX2, AVX-512) computes the same integers and applies the scales
// in the same order, so their results are bit-identical. Larger batches run a
// fp32 GEMM over weights dequantised exactly, as the reference does.
//
// Thread safety: the view functions are pure; the threaded products (the
// KernelSet entries) share DefaultThreadPool() (thread_pool.hpp) and may be
// called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <vector>

#include "moeserve/kernels/weight_memory.hpp"

namespace moeserve::kernels {

class ThreadPool;  // thread_pool.hpp

inline constexpr size_t kMxfp4PackRows = 16;
// The most activation rows of a batched decode step's products: up to this
// many, the MXFP4 and BF16 products read each weight once for all the rows
// with row-tiled kernels whose result for a row does not depend on the rows
// beside it (a batched step gives each sequence the bits it gets alone).
// More rows (prefill) run the GEMMs.
inline constexpr size_t kSmallBatchMaxRows = 64;
// Activation rows at which the MXFP4 products switch from the integer form
// (the matrix-vector kernel for one row, the row tiles for more) to the fp32
// GEMM.
inline constexpr size_t kMxfp4GemmMinRows = kSmallBatchMaxRows + 1;

inline size_t Mxfp4PackedGroups(size_t out) { return (out + kMxfp4PackRows - 1) / kMxfp4PackRows; }
inline size_t Mxfp4PackedCodeBytes(size_t out, size_t in) { return Mxfp4PackedGroups(out) * (in / 32) * 256; }
inline size_t Mxfp4PackedScaleBytes(size_t out, size_t in) { return Mxfp4PackedGroups(out) * (in / 32) * 16; }

// One packed [out, in] matrix; codes 64-byte aligned.
struct Mxfp4PackedView {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  size_t out = 0, in = 0;
};

// Repacks the file layout (blocks [out, in/32, 16], scales [out, in/32]) into
// codes/scales sized by the functions above. Lossless.
void PackMxfp4(const uint8_t* blocks, const uint8_t* scales, size_t out, size_t in, uint8_t* codes,
               uint8_t* packed_scales);
// The inverse: back to the file layout.
void UnpackMxfp4(const Mxfp4PackedView& w, uint8_t* blocks, uint8_t* scales);

// Row o's dequantised values for blocks [b0, b0 + nblocks), written to
// dst[k * stride] for k = 0 .. 32 * nblocks - 1 (exactly as the reference
// decodes them).
void DecodePackedRow(const Mxfp4PackedView& w, size_t o, size_t b0, size_t nblocks, float* dst, size_t stride);
// A GEMM panel: rows [o0, o0 + nr) over elements [k0, k0 + kc) (multiples of
// 32) into Wp[k * width + c], columns c in [nr, width) zero.
void DecodePackedPanel(const Mxfp4PackedView& w, size_t o0, size_t nr, size_t k0, size_t kc, float* Wp, size_t width);

// A stack of `count` equally shaped [out, in] matrices, packed (the MoE's
// experts of one projection).
class Mxfp4PackedStack {
 public:
  Mxfp4PackedStack() = default;
  // blocks/scales: `count` matrices back to back in the file layout.
  Mxfp4PackedStack(const uint8_t* blocks, const uint8_t* scales, size_t count, size_t out, size_t in);

  Mxfp4PackedView matrix(size_t i) const {
    return {codes_.data() + i * Mxfp4PackedCodeBytes(out_, in_), scales_.data() + i * Mxfp4PackedScaleBytes(out_, in_),
            out_, in_};
  }
  size_t count() const { return count_; }
  size_t rows() const { return out_; }
  size_t cols() const { return in_; }
  size_t bytes() const { return codes_.size() + scales_.size(); }

 private:
  std::vector<uint8_t, WeightAllocator<uint8_t>> codes_;
  std::vector<uint8_t> scales_;
  size_t count_ = 0, out_ = 0, in_ = 0;
};

// Activations quantised for the matrix-vector products: n rows of `in`
// values, each block of 32 as an integer q split into `nparts` int8 parts,
// per block a scale (max|x| / qmax, halved because the kernels multiply by
// twice the E2M1 value) and 12 * sum(q) (the kernels add 12 to every weight
// code to make it unsigned, and take this back off). The splits:
//   3 parts (the default, 21 bits): q = 16384 hi + 128 mid + lo, qmax 2^20;
//   2 parts (16 bits): q = 256 hi + lo, qmax 32512 (hi stays within int8);
//   1 part (8 bits): q, qmax 127.
// Each part costs one vpdpbusd per 64 weights, so fewer parts mean less
// integer work per byte of codes; the rounding, at most 0.5 / qmax of the
// block's largest activation per element, is the only error.
inline constexpr int kMxfp4ActParts = 3;  // the default split (and the most parts)
inline constexpr int32_t Mxfp4ActQmax(int nparts) { return nparts == 1 ? 127 : nparts == 2 ? 32512 : 1 << 20; }
// Part p's weight in q as a shift: q = sum_p part_p << shift.
inline constexpr int Mxfp4ActShift(int nparts, int p) {
  return nparts == 3 ? (p == 0 ? 14 : p == 1 ? 7 : 0) : nparts == 2 ? (p == 0 ? 8 : 0) : 0;
}
// The activation bits of a split (21, 16, 8) and back (0 for other values).
inline constexpr int Mxfp4ActBits(int nparts) { return nparts == 3 ? 21 : nparts == 2 ? 16 : nparts == 1 ? 8 : 0; }
inline constexpr int Mxfp4ActPartsForBits(int bits) { return bits == 21 ? 3 : bits == 16 ? 2 : bits == 8 ? 1 : 0; }
struct Mxfp4Activations {
  size_t n = 0, in = 0;
  int nparts = kMxfp4ActParts;
  const int8_t* parts = nullptr;    // [n][nparts][in], the most significant part first
  const float* scale = nullptr;     // [n][in/32]
  const int32_t* offset = nullptr;  // [n][in/32]
  const int8_t* part(size_t t, int p) const {
    return parts + (t * static_cast<size_t>(nparts) + static_cast<size_t>(p)) * in;
  }
};

// Quantises n rows of `in` activations into the nparts (1, 2 or 3) parts,
// scales and offsets of an Mxfp4Activations; every variant writes the same
// bytes. A KernelSet entry (cpu_kernels.hpp).
using Mxfp4QuantizeFn = void (*)(const float* X, size_t n, size_t in, int nparts, int8_t* parts, float* scale,
                                 int32_t* offset);

// Owns the buffers behind an Mxfp4Activations; reusable across calls.
class Mxfp4ActivationBuffer {
 public:
  // Quantises with the given variant (e.g. Kernels(isa).mxfp4_quantize.fn).
  // With a pool of several threads, many rows are quantised in parallel
  // (the same bytes).
  const Mxfp4Activations& Quantize(const float* X, size_t n, size_t in, Mxfp4QuantizeFn quantize,
                                   int nparts = kMxfp4ActParts, ThreadPool* pool = nullptr);

 private:
  std::vector<int8_t, WeightAllocator<int8_t>> parts_;
  std::vector<float> scale_;
  std::vector<int32_t> offset_;
  Mxfp4Activations view_;
};

// The products Y[n, out] = X[n, in] * dequant(W)^T over packed weights are
// the KernelSet families matmul_mxfp4 and matvec_mxfp4_many
// (cpu_kernels.hpp); their reference variants are these two: the packed
// matrix unpacked to the file layout, then MatMulMxfp4Ref (cpu_ops.hpp).
void MatMulMxfp4PackedRef(const Mxfp4PackedView& w, const float* X, size_t n, float* Y);

// One job of matvec_mxfp4_many: several matrix-vector products (each n <
// kMxfp4GemmMinRows) in one parallel pass, e.g. one decode step's routed
// experts: each expert matrix is small, and one hand-off to the pool per
// product costs more than sharing one. Same results as matmul_mxfp4 on each
// job, bit for bit.
struct Mxfp4MatVecJob {
  Mxfp4PackedView w;
  const float* X;  // [n, in]
  size_t n;
  float* Y;  // [n, out]
};
void MatVecMxfp4ManyRef(std::span<const Mxfp4MatVecJob> jobs);

}  // namespace moeserve::kernels
