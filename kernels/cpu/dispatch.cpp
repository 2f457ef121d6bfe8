// The one dispatch mechanism of cpu_kernels.hpp: CPU detection, the four
// KernelSet tables (built at compile time, one entry per family and Isa), and
// the fp32 families' threaded variants, which split output columns across
// the pool and run their Isa's single-threaded building block on each part.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "moeserve/kernels/causal_conv.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/delta_rule.hpp"
#include "moeserve/kernels/gating.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels {
namespace {

bool Detect(Isa isa) {
  switch (isa) {
    case Isa::kReference:
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case Isa::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
             __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
}

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

#define MOESERVE_ENTRY(fn) {fn, #fn}
#define MOESERVE_NAMED(fn, name) {fn, name}

using namespace cpu;

constexpr KernelSet kSets[kIsaCount] = {
    {
        Isa::kReference,
        MOESERVE_NAMED(MatMulF32Ref, "matmul_f32_ref"),
        MOESERVE_NAMED(MatMulBf16Ref, "matmul_bf16_ref"),
        MOESERVE_NAMED(MatMulMxfp4PackedRef, "matmul_mxfp4_ref"),
        MOESERVE_NAMED(MatVecBf16ManyRef, "matvec_bf16_many_ref"),
        MOESERVE_NAMED(MatVecMxfp4ManyRef, "matvec_mxfp4_many_ref"),
        MOESERVE_NAMED(HeadwiseMatVecRef, "headwise_matvec_ref"),
        MOESERVE_NAMED(RmsNormRef, "rms_norm_ref"),
        MOESERVE_NAMED(SiluMulRef, "silu_mul_ref"),
        MOESERVE_NAMED(SigmoidMulRef, "sigmoid_mul_ref"),
        MOESERVE_NAMED(MlaDecodeRef, "mla_decode_ref"),
        MOESERVE_NAMED(MlaRowsRef, "mla_rows_ref"),
        MOESERVE_NAMED(IndexerScoresRef, "indexer_scores_ref"),
        MOESERVE_NAMED(DeltaRuleRecurrent, "delta_rule_recurrent_ref"),
        // The building blocks' scalar loops (the reference products above do
        // not use them).
        MOESERVE_ENTRY(mxfp4_quantize_scalar),
        MOESERVE_ENTRY(mxfp4_matvec_scalar),
        MOESERVE_ENTRY(mxfp4_gemm_scalar),
        MOESERVE_ENTRY(f32_matmul_cols_scalar),
        MOESERVE_NAMED(MatMulMxfp4Bf16ActRef, "matmul_mxfp4_bf16act_ref"),
        MOESERVE_NAMED(MatMulBf16Bf16ActRef, "matmul_bf16_bf16act_ref"),
        MOESERVE_NAMED(IndexerScoresBatchRef, "indexer_scores_batch_ref"),
        MOESERVE_NAMED(DeltaRuleChunked, "delta_rule_chunked_ref"),
        MOESERVE_NAMED(CausalConvSiluRef, "causal_conv_silu_ref"),
    },
    {
        Isa::kScalar,
        MOESERVE_NAMED(MatMulF32Threaded<f32_matmul_cols_scalar>, "matmul_f32_scalar"),
        MOESERVE_ENTRY(matmul_bf16_scalar),
        MOESERVE_ENTRY(matmul_mxfp4_scalar),
        MOESERVE_ENTRY(matvec_bf16_many_scalar),
        MOESERVE_ENTRY(matvec_mxfp4_many_scalar),
        MOESERVE_NAMED(HeadwiseMatVecThreaded<f32_matmul_cols_scalar>, "headwise_matvec_scalar"),
        MOESERVE_NAMED(RmsNormRef, "rms_norm_ref"),
        MOESERVE_NAMED(SiluMulRef, "silu_mul_ref"),
        MOESERVE_NAMED(SigmoidMulRef, "sigmoid_mul_ref"),
        MOESERVE_ENTRY(mla_decode_scalar),
        MOESERVE_ENTRY(mla_rows_scalar),
        MOESERVE_ENTRY(indexer_scores_scalar),
        MOESERVE_NAMED(DeltaRuleRecurrent, "delta_rule_recurrent_ref"),
        MOESERVE_ENTRY(mxfp4_quantize_scalar),
        MOESERVE_ENTRY(mxfp4_matvec_scalar),
        MOESERVE_ENTRY(mxfp4_gemm_scalar),
        MOESERVE_ENTRY(f32_matmul_cols_scalar),
        MOESERVE_ENTRY(matmul_mxfp4_bf16act_scalar),
        MOESERVE_ENTRY(matmul_bf16_bf16act_scalar),
        MOESERVE_ENTRY(indexer_scores_batch_scalar),
        MOESERVE_ENTRY(delta_rule_chunked_scalar),
        MOESERVE_ENTRY(causal_conv_silu_scalar),
    },
    {
        Isa::kAvx2,
        MOESERVE_NAMED(MatMulF32Threaded<f32_matmul_cols_avx2>, "matmul_f32_avx2"),
        MOESERVE_ENTRY(matmul_bf16_avx2),
        MOESERVE_ENTRY(matmul_mxfp4_avx2),
        MOESERVE_ENTRY(matvec_bf16_many_avx2),
        MOESERVE_ENTRY(matvec_mxfp4_many_avx2),
        MOESERVE_NAMED(HeadwiseMatVecThreaded<f32_matmul_cols_avx2>, "headwise_matvec_avx2"),
        MOESERVE_ENTRY(rms_norm_avx2),
        MOESERVE_ENTRY(silu_mul_avx2),
        MOESERVE_ENTRY(sigmoid_mul_avx2),
        MOESERVE_ENTRY(mla_decode_avx2),
        MOESERVE_ENTRY(mla_rows_avx2),
        MOESERVE_ENTRY(indexer_scores_avx2),
        MOESERVE_ENTRY(delta_rule_recurrent_avx2),
        MOESERVE_ENTRY(mxfp4_quantize_scalar),
        MOESERVE_ENTRY(mxfp4_matvec_avx2),
        MOESERVE_ENTRY(mxfp4_gemm_avx2),
        MOESERVE_ENTRY(f32_matmul_cols_avx2),
        MOESERVE_ENTRY(matmul_mxfp4_bf16act_avx2),
        MOESERVE_ENTRY(matmul_bf16_bf16act_avx2),
        MOESERVE_ENTRY(indexer_scores_batch_avx2),
        MOESERVE_ENTRY(delta_rule_chunked_avx2),
        MOESERVE_ENTRY(causal_conv_silu_avx2),
    },
    {
        Isa::kAvx512,
        MOESERVE_NAMED(MatMulF32Threaded<f32_matmul_cols_avx512>, "matmul_f32_avx512"),
        MOESERVE_ENTRY(matmul_bf16_avx512),
        MOESERVE_ENTRY(matmul_mxfp4_avx512),
        MOESERVE_ENTRY(matvec_bf16_many_avx512),
        MOESERVE_ENTRY(matvec_mxfp4_many_avx512),
        MOESERVE_NAMED(HeadwiseMatVecThreaded<f32_matmul_cols_avx512>, "headwise_matvec_avx512"),
        MOESERVE_ENTRY(rms_norm_avx512),
        MOESERVE_ENTRY(silu_mul_avx512),
        MOESERVE_ENTRY(sigmoid_mul_avx512),
        MOESERVE_ENTRY(mla_decode_avx512),
        MOESERVE_ENTRY(mla_rows_avx512),
        MOESERVE_ENTRY(indexer_scores_avx512),
        MOESERVE_ENTRY(delta_rule_recurrent_avx512),
        MOESERVE_ENTRY(mxfp4_quantize_avx512),
        MOESERVE_ENTRY(mxfp4_matvec_avx512),
        MOESERVE_ENTRY(mxfp4_gemm_avx512),
        MOESERVE_ENTRY(f32_matmul_cols_avx512),
        MOESERVE_ENTRY(matmul_mxfp4_bf16act_avx512),
        MOESERVE_ENTRY(matmul_bf16_bf16act_avx512),
        MOESERVE_ENTRY(indexer_scores_batch_avx512),
        MOESERVE_ENTRY(delta_rule_chunked_avx512),
        MOESERVE_ENTRY(causal_conv_silu_avx512),
    },
};

#undef MOESERVE_ENTRY
#undef MOESERVE_NAMED

constexpr Isa kAll[kIsaCount] = {Isa::kReference, Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

// matmul_mxfp4 / matmul_bf16 of KernelsWithBf16Activations(isa).
template <Isa isa>
void MatMulMxfp4Bf16From(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[static_cast<int>(isa)];
  (n >= kBf16ActMinRows ? k.matmul_mxfp4_bf16act : k.matmul_mxfp4)(w, X, n, Y);
}
template <Isa isa>
void MatMulBf16Bf16From(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[static_cast<int>(isa)];
  (n >= kBf16ActMinRows ? k.matmul_bf16_bf16act : k.matmul_bf16)(W, out, in, X, n, Y);
}

template <Isa isa>
constexpr KernelSet WithBf16Activations(const char* mxfp4_name, const char* bf16_name) {
  KernelSet s = kSets[static_cast<int>(isa)];
  s.matmul_mxfp4 = {MatMulMxfp4Bf16From<isa>, mxfp4_name};
  s.matmul_bf16 = {MatMulBf16Bf16From<isa>, bf16_name};
  if constexpr (isa == Isa::kAvx512) {  // attention's products as BF16 dot products too
    s.mla_decode = {cpu::mla_decode_avx512_bf16act, "mla_decode_avx512+bf16act"};
    s.mla_rows = {cpu::mla_rows_avx512_bf16act, "mla_rows_avx512+bf16act"};
  }
  return s;
}

constexpr KernelSet kBf16ActSets[kIsaCount] = {
    WithBf16Activations<Isa::kReference>("matmul_mxfp4_ref+bf16act", "matmul_bf16_ref+bf16act"),
    WithBf16Activations<Isa::kScalar>("matmul_mxfp4_scalar+bf16act", "matmul_bf16_scalar+bf16act"),
    WithBf16Activations<Isa::kAvx2>("matmul_mxfp4_avx2+bf16act", "matmul_bf16_avx2+bf16act"),
    WithBf16Activations<Isa::kAvx512>("matmul_mxfp4_avx512+bf16act", "matmul_bf16_avx512+bf16act"),
};

// KernelsBatchInvariant(isa): products in blocks of kRowBlock rows, each
// block by the set's matrix-vector kernels.
constexpr size_t kRowBlock = kGemmMinRows - 1;

template <Isa isa>
void MatMulF32Rows(const float* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[static_cast<int>(isa)];
  for (size_t t = 0; t < n; t += kRowBlock) k.matmul_f32(W, out, in, X + t * in, std::min(kRowBlock, n - t), Y + t * out);
}

template <Isa isa>
void MatMulBf16Rows(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[static_cast<int>(isa)];
  if (n < kGemmMinRows) return k.matmul_bf16(W, out, in, X, n, Y);
  // Whole blocks as one pass (the jobs share n), then the rest.
  std::vector<Bf16MatVecJob> jobs;
  const size_t full = n / kRowBlock;
  for (size_t b = 0; b < full; ++b) jobs.push_back({W, out, in, X + b * kRowBlock * in, Y + b * kRowBlock * out});
  k.matvec_bf16_many(jobs, kRowBlock);
  if (const size_t rest = n - full * kRowBlock; rest > 0)
    k.matmul_bf16(W, out, in, X + full * kRowBlock * in, rest, Y + full * kRowBlock * out);
}

template <Isa isa>
void MatMulMxfp4Rows(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  const KernelSet& k = kSets[static_cast<int>(isa)];
  if (n < kGemmMinRows) return k.matmul_mxfp4(w, X, n, Y);
  if (w.out == 0) return;
  if (w.in == 0) return std::fill(Y, Y + w.out * n, 0.0f);
  std::vector<Mxfp4MatVecJob> jobs;
  for (size_t t = 0; t < n; t += kRowBlock) jobs.push_back({w, X + t * w.in, std::min(kRowBlock, n - t), Y + t * w.out});
  k.matvec_mxfp4_many(jobs);
}

// The gates over whole vectors only: the AVX2 variant finishes a tail with
// scalar code, whose exp differs in the last bits from the vector one.
constexpr size_t kGateLanes = 16;
template <Isa isa, bool kSilu>
void GateRows(const float* a, const float* b, float* out, size_t n) {
  const KernelSet& k = kSets[static_cast<int>(isa)];
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

template <Isa isa>
constexpr KernelSet BatchInvariant(const char* f32, const char* bf16, const char* mxfp4, const char* silu,
                                   const char* sigmoid) {
  KernelSet s = kSets[static_cast<int>(isa)];
  s.matmul_f32 = {MatMulF32Rows<isa>, f32};
  s.matmul_bf16 = {MatMulBf16Rows<isa>, bf16};
  s.matmul_mxfp4 = {MatMulMxfp4Rows<isa>, mxfp4};
  s.silu_mul = {GateRows<isa, true>, silu};
  s.sigmoid_mul = {GateRows<isa, false>, sigmoid};
  return s;
}

#define MOESERVE_ROWS(isa, sfx)                                                                               \
  BatchInvariant<isa>("matmul_f32_" sfx "+rows", "matmul_bf16_" sfx "+rows", "matmul_mxfp4_" sfx "+rows",      \
                      "silu_mul_" sfx "+rows", "sigmoid_mul_" sfx "+rows")
constexpr KernelSet kRowSets[kIsaCount] = {
    MOESERVE_ROWS(Isa::kReference, "ref"),
    MOESERVE_ROWS(Isa::kScalar, "scalar"),
    MOESERVE_ROWS(Isa::kAvx2, "avx2"),
    MOESERVE_ROWS(Isa::kAvx512, "avx512"),
};
#undef MOESERVE_ROWS

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kReference: return "reference";
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

bool IsaSupported(Isa isa) {
  static const bool supported[kIsaCount] = {Detect(Isa::kReference), Detect(Isa::kScalar), Detect(Isa::kAvx2),
                                            Detect(Isa::kAvx512)};
  const int i = static_cast<int>(isa);
  return i >= 0 && i < kIsaCount && supported[i];
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> v;
  for (Isa isa : kAll)
    if (IsaSupported(isa)) v.push_back(isa);
  return v;
}

Isa BestIsa() {
  static const Isa best = [] {
    Isa b = Isa::kScalar;
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
      if (IsaSupported(isa)) b = isa;
    if (const char* env = std::getenv("MOESERVE_CPU_ISA")) {
      const std::string_view want(env);
      for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
        if (want == IsaName(isa) && static_cast<int>(isa) < static_cast<int>(b)) b = isa;
    }
    return b;
  }();
  return best;
}

const KernelSet& Kernels(Isa isa) {
  if (!IsaSupported(isa)) {
    std::fprintf(stderr, "moeserve kernels: the %s variants were asked for, but this CPU cannot run them\n",
                 IsaName(isa));
    std::abort();
  }
  return kSets[static_cast<int>(isa)];
}

const KernelSet& KernelsWithBf16Activations(Isa isa) {
  Kernels(isa);  // refuses what this CPU cannot run
  return kBf16ActSets[static_cast<int>(isa)];
}

const KernelSet& KernelsBatchInvariant(Isa isa) {
  Kernels(isa);  // refuses what this CPU cannot run
  return kRowSets[static_cast<int>(isa)];
}

}  // namespace moeserve::kernels
