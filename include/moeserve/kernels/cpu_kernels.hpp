// How a caller gets a CPU kernel: the one dispatch mechanism, as ggml does it.
//
// Every kernel family (an operation: an fp32 matmul, a BF16 matrix-vector
// pass, MLA decode, ...) has one function-pointer signature and one variant
// per Isa: the plain reference (the ground truth, single-threaded loops), a
// portable scalar variant (threaded), an AVX2+FMA variant, an AVX-512
// (F/BW/VL/DQ + VNNI, VBMI) variant, and an AMX row (tiles with BF16,
// amx_tiles.hpp) that brings the BF16-activation products and takes the
// rest from AVX-512. A last row, amx_model, is for tests only (as the
// reference): the AMX row's code on a software model of the tiles, so that
// every CPU with AVX-512 BF16 runs it end to end. A KernelSet holds one entry of every
// family for one Isa; Kernels(isa) returns it. The sets are resolved at
// compile time from the ISA registry (kernels/cpu/dispatch.cpp), one row per
// Isa; which one a caller uses is its own choice, made once
// (the engine picks its set when a model is loaded: Isa::kReference for
// `--kernels reference`, BestIsa() otherwise). Nothing here looks at "the
// active ISA" behind a caller's back: every variant runs exactly the code its
// set names, and tests reach any variant by asking for its Isa.
//
// Each entry carries its variant's name (e.g. "matmul_f32_avx2"). Where a
// family has no code of its own for an Isa, the entry is its registry row's
// fallback's and its name says so (the AVX2 set's MXFP4 quantiser is
// "mxfp4_quantize_scalar"; the reference set's single-threaded building
// blocks are the scalar ones, which are plain loops).
//
// Conventions as cpu_ops.hpp: row-major, W [out, in], Y[n, out] = X[n, in] W^T.
// Fast variants differ from the reference only by fp32 summation order,
// except the MXFP4 matrix-vector products, which quantise activations (within
// the bound stated in mxfp4_packed.hpp) and give the same bits on every Isa.
//
// Thread safety: the sets are immutable; the entries are pure functions over
// caller buffers. Threaded entries share DefaultThreadPool() (thread_pool.hpp)
// and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/bf16_activations.hpp"
#include "moeserve/kernels/bf16_matmul.hpp"
#include "moeserve/kernels/fp8_block.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"

