// The per-ISA kernel variants behind cpu_kernels.hpp (one signature per
// family), which dispatch.cpp gathers into the KernelSet tables. Named as ggml
// names them: <family>_<isa>. matmul_avx2.cpp and matmul_avx512.cpp are
// compiled with their ISA flags (see kernels/CMakeLists.txt) and use no
// inline library templates, so no AVX code leaks into shared COMDATs; the
// other files build their AVX variants as functions with a target attribute.
// None runs unless a caller asked Kernels() for a set this CPU supports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/bf16_matmul.hpp"
#include "moeserve/kernels/fp8_block.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"

namespace moeserve::kernels {
enum class Isa;        // cpu_kernels.hpp (not included: see above)
struct KernelSet;      // cpu_kernels.hpp
}  // namespace moeserve::kernels

namespace moeserve::kernels::cpu {

// Below this many activation rows the F32 matmuls run as matrix-vector
// products (no weight packing), and the BF16-activation products round and
// call their set's fp32 ones; at or above it, as a packed GEMM. (The MXFP4
// and BF16 products switch at kSmallBatchMaxRows instead: mxfp4_packed.hpp.)
inline constexpr size_t kGemmMinRows = 8;

// How far ahead of the codes being multiplied the MXFP4 matrix-vector
// kernels prefetch. One sequential stream per core does not keep enough
// misses in flight on its own: on the 2-core EPYC here this took a
// 4096 x 14336 product from ~35 to ~50-65 GB/s (the machine's read ceiling
// measures 57-70). Prefetches past a matrix's end are harmless.
// The prefetches go to L2 (prefetcht1), not L1: four streams 4 KiB ahead
// would hold half of L1 and its miss buffers; into L2 the same kernels
// read a median 28.5 / 28.9 GB/s against 21.6 / 21.9 into L1 and 26.0 /
// 24.2 with no software prefetch (7168 x 2048 / 4096 x 14336, cold,
// interleaved runs on the EPYC here).
inline constexpr size_t kMxfp4PrefetchBytes = 4096;

// The single-threaded building blocks, one per Isa (matmul_<isa>.cpp).
#define MOESERVE_DECLARE_BLOCKS(sfx)                                                                             \
  void mxfp4_matvec_##sfx(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin,        \
                          size_t g_end, size_t b_begin, size_t b_end);                                          \
  void mxfp4_gemm_##sfx(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, size_t o_begin,           \
                        size_t o_end);                                                                          \
  void f32_matmul_cols_##sfx(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y,         \
                             size_t o_begin, size_t o_end);
MOESERVE_DECLARE_BLOCKS(scalar)
MOESERVE_DECLARE_BLOCKS(avx2)
MOESERVE_DECLARE_BLOCKS(avx512)
#undef MOESERVE_DECLARE_BLOCKS
// The MXFP4 matrix-vector building block's results for many rows at once:
// each line of codes decoded once for a tile of rows (mxfp4_gemm_vnni.cpp).
// Bit-identical to mxfp4_matvec_avx512 / mxfp4_matvec_scalar on the same
// activations, row by row, whatever the number of rows.
void mxfp4_matvec_rows_avx512(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin,
                         size_t g_end, size_t b_begin, size_t b_end);
// The scalar quantiser serves the AVX2 set too (mxfp4_packed.cpp, matmul_avx512.cpp).
void mxfp4_quantize_scalar(const float* X, size_t n, size_t in, int nparts, int8_t* parts, float* scale,
                           int32_t* offset);
void mxfp4_quantize_avx512(const float* X, size_t n, size_t in, int nparts, int8_t* parts, float* scale,
                           int32_t* offset);
// The MXFP4 products over a set's building blocks (mxfp4_packed.cpp), shared
// by every registry row whose products are composed (dispatch.cpp binds
// them to each row's resolved set; no file keeps a list of Isas): the
// matrix-vector form's activations quantised into nparts int8 parts (the
// set's mxfp4_quantize), one row at a time by mxfp4_matvec, several by
// mxfp4_matvec_rows; from kMxfp4GemmMinRows rows on, the fp32 GEMM
// (mxfp4_gemm), or with `int8_rows` the integer product of many rows.
using Mxfp4RowsBlock = void (*)(const Mxfp4PackedView& w, const Mxfp4Activations& x, float* Y, size_t g_begin,
                               size_t g_end, size_t b_begin, size_t b_end);  // Mxfp4MatVecFn
void MatMulMxfp4Over(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, const KernelSet& k, int nparts,
                     Mxfp4RowsBlock int8_rows = nullptr);
