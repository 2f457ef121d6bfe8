// The one dispatch mechanism of cpu_kernels.hpp: the ISA registry (one row
// per Isa: its name, its CPU detection, the kernels it brings, the Isa it
// falls back to for the rest, its rank), the KernelSet tables resolved from
// it at compile time, the sets derived from those (BF16 activations,
// batch-invariant), and the fp32 families' threaded variants, which split
// output columns across the pool and run their Isa's single-threaded
// building block on each part. Everything that names, detects, ranks,
// reports or enumerates an Isa reads the registry (kRegistry below).
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <string_view>
#include <utility>

#include "moeserve/kernels/amx_tiles.hpp"
#include "moeserve/kernels/causal_conv.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/delta_rule.hpp"
#include "moeserve/kernels/gating.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels {
namespace {

// Splits columns [0, out) into tasks: for the GEMM, one contiguous range per
// thread (aligned to 32 columns, the packed strip width); for matrix-vector
// products, small dynamic chunks.
template <class Fn>
void ParallelColumns(size_t out, size_t n, size_t in, Fn fn) {
  ThreadPool& pool = DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  const double work = static_cast<double>(out) * static_cast<double>(in) * static_cast<double>(n);
  if (threads == 1 || work < 65536.0) {
    fn(0, out);
    return;
  }
  size_t chunk;
  if (n >= cpu::kGemmMinRows) {
    chunk = (out + threads - 1) / threads;
    chunk = (chunk + 31) / 32 * 32;
  } else {
    chunk = std::max<size_t>(16, out / (threads * 8));
    chunk = (chunk + 15) / 16 * 16;
  }
  const size_t tasks = (out + chunk - 1) / chunk;
  pool.ParallelFor(tasks, [&](size_t i) { fn(i * chunk, std::min(out, (i + 1) * chunk)); });
}

// matmul_f32_<isa>: the building block Cols over column ranges in parallel.
template <F32MatMulColsFn Cols>
void MatMulF32Threaded(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  if (out == 0 || n == 0) return;
  if (in == 0) return std::fill(Y, Y + out * n, 0.0f);
  ParallelColumns(out, n, in, [&](size_t o0, size_t o1) { Cols(W, out, in, X, n, Y, o0, o1); });
}

// headwise_matvec_<isa>: one matrix-vector product per head, heads in parallel.
template <F32MatMulColsFn Cols>
void HeadwiseMatVecThreaded(const float* W, size_t heads, size_t rows, size_t cols, size_t head_stride,
                            const float* X, size_t x_stride, float* Y, size_t y_stride) {
  auto head = [&](size_t h) { Cols(W + h * head_stride, rows, cols, X + h * x_stride, 1, Y + h * y_stride, 0, rows); };
  ThreadPool& pool = DefaultThreadPool();
  if (pool.size() == 1 || heads < 2 || static_cast<double>(heads) * rows * cols < 65536.0) {
    for (size_t h = 0; h < heads; ++h) head(h);
    return;
  }
  pool.ParallelFor(heads, head);
}

using namespace cpu;

// ---------------------------------------------------------------------------
// CPU detection: what each registry row asks the CPU for. A row also needs
// what its fallback needs (IsaSupported checks the chain).

bool Always() { return true; }

bool DetectAvx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// The flags matmul_avx512.cpp is built with (kernels/CMakeLists.txt).
bool DetectAvx512() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
         __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// vdpbf16ps, which the AVX-512 row's BF16-activation kernels use when present.
bool DetectAvx512Bf16() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------
// The kernels each row brings. A family a row leaves empty is, for a row
// whose products are composed (IsaEntry::composed_products), one of the
// composed products over the row's own set (below, named for the row);
// otherwise it is filled from its fallback's resolved set (the entry keeps
// the fallback's name, so a set says which variant it really runs).

#define MOESERVE_KERNEL(fn) {fn, #fn}

// A row names only the families it has code for: the others stay empty on
// purpose, so the compiler's warning about omitted members is off here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

constexpr KernelSet kReferenceKernels = {
    .matmul_f32 = {MatMulF32Ref, "matmul_f32_ref"},
    .matmul_bf16 = {MatMulBf16Ref, "matmul_bf16_ref"},
    .matmul_mxfp4 = {MatMulMxfp4PackedRef, "matmul_mxfp4_ref"},
    .matvec_bf16_many = {MatVecBf16ManyRef, "matvec_bf16_many_ref"},
    .matvec_mxfp4_many = {MatVecMxfp4ManyRef, "matvec_mxfp4_many_ref"},
    .headwise_matvec = {HeadwiseMatVecRef, "headwise_matvec_ref"},
    .rms_norm = {RmsNormRef, "rms_norm_ref"},
    .silu_mul = {SiluMulRef, "silu_mul_ref"},
    .sigmoid_mul = {SigmoidMulRef, "sigmoid_mul_ref"},
    .mla_decode = {MlaDecodeRef, "mla_decode_ref"},
    .mla_rows = {MlaRowsRef, "mla_rows_ref"},
    .indexer_scores = {IndexerScoresRef, "indexer_scores_ref"},
    .delta_rule_recurrent = {DeltaRuleRecurrent, "delta_rule_recurrent_ref"},
    // The building blocks' scalar loops (the reference products above do not
    // use them; the root row has no fallback to take them from).
    .mxfp4_quantize = MOESERVE_KERNEL(mxfp4_quantize_scalar),
    .mxfp4_matvec = MOESERVE_KERNEL(mxfp4_matvec_scalar),
    .mxfp4_gemm = MOESERVE_KERNEL(mxfp4_gemm_scalar),
    .f32_matmul_cols = MOESERVE_KERNEL(f32_matmul_cols_scalar),
    .matmul_mxfp4_bf16act = {MatMulMxfp4Bf16ActRef, "matmul_mxfp4_bf16act_ref"},
    .matmul_bf16_bf16act = {MatMulBf16Bf16ActRef, "matmul_bf16_bf16act_ref"},
    .indexer_scores_batch = {IndexerScoresBatchRef, "indexer_scores_batch_ref"},
    .delta_rule_chunked = {DeltaRuleChunked, "delta_rule_chunked_ref"},
    .causal_conv_silu = {CausalConvSiluRef, "causal_conv_silu_ref"},
    .mxfp4_matvec_rows = {mxfp4_matvec_scalar, "mxfp4_matvec_rows_scalar"},
    .matmul_fp8_block = {MatMulFp8BlockRef, "matmul_fp8_block_ref"},
    .indexer_scores_int8 = {IndexerScoresInt8Ref, "indexer_scores_int8_ref"},
    .indexer_scores_int8_blocked = {IndexerScoresInt8BlockedRef, "indexer_scores_int8_blocked_ref"},
};

// RMSNorm, the gates and the recurrent delta rule: the reference's loops are
// the scalar form (taken from the fallback).
constexpr KernelSet kScalarKernels = {
    .matmul_f32 = {MatMulF32Threaded<f32_matmul_cols_scalar>, "matmul_f32_scalar"},
    .matmul_bf16 = MOESERVE_KERNEL(matmul_bf16_scalar),
    .matvec_bf16_many = MOESERVE_KERNEL(matvec_bf16_many_scalar),
    .headwise_matvec = {HeadwiseMatVecThreaded<f32_matmul_cols_scalar>, "headwise_matvec_scalar"},
    .mla_decode = MOESERVE_KERNEL(mla_decode_scalar),
    .mla_rows = MOESERVE_KERNEL(mla_rows_scalar),
    .indexer_scores = MOESERVE_KERNEL(indexer_scores_scalar),
    .mxfp4_quantize = MOESERVE_KERNEL(mxfp4_quantize_scalar),
    .mxfp4_matvec = MOESERVE_KERNEL(mxfp4_matvec_scalar),
    .mxfp4_gemm = MOESERVE_KERNEL(mxfp4_gemm_scalar),
    .f32_matmul_cols = MOESERVE_KERNEL(f32_matmul_cols_scalar),
    .indexer_scores_batch = MOESERVE_KERNEL(indexer_scores_batch_scalar),
    .delta_rule_chunked = MOESERVE_KERNEL(delta_rule_chunked_scalar),
    .causal_conv_silu = MOESERVE_KERNEL(causal_conv_silu_scalar),
    // The matrix-vector block on every row: its results by definition.
    .mxfp4_matvec_rows = {mxfp4_matvec_scalar, "mxfp4_matvec_rows_scalar"},
    .matmul_fp8_block = MOESERVE_KERNEL(matmul_fp8_block_scalar),
    // The reference's expression key by key, keys across the pool.
    .indexer_scores_int8 = MOESERVE_KERNEL(indexer_scores_int8_scalar),
    .indexer_scores_int8_blocked = MOESERVE_KERNEL(indexer_scores_int8_blocked_scalar),
};

// The MXFP4 activation quantiser: the scalar one (from the fallback).
constexpr KernelSet kAvx2Kernels = {
    .matmul_f32 = {MatMulF32Threaded<f32_matmul_cols_avx2>, "matmul_f32_avx2"},
    .matmul_bf16 = MOESERVE_KERNEL(matmul_bf16_avx2),
    .matvec_bf16_many = MOESERVE_KERNEL(matvec_bf16_many_avx2),
    .headwise_matvec = {HeadwiseMatVecThreaded<f32_matmul_cols_avx2>, "headwise_matvec_avx2"},
    .rms_norm = MOESERVE_KERNEL(rms_norm_avx2),
    .silu_mul = MOESERVE_KERNEL(silu_mul_avx2),
    .sigmoid_mul = MOESERVE_KERNEL(sigmoid_mul_avx2),
    .mla_decode = MOESERVE_KERNEL(mla_decode_avx2),
    .mla_rows = MOESERVE_KERNEL(mla_rows_avx2),
    .indexer_scores = MOESERVE_KERNEL(indexer_scores_avx2),
    .delta_rule_recurrent = MOESERVE_KERNEL(delta_rule_recurrent_avx2),
    .mxfp4_matvec = MOESERVE_KERNEL(mxfp4_matvec_avx2),
    .mxfp4_gemm = MOESERVE_KERNEL(mxfp4_gemm_avx2),
    .f32_matmul_cols = MOESERVE_KERNEL(f32_matmul_cols_avx2),
    .indexer_scores_batch = MOESERVE_KERNEL(indexer_scores_batch_avx2),
    .delta_rule_chunked = MOESERVE_KERNEL(delta_rule_chunked_avx2),
    .causal_conv_silu = MOESERVE_KERNEL(causal_conv_silu_avx2),
    .mxfp4_matvec_rows = {mxfp4_matvec_avx2, "mxfp4_matvec_rows_avx2"},
    .matmul_fp8_block = MOESERVE_KERNEL(matmul_fp8_block_avx2),
    // vpmaddubsw + vpmaddwd (no VNNI on this row), the reference's bits.
    .indexer_scores_int8 = MOESERVE_KERNEL(indexer_scores_int8_avx2),
    .indexer_scores_int8_blocked = MOESERVE_KERNEL(indexer_scores_int8_blocked_avx2),
};

constexpr KernelSet kAvx512Kernels = {
    .matmul_f32 = {MatMulF32Threaded<f32_matmul_cols_avx512>, "matmul_f32_avx512"},
    .matmul_bf16 = MOESERVE_KERNEL(matmul_bf16_avx512),
    .matvec_bf16_many = MOESERVE_KERNEL(matvec_bf16_many_avx512),
    .headwise_matvec = {HeadwiseMatVecThreaded<f32_matmul_cols_avx512>, "headwise_matvec_avx512"},
    .rms_norm = MOESERVE_KERNEL(rms_norm_avx512),
    .silu_mul = MOESERVE_KERNEL(silu_mul_avx512),
    .sigmoid_mul = MOESERVE_KERNEL(sigmoid_mul_avx512),
    .mla_decode = MOESERVE_KERNEL(mla_decode_avx512),
    .mla_rows = MOESERVE_KERNEL(mla_rows_avx512),
    .indexer_scores = MOESERVE_KERNEL(indexer_scores_avx512),
    .delta_rule_recurrent = MOESERVE_KERNEL(delta_rule_recurrent_avx512),
    .mxfp4_quantize = MOESERVE_KERNEL(mxfp4_quantize_avx512),
    .mxfp4_matvec = MOESERVE_KERNEL(mxfp4_matvec_avx512),
    .mxfp4_gemm = MOESERVE_KERNEL(mxfp4_gemm_avx512),
    .f32_matmul_cols = MOESERVE_KERNEL(f32_matmul_cols_avx512),
    .matmul_mxfp4_bf16act = MOESERVE_KERNEL(matmul_mxfp4_bf16act_avx512),
    .matmul_bf16_bf16act = MOESERVE_KERNEL(matmul_bf16_bf16act_avx512),
    .indexer_scores_batch = MOESERVE_KERNEL(indexer_scores_batch_avx512),
    .delta_rule_chunked = MOESERVE_KERNEL(delta_rule_chunked_avx512),
    .causal_conv_silu = MOESERVE_KERNEL(causal_conv_silu_avx512),
    .mxfp4_matvec_rows = MOESERVE_KERNEL(mxfp4_matvec_rows_avx512),
    .matmul_fp8_block = MOESERVE_KERNEL(matmul_fp8_block_avx512),
    .indexer_scores_int8 = MOESERVE_KERNEL(indexer_scores_int8_avx512),
    .indexer_scores_int8_blocked = MOESERVE_KERNEL(indexer_scores_int8_blocked_avx512),
};

// Tiles for the BF16-activation products (amx_tiles.hpp); everything else
// is the AVX-512 row's.
constexpr KernelSet kAmxKernels = {
    .matmul_mxfp4_bf16act = MOESERVE_KERNEL(matmul_mxfp4_bf16act_amx),
    .matmul_bf16_bf16act = MOESERVE_KERNEL(matmul_bf16_bf16act_amx),
};

// The amx row's entries run on AmxTileModel: the same program, packing,
// decoding, writes and threading, with the instructions in C++.
constexpr KernelSet kAmxModelKernels = {
    .matmul_mxfp4_bf16act = MOESERVE_KERNEL(matmul_mxfp4_bf16act_amx_model),
    .matmul_bf16_bf16act = MOESERVE_KERNEL(matmul_bf16_bf16act_amx_model),
};

// In its BF16-activation set, attention's products as BF16 dot products too.
constexpr KernelSet kAvx512Bf16ActKernels = {
    .mla_decode = {mla_decode_avx512_bf16act, "mla_decode_avx512+bf16act"},
    .mla_rows = {mla_rows_avx512_bf16act, "mla_rows_avx512+bf16act"},
};

#undef MOESERVE_KERNEL

// ---------------------------------------------------------------------------
// The registry.

// Optional instructions a row's kernels look for at run time (beyond what
// the row requires): reported in IsaReport, asked through the registry.
struct IsaExtension {
  const char* name = nullptr;
  bool (*detect)() = nullptr;
};

struct IsaEntry {
  Isa isa;                    // its row index, checked below
  const char* name;           // IsaName: logs, MOESERVE_CPU_ISA, test and bench labels
  const char* suffix;         // its own variants are named <family>_<suffix>
  Isa fallback;               // fills the families it has no code for; an earlier row (the root: itself)
  bool (*detect)();           // what the CPU must report (its fallback's needs are added)
  bool serving;               // whether BestIsa may pick it (the reference is for tests)
  KernelSet kernels;          // its own kernels
  KernelSet bf16act_kernels;  // what its BF16-activation set replaces besides the two products
  IsaExtension extension;     // optional instructions its kernels use when present
  // Its MXFP4 products (matmul_mxfp4, matvec_mxfp4_many) and BF16-activation
  // products (matmul_mxfp4_bf16act, matmul_bf16_bf16act), where it names
  // none of its own, are the shared compositions over its own resolved set
  // (the building blocks it has or borrows, its fp32 products), named
  // <family>_<suffix>, and KernelsWithDecodeActivationBits has its
  // fewer-bit forms. Not the reference, whose products are exact.
  bool composed_products = true;
};

// One row per Isa, in order of preference, least preferred first: BestIsa
// picks the last serving row this CPU supports.
constexpr IsaEntry kRegistry[] = {
    {.isa = Isa::kReference, .name = "reference", .suffix = "ref", .fallback = Isa::kReference,
     .detect = Always, .serving = false, .kernels = kReferenceKernels, .composed_products = false},
    {.isa = Isa::kScalar, .name = "scalar", .suffix = "scalar", .fallback = Isa::kReference,
     .detect = Always, .serving = true, .kernels = kScalarKernels},
    {.isa = Isa::kAvx2, .name = "avx2", .suffix = "avx2", .fallback = Isa::kScalar,
     .detect = DetectAvx2, .serving = true, .kernels = kAvx2Kernels},
    {.isa = Isa::kAvx512, .name = "avx512", .suffix = "avx512", .fallback = Isa::kAvx2,
     .detect = DetectAvx512, .serving = true, .kernels = kAvx512Kernels,
     .bf16act_kernels = kAvx512Bf16ActKernels, .extension = {"avx512_bf16", DetectAvx512Bf16}},
    {.isa = Isa::kAmx, .name = "amx", .suffix = "amx", .fallback = Isa::kAvx512, .detect = DetectAmxBf16,
     .serving = true, .kernels = kAmxKernels, .bf16act_kernels = kAvx512Bf16ActKernels},
    // For tests, as the reference: the amx row wherever its helpers run.
    {.isa = Isa::kAmxModel, .name = "amx_model", .suffix = "amx_model", .fallback = Isa::kAvx512,
     .detect = DetectAvx512Bf16, .serving = false, .kernels = kAmxModelKernels,
     .bf16act_kernels = kAvx512Bf16ActKernels},
};

#pragma GCC diagnostic pop

constexpr int Index(Isa isa) { return static_cast<int>(isa); }

constexpr bool RegistryIsWellFormed() {
  if (std::size(kRegistry) != static_cast<size_t>(kIsaCount)) return false;
  if (kRegistry[0].isa != Isa::kReference || kRegistry[0].fallback != Isa::kReference) return false;
  for (int i = 0; i < kIsaCount; ++i) {
    const IsaEntry& e = kRegistry[i];
    if (Index(e.isa) != i || e.detect == nullptr) return false;
    if (i > 0 && !(Index(e.fallback) >= 0 && Index(e.fallback) < i)) return false;
    for (int j = 0; j < i; ++j)
      if (std::string_view(kRegistry[j].name) == e.name || std::string_view(kRegistry[j].suffix) == e.suffix)
        return false;
  }
  return true;
}
static_assert(RegistryIsWellFormed(),
              "kRegistry: one row per Isa value in enum order, the reference first, unique names and suffixes, "
              "each fallback an earlier row");

// "<family>_<row i's suffix>" as a constant: the name of a composed entry.
template <size_t N>
struct Literal {
  char text[N];
  constexpr Literal(const char (&s)[N]) { std::copy_n(s, N, text); }
};
template <Literal family, int i>
struct OwnName {
  static constexpr std::string_view suffix{kRegistry[i].suffix};
  static constexpr auto kText = [] {
    std::array<char, sizeof(family.text) + suffix.size() + 1> out{};  // family's NUL makes room for '_'
    size_t at = 0;
    for (size_t c = 0; c + 1 < sizeof(family.text); ++c) out[at++] = family.text[c];
    out[at++] = '_';
    for (char c : suffix) out[at++] = c;
    return out;
  }();
  static constexpr const char* text = kText.data();
};

// The composed products of row i (defined below kSets, which they read).
template <int i>
void MatMulMxfp4Composed(const Mxfp4PackedView& w, const float* X, size_t n, float* Y);
template <int i>
void MatVecMxfp4ManyComposed(std::span<const Mxfp4MatVecJob> jobs);
template <int i>
void MatMulMxfp4Bf16ActComposed(const Mxfp4PackedView& w, const float* X, size_t n, float* Y);
template <int i>
void MatMulBf16Bf16ActComposed(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y);

// Row i's set: its own kernels, its composed products where it has none of
// its own, the rest from its fallback's set.
template <int i>
constexpr void Resolve(std::array<KernelSet, kIsaCount>& sets) {
  const IsaEntry& e = kRegistry[i];
  KernelSet s = e.kernels;
  s.isa = e.isa;
  if (e.composed_products) {
    if (!s.matmul_mxfp4.fn) s.matmul_mxfp4 = {MatMulMxfp4Composed<i>, OwnName<"matmul_mxfp4", i>::text};
    if (!s.matvec_mxfp4_many.fn)
      s.matvec_mxfp4_many = {MatVecMxfp4ManyComposed<i>, OwnName<"matvec_mxfp4_many", i>::text};
    if (!s.matmul_mxfp4_bf16act.fn)
      s.matmul_mxfp4_bf16act = {MatMulMxfp4Bf16ActComposed<i>, OwnName<"matmul_mxfp4_bf16act", i>::text};
    if (!s.matmul_bf16_bf16act.fn)
      s.matmul_bf16_bf16act = {MatMulBf16Bf16ActComposed<i>, OwnName<"matmul_bf16_bf16act", i>::text};
  }
  if (i > 0) {
    const KernelSet& from = sets[Index(e.fallback)];
    ForEachFamily([&](const char*, auto member) {
      if ((s.*member).fn == nullptr) s.*member = from.*member;
    });
  }
  sets[i] = s;
}

constexpr std::array<KernelSet, kIsaCount> ResolveSets() {
  std::array<KernelSet, kIsaCount> sets{};
  // In row order: a row's fallback is an earlier row, already resolved.
  [&]<int... i>(std::integer_sequence<int, i...>) { (Resolve<i>(sets), ...); }(
      std::make_integer_sequence<int, kIsaCount>{});
  return sets;
}

constexpr std::array<KernelSet, kIsaCount> kSets = ResolveSets();

template <int i>
void MatMulMxfp4Composed(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  MatMulMxfp4Over(w, X, n, Y, kSets[i], kMxfp4ActParts);
}
template <int i>
void MatVecMxfp4ManyComposed(std::span<const Mxfp4MatVecJob> jobs) {
  MatVecMxfp4ManyOver(jobs, kSets[i], kMxfp4ActParts);
}
template <int i>
void MatMulMxfp4Bf16ActComposed(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  MatMulMxfp4Bf16ActOver(w, X, n, Y, kSets[i]);
}
template <int i>
void MatMulBf16Bf16ActComposed(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  MatMulBf16Bf16ActOver(W, out, in, X, n, Y, kSets[i]);
}

// KernelsWithDecodeActivationBits' products of row i: activations of
// nparts int8 parts at every row count (the integer products, so a row's
// result never depends on the batch beside it).
template <int i, int nparts>
void MatMulMxfp4Parts(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  MatMulMxfp4Over(w, X, n, Y, kSets[i], nparts, kSets[i].mxfp4_matvec_rows.fn);
}
template <int i, int nparts>
void MatMulMxfp4Bf16ActParts(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  if (n >= kBf16ActMinRows) return kSets[i].matmul_mxfp4_bf16act(w, X, n, Y);
  MatMulMxfp4Parts<i, nparts>(w, X, n, Y);
}
template <int i, int nparts>
void MatVecMxfp4ManyParts(std::span<const Mxfp4MatVecJob> jobs) {
  MatVecMxfp4ManyOver(jobs, kSets[i], nparts);
}

// [row][nparts - 1]; empty for a row whose products are not composed.
constexpr auto kPartsKernels = [] {
  std::array<std::array<Mxfp4PartsKernels, 2>, kIsaCount> t{};
  [&]<int... i>(std::integer_sequence<int, i...>) {
    ((kRegistry[i].composed_products
          ? (t[i][0] = {MatMulMxfp4Parts<i, 1>, MatMulMxfp4Bf16ActParts<i, 1>, MatVecMxfp4ManyParts<i, 1>},
             t[i][1] = {MatMulMxfp4Parts<i, 2>, MatMulMxfp4Bf16ActParts<i, 2>, MatVecMxfp4ManyParts<i, 2>}, 0)
          : 0),
     ...);
  }(std::make_integer_sequence<int, kIsaCount>{});
  return t;
}();

constexpr bool EverySetIsComplete() {
  bool complete = true;
  for (const KernelSet& s : kSets)
    ForEachFamily([&](const char*, auto member) { complete = complete && (s.*member).fn != nullptr; });
  return complete;
}
static_assert(EverySetIsComplete(), "kRegistry: the reference row must name every family");

// ---------------------------------------------------------------------------
// The derived sets, per row i.

// matmul_mxfp4 / matmul_bf16 of KernelsWithBf16Activations.
template <int i>
void MatMulMxfp4Bf16From(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[i];
  (n >= kBf16ActMinRows ? k.matmul_mxfp4_bf16act : k.matmul_mxfp4)(w, X, n, Y);
}
template <int i>
void MatMulBf16Bf16From(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[i];
  (n >= kBf16ActMinRows ? k.matmul_bf16_bf16act : k.matmul_bf16)(W, out, in, X, n, Y);
}

// KernelsBatchInvariant: products in blocks of rows, each block by kernels
// whose result for a row does not depend on the others: the F32 matrix-vector
// kernels (blocks of kGemmMinRows - 1 rows), and the MXFP4 and BF16 row tiles
// (blocks of kSmallBatchMaxRows rows, which the set's own matmul_mxfp4 and
// matvec_bf16_many run that way).
constexpr size_t kRowBlock = kGemmMinRows - 1;

template <int i>
void MatMulF32Rows(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[i];
  for (size_t t = 0; t < n; t += kRowBlock) k.matmul_f32(W, out, in, X + t * in, std::min(kRowBlock, n - t), Y + t * out);
}

template <int i>
void MatMulBf16Rows(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[i];
  if (n <= kSmallBatchMaxRows) return k.matmul_bf16(W, out, in, X, n, Y);
  // Whole blocks as one pass (the jobs share n), then the rest.
  std::vector<Bf16MatVecJob> jobs;
  const size_t full = n / kSmallBatchMaxRows;
  for (size_t b = 0; b < full; ++b)
    jobs.push_back({W, out, in, X + b * kSmallBatchMaxRows * in, Y + b * kSmallBatchMaxRows * out});
  k.matvec_bf16_many(jobs, kSmallBatchMaxRows);
  if (const size_t rest = n - full * kSmallBatchMaxRows; rest > 0)
    k.matmul_bf16(W, out, in, X + full * kSmallBatchMaxRows * in, rest, Y + full * kSmallBatchMaxRows * out);
}

template <int i>
void MatMulMxfp4Rows(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[i];
  if (n <= kSmallBatchMaxRows) return k.matmul_mxfp4(w, X, n, Y);
  if (w.out == 0) return;
  if (w.in == 0) return std::fill(Y, Y + w.out * n, 0.0f);
  std::vector<Mxfp4MatVecJob> jobs;
  for (size_t t = 0; t < n; t += kSmallBatchMaxRows)
    jobs.push_back({w, X + t * w.in, std::min(kSmallBatchMaxRows, n - t), Y + t * w.out});
  k.matvec_mxfp4_many(jobs);
}

// The gates over whole vectors only: the AVX2 variant finishes a tail with
// scalar code, whose exp differs in the last bits from the vector one.
constexpr size_t kGateLanes = 16;
template <int i, bool kSilu>
void GateRows(const float* a, const float* b, float* out, size_t n) {
  const KernelSet& k = kSets[i];
  const GateFn gate = kSilu ? k.silu_mul.fn : k.sigmoid_mul.fn;
  const size_t body = n / kGateLanes * kGateLanes;
  gate(a, b, out, body);
  if (body == n) return;
  float ta[kGateLanes] = {}, tb[kGateLanes] = {}, to[kGateLanes];
  std::copy(a + body, a + n, ta);
  std::copy(b + body, b + n, tb);
  gate(ta, tb, to, kGateLanes);
  std::copy(to, to + (n - body), out + body);
}

struct DerivedSets {
  std::array<KernelSet, kIsaCount> bf16act{};
  std::array<KernelSet, kIsaCount> rows{};
  std::deque<std::string> names;  // the derived entries' names; a deque keeps their addresses

