// The MXFP4 matrix-vector product with fewer activation bits than
// matvec_mxfp4's three-part, 21-bit split (mxfp4_packed.hpp), for a decode
// step whose speed is bound by the integer dot products rather than by
// memory: each block of 32 activations is quantised to one int8 (1 part,
// |q| <= 127) or to a 16-bit integer split into two int8 parts
// (2 parts: q = 256 hi + lo, |q| <= 32512), scale max|x| / qmax per block.
// Per 64-byte line of packed codes the AVX-512 VNNI variant issues 2 or 4
// vpdpbusd instead of 6 (plus the two vpermb table look-ups that map the
// nibbles to twice the E2M1 value plus 12, unsigned); the integer block sums
// stay exact and the E8M0 and activation scales are applied once per block
// of 16 rows in fp32, in the same order in every variant, so the variants'
// results are bit-identical to the scalar reference.
//
// The only error is the activation rounding: per element at most
// 0.5 * max|x_block| / qmax, so |y - exact| <= sum_k |w_k| * that bound
// (plus fp32 summation); tests/kernels/mxfp4_matvec_split_test.cpp holds
// every variant to it. One part misses the CPU tolerance of
// docs/model-format.md section 10 (measured 8.6e-3 of the largest output);
// two parts were measured at 1.9e-4 of the largest logit through the model
// (mxfp4_packed.hpp), over the batched-vs-alone bound the 21-bit split keeps;
// and on the 2-core Zen 4 measured neither is faster than the three-part
// product beyond the noise (bench/roofline/README.md). So the engine does not
// use this product; it stays for measurement.
//
// Thread safety: pure functions; MatVecMxfp4Split shares DefaultThreadPool()
// and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moeserve/kernels/mxfp4_packed.hpp"
#include "moeserve/kernels/weight_memory.hpp"

namespace moeserve::kernels {

// The largest |q| of each split (the two-part one keeps hi within int8).
inline constexpr int32_t Mxfp4SplitQmax(int parts) { return parts == 1 ? 127 : 32512; }

// One activation row of `in` values (in % 32 == 0) quantised for the split
// product. A block holding NaN or infinity gets scale NaN (its rows' sums
// become NaN, as the fp32 product's would).
struct Mxfp4SplitActivations {
  int parts = 0;  // 1 or 2
  size_t in = 0;
  std::vector<int8_t, WeightAllocator<int8_t>> q;  // [parts][in]: hi, then lo
  std::vector<float> scale;                        // [in/32]: max|x| / qmax / 2 (kernels use 2 x E2M1)
  std::vector<int32_t> offset;                     // [in/32]: 12 * sum(q) (kernels add 12 to each weight)
  const int8_t* part(int p) const { return q.data() + static_cast<size_t>(p) * in; }
};

// Quantises x[0, in) into out (parts 1 or 2; in a multiple of 32).
void QuantizeMxfp4Split(const float* x, size_t in, int parts, Mxfp4SplitActivations& out);

// One variant's building block: rows of groups [g_begin, g_end) of
// y[w.out] = dequant(W) x.
using Mxfp4SplitMatVecFn = void (*)(const Mxfp4PackedView& w, const Mxfp4SplitActivations& x, float* y,
                                    size_t g_begin, size_t g_end);
struct Mxfp4SplitVariant {
  const char* name;
  Mxfp4SplitMatVecFn fn;
};
// Every variant this CPU runs, the scalar reference first.
std::vector<Mxfp4SplitVariant> Mxfp4SplitVariants();
// The fastest of them, chosen once.
Mxfp4SplitMatVecFn BestMxfp4SplitMatVec();

// The scalar reference over all rows.
void MatVecMxfp4SplitRef(const Mxfp4PackedView& w, const Mxfp4SplitActivations& x, float* y);

// y[w.out] = dequant(W) x[w.in]: quantises x, then runs the fastest variant
// on the default pool.
void MatVecMxfp4Split(const Mxfp4PackedView& w, const float* x, int parts, float* y);

}  // namespace moeserve::kernels