void MatVecMxfp4ManyOver(std::span<const Mxfp4MatVecJob> jobs, const KernelSet& k, int nparts);
// The products with BF16-rounded activations of a row without code of its
// own for them: round, then the set's fp32 product (bf16_activations.cpp).
void MatMulMxfp4Bf16ActOver(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, const KernelSet& k);
void MatMulBf16Bf16ActOver(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                           const KernelSet& k);
// The MXFP4 products of a row's set over activations of nparts (1 or 2) int8
// parts instead of kMxfp4ActParts, every row count taking the integer
// products (the sets of KernelsWithDecodeActivationBits); `matmul_bf16act`
// takes the row's BF16-activation product from kBf16ActMinRows rows on. All
// null for a row whose products are not composed (the reference: exact).
struct Mxfp4PartsKernels {
  using MatMul = void (*)(const Mxfp4PackedView& w, const float* X, size_t n, float* Y);  // MatMulMxfp4Fn
  MatMul matmul = nullptr;
  MatMul matmul_bf16act = nullptr;
  void (*many)(std::span<const Mxfp4MatVecJob> jobs) = nullptr;  // MatVecMxfp4ManyFn
};
Mxfp4PartsKernels Mxfp4PartsOf(Isa isa, int nparts);  // dispatch.cpp, from the registry
// The scalar set's RMSNorm is the reference (RmsNormRef).
void rms_norm_avx2(const float* x, const float* w, float eps, size_t d, float* y);
void rms_norm_avx512(const float* x, const float* w, float eps, size_t d, float* y);

// The threaded families' variants, defined beside their reference in the
// family's file (bf16_matmul.cpp, gating.cpp, attention.cpp, delta_rule.cpp;
// the fp32 ones in dispatch.cpp; the MXFP4 products are composed, above). The scalar set's gates and
// recurrent delta rule are the reference functions.
#define MOESERVE_DECLARE_THREADED(sfx)                                                                           \
  void matmul_bf16_##sfx(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);           \
  void matvec_bf16_many_##sfx(std::span<const Bf16MatVecJob> jobs, size_t n);                                     \
  void mla_decode_##sfx(const MlaDecodeShape& shape, const float* q_abs, const float* q_pe,                       \
                        const float* const* rows, size_t offset, const int* keys, int n_keys, float* lat);        \
  void mla_rows_##sfx(const MlaDecodeShape& shape, int queries, const float* q_abs, const float* q_pe,             \
                      const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,         \
                      float* lat);                                                                                \
  void indexer_scores_##sfx(const float* iq, const float* w, int heads, int dim, const float* const* rows,         \
                            size_t offset, int n, float* scores);                                                \
  void indexer_scores_batch_##sfx(const float* iq, const float* w, int queries, int heads, int dim,                \
                                  const float* const* rows, size_t offset, const int* n, float* scores, size_t ld);
MOESERVE_DECLARE_THREADED(scalar)
// indexer_int8.cpp, indexer_int8_avx2.cpp, indexer_int8_vnni.cpp.
void indexer_scores_int8_scalar(const IndexerInt8Query& query, int queries, int heads, int dim,
                                const float* const* rows, size_t offset, const int* n, float* scores, size_t ld);
void indexer_scores_int8_avx2(const IndexerInt8Query& query, int queries, int heads, int dim,
                              const float* const* rows, size_t offset, const int* n, float* scores, size_t ld);
void indexer_scores_int8_avx512(const IndexerInt8Query& query, int queries, int heads, int dim,
                                const float* const* rows, size_t offset, const int* n, float* scores, size_t ld);
void indexer_scores_int8_blocked_scalar(const IndexerInt8Query& query, int queries, int heads, int dim,
                                        const float* const* blocks, int block_keys, const int* n, float* scores,
                                        size_t ld);
void indexer_scores_int8_blocked_avx2(const IndexerInt8Query& query, int queries, int heads, int dim,
                                      const float* const* blocks, int block_keys, const int* n, float* scores,
                                      size_t ld);
void indexer_scores_int8_blocked_avx512(const IndexerInt8Query& query, int queries, int heads, int dim,
                                        const float* const* blocks, int block_keys, const int* n, float* scores,
                                        size_t ld);
MOESERVE_DECLARE_THREADED(avx2)
MOESERVE_DECLARE_THREADED(avx512)
#undef MOESERVE_DECLARE_THREADED
#define MOESERVE_DECLARE_VECTOR(sfx)                                                                             \
  void silu_mul_##sfx(const float* a, const float* b, float* out, size_t n);                                      \
  void sigmoid_mul_##sfx(const float* a, const float* b, float* out, size_t n);                                   \
  void delta_rule_recurrent_##sfx(const float* q, const float* k, const float* v, const float* beta,              \
                                  const float* g, int T, int dk, int dv, size_t qk_stride, size_t v_stride,       \
                                  float* S, float* o, size_t o_stride);