  const char* Name(std::string_view family, const char* suffix, std::string_view tag) {
    names.push_back(std::string(family) + "_" + suffix + "+" + std::string(tag));
    return names.back().c_str();
  }

  template <int i>
  void Add() {
    const IsaEntry& e = kRegistry[i];
    KernelSet b = kSets[i];
    b.matmul_mxfp4 = {MatMulMxfp4Bf16From<i>, Name("matmul_mxfp4", e.suffix, "bf16act")};
    b.matmul_bf16 = {MatMulBf16Bf16From<i>, Name("matmul_bf16", e.suffix, "bf16act")};
    ForEachFamily([&](const char*, auto member) {
      if ((e.bf16act_kernels.*member).fn != nullptr) b.*member = e.bf16act_kernels.*member;
    });
    bf16act[i] = b;

    KernelSet r = kSets[i];
    r.matmul_f32 = {MatMulF32Rows<i>, Name("matmul_f32", e.suffix, "rows")};
    r.matmul_bf16 = {MatMulBf16Rows<i>, Name("matmul_bf16", e.suffix, "rows")};
    r.matmul_mxfp4 = {MatMulMxfp4Rows<i>, Name("matmul_mxfp4", e.suffix, "rows")};
    r.silu_mul = {GateRows<i, true>, Name("silu_mul", e.suffix, "rows")};
    r.sigmoid_mul = {GateRows<i, false>, Name("sigmoid_mul", e.suffix, "rows")};
    rows[i] = r;
  }
};

// Built once, at the first call; never destroyed (threads may still call
// through a set while the process exits).
const DerivedSets& Derived() {
  static const DerivedSets* const derived = [] {
    auto* d = new DerivedSets;
    [d]<int... i>(std::integer_sequence<int, i...>) { (d->template Add<i>(), ...); }(
        std::make_integer_sequence<int, kIsaCount>{});
    return d;
  }();
  return *derived;
}

const IsaEntry* Find(Isa isa) {
  const int i = Index(isa);
  return i >= 0 && i < kIsaCount ? &kRegistry[i] : nullptr;
}

// Per row: whether this CPU runs it (its detection and its fallback's), and
// whether it also has the row's optional instructions. Asked once.
struct Detected {
  std::array<bool, kIsaCount> supported{};
  std::array<bool, kIsaCount> extension{};
};

const Detected& Detection() {
  static const Detected detected = [] {
    Detected d;
    for (int i = 0; i < kIsaCount; ++i) {
      const IsaEntry& e = kRegistry[i];
      d.supported[i] = e.detect() && (i == 0 || d.supported[Index(e.fallback)]);
      d.extension[i] = d.supported[i] && e.extension.detect != nullptr && e.extension.detect();
    }
    return d;
  }();
  return detected;
}

constexpr std::array<Isa, kIsaCount> AllRows() {
  std::array<Isa, kIsaCount> all{};
  for (int i = 0; i < kIsaCount; ++i) all[i] = kRegistry[i].isa;
  return all;
}
constexpr std::array<Isa, kIsaCount> kAllRows = AllRows();

std::string ServingNames() {
  std::string names;
  for (const IsaEntry& e : kRegistry)
    if (e.serving) names += std::string(names.empty() ? "" : "|") + e.name;
  return names;
}

}  // namespace