namespace moeserve::kernels {

// The CPU instruction sets the kernels are written for. Each value is one row
// of the ISA registry (kernels/cpu/dispatch.cpp), which alone says what it is
// called, how the CPU is asked whether it has it, which kernels it brings,
// which set it falls back to for the rest, and where it ranks; every function
// below reads that registry. Adding an ISA: a value here, a row there, its
// kernel files (kernels/README.md, "Adding an ISA").
enum class Isa { kReference = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3, kAmx = 4, kAmxModel = 5 };
inline constexpr int kIsaCount = 6;

// Its registry name: "reference", "scalar", "avx2", "avx512", "amx", "amx_model".
const char* IsaName(Isa isa);
// The suffix its own variants' names carry ("ref" for the reference set, the
// name otherwise): matmul_f32_<suffix>.
const char* IsaVariantSuffix(Isa isa);
// The Isa whose kernels fill the families isa has no code of its own for
// (the reference set: itself).
Isa IsaFallback(Isa isa);
// The Isa a registry name names, or false (-> nullopt) for any other text.
std::optional<Isa> IsaByName(std::string_view name);
// Every registry row, in the registry's order: reference first, then from the
// least to the most preferred.
std::span<const Isa> AllIsas();
// Whether this CPU (and this build) can run the variant: its own detection
// and its fallback's. Reference and scalar always.
bool IsaSupported(Isa isa);
// Every Isa this CPU can run, in registry order (reference first).
std::vector<Isa> SupportedIsas();
// Whether BestIsa (and MOESERVE_CPU_ISA) may pick it: every row but the two
// that exist for tests (the reference, and amx_model).
bool IsaServes(Isa isa);
// The most preferred serving Isa this CPU supports, capped by
// MOESERVE_CPU_ISA (the name of a serving row; read once, at the first call;
// any other name is reported on stderr and ignored). Never kReference.
Isa BestIsa();
// One line for logs: the Isas this CPU runs, the optional instructions their
// kernels found, and the best ("supported: reference scalar avx2 avx512
// (avx512 with avx512_bf16); best: avx512").
std::string IsaReport();

// One variant of a family: the function and its name.
template <class Fn>
struct Kernel {
  Fn fn = nullptr;
  const char* name = "";
  template <class... Args>
  decltype(auto) operator()(Args&&... args) const {
    return fn(std::forward<Args>(args)...);
  }
};

// The families' signatures.
//
// Threaded products: Y[n, out] = X[n, in] W^T (MXFP4: W packed, see
// mxfp4_packed.hpp; BF16: W held as BF16, see bf16_matmul.hpp).
using MatMulF32Fn = void (*)(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y);
using MatMulBf16Fn = void (*)(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);
using MatMulMxfp4Fn = void (*)(const Mxfp4PackedView& w, const float* X, size_t n, float* Y);
// The same products with X rounded to BF16 (bf16_activations.hpp): the
// families matmul_mxfp4_bf16act and matmul_bf16_bf16act share these two
// signatures; on AVX-512 with avx512_bf16 they run vdpbf16ps.
// Several matrix-vector products in one parallel pass (each job as alone, bit
// for bit): a decode step's projections of one input, or its routed experts.
using MatVecBf16ManyFn = void (*)(std::span<const Bf16MatVecJob> jobs, size_t n);
using MatVecMxfp4ManyFn = void (*)(std::span<const Mxfp4MatVecJob> jobs);
// Per head h < heads: Y[h * y_stride + r] = sum_c W[h * head_stride + r * cols + c]
// * X[h * x_stride + c] for r < rows (a small matrix-vector product per head,
// as MLA's absorbed decode needs twice per query). Heads run in parallel when
// the work is large enough.
using HeadwiseMatVecFn = void (*)(const float* W, size_t heads, size_t rows, size_t cols, size_t head_stride,
                                  const float* X, size_t x_stride, float* Y, size_t y_stride);
// One row: y = w * x / sqrt(mean(x^2) + eps).
// y may alias x (every variant sums the squares before it writes).
using RmsNormFn = void (*)(const float* x, const float* w, float eps, size_t d, float* y);
// out[i] = gate(a[i]) * b[i] (gating.hpp); out may alias a or b.
using GateFn = void (*)(const float* a, const float* b, float* out, size_t n);
// attention.hpp: MLA decode over cached rows, and the DSA indexer's scores.
using MlaDecodeFn = void (*)(const MlaDecodeShape& shape, const float* q_abs, const float* q_pe,
                             const float* const* rows, size_t offset, const int* keys, int n_keys, float* lat);
// attention.hpp: queries with their own key lists (DSA's sparse rows), in parallel.
using MlaRowsFn = void (*)(const MlaDecodeShape& shape, int queries, const float* q_abs, const float* q_pe,
                           const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,
                           float* lat);
using IndexerScoresFn = void (*)(const float* iq, const float* w, int heads, int dim, const float* const* rows,
                                 size_t offset, int n, float* scores);
using IndexerScoresBatchFn = void (*)(const float* iq, const float* w, int queries, int heads, int dim,
                                      const float* const* rows, size_t offset, const int* n, float* scores, size_t ld);
// indexer_int8.hpp: the same scores over int8 keys and queries (a block of
// queries as the batch form; one for decode).
using IndexerScoresInt8Fn = void (*)(const IndexerInt8Query& query, int queries, int heads, int dim,
                                     const float* const* rows, size_t offset, const int* n, float* scores, size_t ld);
// indexer_int8.hpp: the same over keys stored by blocks of block_keys.
using IndexerScoresInt8BlockedFn = void (*)(const IndexerInt8Query& query, int queries, int heads, int dim,
                                            const float* const* blocks, int block_keys, const int* n, float* scores,
                                            size_t ld);
// delta_rule.hpp: the recurrent gated delta rule for one head.
using DeltaRuleRecurrentFn = void (*)(const float* q, const float* k, const float* v, const float* beta,
                                      const float* g, int T, int dk, int dv, size_t qk_stride, size_t v_stride,
                                      float* S, float* o, size_t o_stride);
// delta_rule.hpp: the chunked (WY) gated delta rule for one head, chunks of C
// tokens; single-threaded (callers run heads in parallel).
using DeltaRuleChunkedFn = void (*)(const float* q, const float* k, const float* v, const float* beta, const float* g,
                                    int T, int dk, int dv, size_t qk_stride, size_t v_stride, float* S, float* o,
                                    size_t o_stride, int C);
// causal_conv.hpp: DeltaNet's causal depthwise conv + silu over a block of
// channels; single-threaded.
using CausalConvSiluFn = void (*)(const float* tail, size_t tail_stride, const float* x, size_t x_stride, int T, int n,
                                  const float* w, int K, float* out, size_t out_stride);
//
// Single-threaded building blocks of the products above, which their tests
// drive directly (column ranges, k-chunks). They compute output columns
// [o_begin, o_end) of Y for all n rows of X (Y's other columns are left
// alone). The MXFP4 matrix-vector form works on whole 16-row groups
// [g_begin, g_end) of the packed layout and on pre-quantised activations (see
// mxfp4_packed.hpp), over the 32-element blocks [b_begin, b_end) of each row:
// from b_begin > 0 it continues the sums Y already holds (so a row can be done
// in k-chunks, with the same result bit for bit).
// (Mxfp4QuantizeFn: mxfp4_packed.hpp.)
using Mxfp4MatVecFn = void (*)(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin,
                               size_t g_end, size_t b_begin, size_t b_end);
using Mxfp4GemmFn = void (*)(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, size_t o_begin,
                             size_t o_end);
using F32MatMulColsFn = void (*)(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                                 size_t o_begin, size_t o_end);

struct KernelSet {
  Isa isa;
  Kernel<MatMulF32Fn> matmul_f32;
  Kernel<MatMulBf16Fn> matmul_bf16;
  Kernel<MatMulMxfp4Fn> matmul_mxfp4;
  Kernel<MatVecBf16ManyFn> matvec_bf16_many;
  Kernel<MatVecMxfp4ManyFn> matvec_mxfp4_many;
  Kernel<HeadwiseMatVecFn> headwise_matvec;
  Kernel<RmsNormFn> rms_norm;
  Kernel<GateFn> silu_mul;
  Kernel<GateFn> sigmoid_mul;
  Kernel<MlaDecodeFn> mla_decode;
  Kernel<MlaRowsFn> mla_rows;
  Kernel<IndexerScoresFn> indexer_scores;
  Kernel<DeltaRuleRecurrentFn> delta_rule_recurrent;
  // Building blocks.
  Kernel<Mxfp4QuantizeFn> mxfp4_quantize;
  Kernel<Mxfp4MatVecFn> mxfp4_matvec;
  Kernel<Mxfp4GemmFn> mxfp4_gemm;
  Kernel<F32MatMulColsFn> f32_matmul_cols;
  // Products with BF16-rounded activations (prefill GEMMs).
  Kernel<MatMulMxfp4Fn> matmul_mxfp4_bf16act;
  Kernel<MatMulBf16Fn> matmul_bf16_bf16act;
  // The indexer's scores for a block of queries (attention.hpp).
  Kernel<IndexerScoresBatchFn> indexer_scores_batch;
  // Gated DeltaNet's chunked delta rule (prefill) and its convolution.
  Kernel<DeltaRuleChunkedFn> delta_rule_chunked;
  Kernel<CausalConvSiluFn> causal_conv_silu;
  // mxfp4_matvec's results for many activation rows at once, bit-identical
  // row by row (the integer products of prefill with fewer activation bits,
  // mxfp4_activation_bits.hpp): a row tile per decoded line of codes where
  // an Isa has one, else the matrix-vector block itself.
  Kernel<Mxfp4MatVecFn> mxfp4_matvec_rows;
  // Y[n, rows] = X[n, cols] W^T over FP8 E4M3 weights with 128 x 128 fp32
  // block scales, held as published (fp8_block.hpp); threaded over output
  // rows, one row (decode) or many (batched decode, prefill).
  Kernel<MatMulFp8BlockFn> matmul_fp8_block;
  // The DSA indexer's scores over int8 keys (indexer_int8.hpp; vpdpbusd on
  // AVX-512 VNNI), bit-identical to IndexerScoresInt8Ref in every variant.
  Kernel<IndexerScoresInt8Fn> indexer_scores_int8;
  // The same over keys stored by blocks (the engine's pool layout),
  // bit-identical to IndexerScoresInt8BlockedRef and to the row form.
  Kernel<IndexerScoresInt8BlockedFn> indexer_scores_int8_blocked;
};

// The set for isa. isa must be supported (IsaSupported): asking for a set
// this CPU cannot run aborts with a message rather than fault later on an
// illegal instruction, or quietly run another variant.
const KernelSet& Kernels(Isa isa);

// The set for isa with its matmul_mxfp4 and matmul_bf16 entries taking
// BF16-rounded activations from kBf16ActMinRows rows up (the
// matmul_*_bf16act families; fewer rows, the set's own products): what a
// caller that accepts BF16 activation rounding in its prefill GEMMs uses.
// Names: "<family>_<isa>+bf16act". Refuses an unsupported isa as Kernels().
inline constexpr size_t kBf16ActMinRows = 32;
const KernelSet& KernelsWithBf16Activations(Isa isa);

// The set for isa made batch-invariant (EngineOptions::deterministic): a
// row's results do not depend on the other rows of the call. The products
// (matmul_f32, matmul_bf16, matmul_mxfp4) never take the GEMM path: the
// MXFP4 and BF16 ones run the set's row-tiled decode kernels on blocks of
// kSmallBatchMaxRows rows (mxfp4_packed.hpp; what the set's own products do
// up to that many rows: each row's sums do not depend on the others, and
// MXFP4 quantises each row on its own), the blocks as one parallel pass
// (matvec_*_many); the F32 one its matrix-vector kernel on blocks of 7 rows.
// silu_mul and sigmoid_mul run every element on the vector path, padding the
// tail, so an element's result does not depend on where a row starts in a
// batch. Slower for prefill batches (weights are read once per block of
// rows), as fast for decode batches, the same bits for one row as the set's
// own. Names: "<family>_<isa>+rows". Refuses an unsupported isa as Kernels().
const KernelSet& KernelsBatchInvariant(Isa isa);

// Calls fn(family name, member pointer) for every family of KernelSet, in
// declaration order: the one list of the families that code walking a set
// (ForEachKernel, the registry's fallback filling, tests) goes through.
template <class Fn>
constexpr void ForEachFamily(Fn&& fn) {
  fn("matmul_f32", &KernelSet::matmul_f32);
  fn("matmul_bf16", &KernelSet::matmul_bf16);
  fn("matmul_mxfp4", &KernelSet::matmul_mxfp4);
  fn("matvec_bf16_many", &KernelSet::matvec_bf16_many);
  fn("matvec_mxfp4_many", &KernelSet::matvec_mxfp4_many);
  fn("headwise_matvec", &KernelSet::headwise_matvec);
  fn("rms_norm", &KernelSet::rms_norm);
  fn("silu_mul", &KernelSet::silu_mul);
  fn("sigmoid_mul", &KernelSet::sigmoid_mul);
  fn("mla_decode", &KernelSet::mla_decode);
  fn("mla_rows", &KernelSet::mla_rows);
  fn("indexer_scores", &KernelSet::indexer_scores);
  fn("delta_rule_recurrent", &KernelSet::delta_rule_recurrent);
  fn("mxfp4_quantize", &KernelSet::mxfp4_quantize);
  fn("mxfp4_matvec", &KernelSet::mxfp4_matvec);
  fn("mxfp4_gemm", &KernelSet::mxfp4_gemm);
  fn("f32_matmul_cols", &KernelSet::f32_matmul_cols);
  fn("matmul_mxfp4_bf16act", &KernelSet::matmul_mxfp4_bf16act);
  fn("matmul_bf16_bf16act", &KernelSet::matmul_bf16_bf16act);
  fn("indexer_scores_batch", &KernelSet::indexer_scores_batch);
  fn("delta_rule_chunked", &KernelSet::delta_rule_chunked);
  fn("causal_conv_silu", &KernelSet::causal_conv_silu);
  fn("mxfp4_matvec_rows", &KernelSet::mxfp4_matvec_rows);
  fn("matmul_fp8_block", &KernelSet::matmul_fp8_block);
  fn("indexer_scores_int8", &KernelSet::indexer_scores_int8);
  fn("indexer_scores_int8_blocked", &KernelSet::indexer_scores_int8_blocked);
}

// Calls fn(family, variant name, whether the entry has a function) for every
// entry of a set, in declaration order (for tests and reports that walk all
// families).
template <class Fn>
void ForEachKernel(const KernelSet& k, Fn&& fn) {
  ForEachFamily([&](const char* family, auto member) {
    const auto& entry = k.*member;
    fn(family, entry.name, entry.fn != nullptr);
  });
}

}  // namespace moeserve::kernels