MOESERVE_DECLARE_VECTOR(avx2)
MOESERVE_DECLARE_VECTOR(avx512)
#undef MOESERVE_DECLARE_VECTOR
// Gated DeltaNet's chunked delta rule as blocked products and its causal
// conv + silu, one per Isa (delta_rule_chunked.cpp, causal_conv.cpp).
#define MOESERVE_DECLARE_DELTA_CHUNKED(sfx)                                                                      \
  void delta_rule_chunked_##sfx(const float* q, const float* k, const float* v, const float* beta, const float* g, \
                                int T, int dk, int dv, size_t qk_stride, size_t v_stride, float* S, float* o,     \
                                size_t o_stride, int C);                                                          \
  void causal_conv_silu_##sfx(const float* tail, size_t tail_stride, const float* x, size_t x_stride, int T,       \
                              int n, const float* w, int K, float* out, size_t out_stride);
MOESERVE_DECLARE_DELTA_CHUNKED(scalar)
MOESERVE_DECLARE_DELTA_CHUNKED(avx2)
MOESERVE_DECLARE_DELTA_CHUNKED(avx512)
#undef MOESERVE_DECLARE_DELTA_CHUNKED

// Products with BF16-rounded activations (bf16_activations.hpp) of their
// own: AVX-512 dispatches to the vdpbf16ps GEMM (matmul_bf16dot.cpp) when
// the CPU has avx512_bf16. Other rows' are composed (MatMul*Bf16ActOver).
void matmul_mxfp4_bf16act_avx512(const Mxfp4PackedView& w, const float* X, size_t n, float* Y);
void matmul_bf16_bf16act_avx512(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);
// The vdpbf16ps building blocks (matmul_bf16dot.cpp; AVX-512 F/BW + BF16
// only). X as BF16 rows of stride ldx (even, >= in, zero past in); the
// GEMMs write columns [o_begin, o_end) of Y (o_begin a multiple of 32 for
// the fast MXFP4 panel decode; others are decoded row by row).
void round_bf16_rows_avx512bf16(const float* X, size_t n, size_t in, uint16_t* Xb, size_t ldx);
void mxfp4_gemm_bf16dot(const Mxfp4PackedView& w, const uint16_t* Xb, size_t ldx, size_t n, float* Y, size_t o_begin,
                        size_t o_end);
void bf16_gemm_bf16dot(const uint16_t* W, size_t out, size_t in, const uint16_t* Xb, size_t ldx, size_t n, float* Y,
                       size_t o_begin, size_t o_end);
// matmul_bf16's AVX-512 product from kSmallBatchMaxRows + 1 rows
// (bf16_gemm_avx512.cpp): columns [o_begin, o_end) of Y [n, out] = X W^T,
// the weights broadcast from row-major BF16 against tokens in the lanes.
void bf16_gemm_cols_avx512(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                           size_t o_begin, size_t o_end);
// The same product through the fp32 GEMM's panels (matmul_avx512.cpp), each
// panel widened from BF16 as it is packed: the bits of f32_matmul_cols_avx512
// on the widened matrix, without widening it (larger row counts).
void bf16_panel_gemm_cols_avx512(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                                 size_t o_begin, size_t o_end);

// 2^(s-127) for an E8M0 scale byte (255 gives +inf here; loaders refuse it),
// and half of it (for kernels that look up twice the E2M1 value).
struct E8M0Table {
  float v[256];
  float half[256];
};
constexpr E8M0Table MakeE8M0Table() {
  E8M0Table t{};
  for (unsigned s = 0; s < 256; ++s) {
    t.v[s] = __builtin_bit_cast(float, s == 0 ? 0x00400000u : s << 23);
    t.half[s] = __builtin_bit_cast(float, s == 0 ? 0x00200000u : s == 1 ? 0x00400000u : (s - 1) << 23);
  }
  return t;
}
inline constexpr E8M0Table kE8M0 = MakeE8M0Table();
// Aligned scratch (64 bytes), from a non-ISA translation unit.
float* AllocScratch(size_t floats);
void FreeScratch(float* p);
// Latent attention with head-queries as the vector lanes
// (mla_flash_avx512.cpp; AVX-512 only; every query sees >= 1 key):
// mla_decode for many head-queries at once, and mla_rows.
void mla_flash_avx512(const MlaDecodeShape& shape, const float* q_abs, const float* q_pe, const float* const* rows,
                      size_t offset, const int* keys, int n_keys, float* lat);
void mla_rows_flash_avx512(const MlaDecodeShape& shape, int queries, const float* q_abs, const float* q_pe,
                           const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,
                           float* lat);
// The same with BF16 dot products (mla_flash_bf16dot.cpp; only where the CPU
// reports avx512_bf16), and the BF16-activation set's entries that use them
// when it does (attention.cpp; the fp32 AVX-512 kernels otherwise).
void mla_flash_bf16dot(const MlaDecodeShape& shape, const float* q_abs, const float* q_pe, const float* const* rows,
                       size_t offset, const int* keys, int n_keys, float* lat);