const char* IsaName(Isa isa) {
  const IsaEntry* e = Find(isa);
  return e ? e->name : "?";
}

const char* IsaVariantSuffix(Isa isa) {
  const IsaEntry* e = Find(isa);
  return e ? e->suffix : "?";
}

Isa IsaFallback(Isa isa) {
  const IsaEntry* e = Find(isa);
  return e ? e->fallback : Isa::kReference;
}

std::optional<Isa> IsaByName(std::string_view name) {
  for (const IsaEntry& e : kRegistry)
    if (name == e.name) return e.isa;
  return std::nullopt;
}

std::span<const Isa> AllIsas() { return kAllRows; }

bool IsaServes(Isa isa) {
  const IsaEntry* e = Find(isa);
  return e != nullptr && e->serving;
}

bool IsaSupported(Isa isa) {
  const int i = Index(isa);
  return i >= 0 && i < kIsaCount && Detection().supported[i];
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> v;
  for (Isa isa : kAllRows)
    if (IsaSupported(isa)) v.push_back(isa);
  return v;
}

Isa BestIsa() {
  static const Isa best = [] {
    Isa b = Isa::kScalar;
    for (const IsaEntry& e : kRegistry)
      if (e.serving && IsaSupported(e.isa)) b = e.isa;
    if (const char* env = std::getenv("MOESERVE_CPU_ISA")) {
      const std::optional<Isa> want = IsaByName(env);
      if (!want || !Find(*want)->serving)
        std::fprintf(stderr, "moeserve kernels: MOESERVE_CPU_ISA=%s is not one of %s; ignored (using %s)\n", env,
                     ServingNames().c_str(), IsaName(b));
      else if (Index(*want) < Index(b) && IsaSupported(*want))
        b = *want;
    }
    return b;
  }();
  return best;
}