void mla_rows_flash_bf16dot(const MlaDecodeShape& shape, int queries, const float* q_abs, const float* q_pe,
                            const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,
                            float* lat);
size_t mla_bf16dot_held_bytes();  // AttentionScratchHeldBytes where the CPU runs them
void mla_decode_avx512_bf16act(const MlaDecodeShape& shape, const float* q_abs, const float* q_pe,
                               const float* const* rows, size_t offset, const int* keys, int n_keys, float* lat);
void mla_rows_avx512_bf16act(const MlaDecodeShape& shape, int queries, const float* q_abs, const float* q_pe,
                             const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,
                             float* lat);

// FP8 block-scaled products (fp8_block.hpp). The row kernels compute output
// rows [r_begin, r_end) of Y for all n activation rows, single-threaded
// (fp8_block_avx2.cpp / fp8_block_avx512.cpp are built with their ISA's
// flags); the matmul_fp8_block_* entries split output rows across the pool.
using Fp8BlockRowsFn = void (*)(const Fp8BlockView& w, const float* X, size_t n, float* Y, size_t r_begin,
                                size_t r_end);
// Every E4M3 code's value (256 floats; the scalar kernel and the AVX2 tails).
const float* Fp8E4m3Table();
void fp8_block_rows_scalar(const Fp8BlockView& w, const float* X, size_t n, float* Y, size_t r_begin, size_t r_end);
void fp8_block_rows_avx2(const Fp8BlockView& w, const float* X, size_t n, float* Y, size_t r_begin, size_t r_end);
// The AVX-512 row kernel reads X permuted by fp8_block_permute_x_avx512
// (within each full 64-column group of a 128-column block, 128-bit chunk q of
// the four 16-float vectors gathered into vector q; the rest in order).
void fp8_block_rows_avx512(const Fp8BlockView& w, const float* XP, size_t n, float* Y, size_t r_begin, size_t r_end);
void fp8_block_permute_x_avx512(const float* X, size_t n, size_t cols, float* XP);
void matmul_fp8_block_scalar(const Fp8BlockView& w, const float* X, size_t n, float* Y);
void matmul_fp8_block_avx2(const Fp8BlockView& w, const float* X, size_t n, float* Y);
void matmul_fp8_block_avx512(const Fp8BlockView& w, const float* X, size_t n, float* Y);
// Columns per k chunk of the AVX-512 fp32 GEMM's panels (matmul_avx512.cpp).
inline constexpr size_t kGemmPanelK = 2048;
// Fp8BlockGemm's single-threaded piece (matmul_avx512.cpp): output rows
// [o_begin, o_end) of Y [n, w.rows] through the fp32 GEMM of
// f32_matmul_cols_avx512, each panel decoded from the codes as it is packed.
// Xc holds X chunked: columns [k0, k0 + kc) of all n rows at Xc + n * k0,
// kc floats a row (kc = kGemmPanelK, the last chunk shorter).
void fp8_block_gemm_cols_avx512(const Fp8BlockView& w, const float* Xc, size_t n, float* Y, size_t o_begin,
                                size_t o_end);
// The AMX products' AVX-512 helpers (amx_avx512.cpp; AVX-512 F/BW + BF16
// only): AmxPackActivations, AmxWriteTileTransposed, AmxDecodeMxfp4Group
// (amx_tiles.hpp).
void amx_pack_activations_avx512bf16(const float* X, size_t n, size_t in, size_t tb_begin, size_t tb_end,
                                     uint16_t* packed);
void amx_write_tile_transposed_avx512(const float* tile, float* Y, size_t ldy, size_t rows, size_t cols);
void amx_decode_mxfp4_group_avx512bf16(const Mxfp4PackedView& w, size_t g, uint16_t* dst, size_t ld);
// The amx row (matmul_amx.cpp): its detection (CpuHasAmxBf16 reads it
// through the registry) and its BF16-activation products.
bool DetectAmxBf16();
void matmul_bf16_bf16act_amx(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);
void matmul_mxfp4_bf16act_amx(const Mxfp4PackedView& w, const float* X, size_t n, float* Y);
// The amx_model row (amx_tile_model.cpp): the same entries on AmxTileModel.
void matmul_bf16_bf16act_amx_model(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);
void matmul_mxfp4_bf16act_amx_model(const Mxfp4PackedView& w, const float* X, size_t n, float* Y);
// Fp8BlockToBf16's and Fp8FindNan's AVX-512 code (fp8_block.hpp).
void fp8_block_to_bf16_avx512(const Fp8BlockView& w, size_t r_begin, size_t r_end, uint16_t* out);
long long fp8_find_nan_avx512(const uint8_t* codes, size_t n);

}  // namespace moeserve::kernels::cpu