std::string IsaReport() {
  std::string supported, extensions;
  for (Isa isa : SupportedIsas()) {
    const IsaEntry& e = *Find(isa);
    supported += std::string(supported.empty() ? "" : " ") + e.name;
    if (Detection().extension[Index(isa)])
      extensions += std::string(extensions.empty() ? "" : ", ") + e.name + " with " + e.extension.name;
  }
  return "supported: " + supported + (extensions.empty() ? "" : " (" + extensions + ")") + "; best: " +
         IsaName(BestIsa());
}

bool CpuHasAvx512Bf16() { return Detection().extension[Index(Isa::kAvx512)]; }

bool CpuHasAmxBf16() { return IsaSupported(Isa::kAmx); }

const KernelSet& Kernels(Isa isa) {
  if (!IsaSupported(isa)) {
    std::fprintf(stderr, "moeserve kernels: the %s variants were asked for, but this CPU cannot run them\n",
                 IsaName(isa));
    std::abort();
  }
  return kSets[Index(isa)];
}

const KernelSet& KernelsWithBf16Activations(Isa isa) {
  Kernels(isa);  // refuses what this CPU cannot run
  return Derived().bf16act[Index(isa)];
}

namespace cpu {
Mxfp4PartsKernels Mxfp4PartsOf(Isa isa, int nparts) {
  const int i = Index(isa);
  if (i < 0 || i >= kIsaCount || nparts < 1 || nparts > 2) return {};
  return kPartsKernels[i][nparts - 1];
}
}  // namespace cpu

const KernelSet& KernelsBatchInvariant(Isa isa) {
  Kernels(isa);  // refuses what this CPU cannot run
  return Derived().rows[Index(isa)];
}

}  // namespace moeserve::kernels
