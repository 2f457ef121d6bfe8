#include "moeserve/kernels/bf16_matmul.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"

#include "moeserve/kernels/x86_intrinsics.hpp"
#include "task_split.hpp"
#include "variants.hpp"

namespace moeserve::kernels {

namespace {

inline float Bf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float DotBf16Scalar(const uint16_t* w, const float* x, size_t n) {
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += Bf16(w[i]) * x[i];
  return s;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline __m256 Widen(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Four independent accumulators keep enough loads in flight for a
// memory-bound row; BF16 widens with a zero-extend and a 16-bit shift.
__attribute__((target("avx2,fma"))) float DotBf16Avx2(const uint16_t* w, const float* x, size_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i));
    __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i + 16));
    acc0 = _mm256_fmadd_ps(Widen(_mm256_castsi256_si128(r0)), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(Widen(_mm256_extracti128_si256(r0, 1)), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(Widen(_mm256_castsi256_si128(r1)), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(Widen(_mm256_extracti128_si256(r1, 1)), _mm256_loadu_ps(x + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8)
    acc0 = _mm256_fmadd_ps(Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i))), _mm256_loadu_ps(x + i), acc0);
  acc0 = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_shuffle_ps(r, r, 1));
  float s = _mm_cvtss_f32(r);
  for (; i < n; ++i) s += Bf16(w[i]) * x[i];
  return s;
}

// Y = W x for several activation rows at once, AVX-512. A 32-element step of
// a W row is one 64-byte load: shifting each 32-bit lane left by 16 gives the
// even elements as fp32 and masking off its low half the odd ones, so x is
// passed de-interleaved per 32 (16 even, then 16 odd; zero-padded to a
// multiple of 32; rows ldx floats apart). Each (W row, x row) pair sums in
// one accumulator, even then odd lanes per step, then one reduce: the same
// bits whatever tile the pair is computed in, so a row's result does not
// depend on the rows beside it.
//
// A tile is WR W rows x MR x rows: each load of W is widened once and used
// by MR rows, each x load by WR rows. At WR = MR = 4: 16 accumulators, 8
// widened vectors and 2 of x within the 32 registers, 32 FMAs per 4 loads
// of W and 8 of x. The W rows are a quarter of the task's range apart (four
// memory streams, each prefetched 2 KiB ahead, to L2): for one x row (the
// memory-bound single-sequence decode) that read ~47 GB/s on average against
// ~40 for four adjacent rows on the EPYC here, and into L2 37.1 GB/s
// against 23.9 into L1 (cold 4096 x 4096, medians).
template <size_t WR, size_t MR>
__attribute__((target("avx512f,avx512bw,fma"), always_inline)) inline void StepTileBf16(
    const uint16_t* const (&w)[WR], size_t k, __mmask32 valid, const float* xs, size_t ldx, __m512 (&acc)[WR][MR]) {
  const __m512i odd = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 we[WR], wo[WR];
#pragma GCC unroll 4
  for (size_t r = 0; r < WR; ++r) {
    const __m512i v = _mm512_maskz_loadu_epi16(valid, w[r] + k);
    we[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    wo[r] = _mm512_castsi512_ps(_mm512_and_si512(v, odd));
  }
#pragma GCC unroll 4
  for (size_t i = 0; i < MR; ++i) {
    const __m512 xe = _mm512_loadu_ps(xs + i * ldx + k), xo = _mm512_loadu_ps(xs + i * ldx + k + 16);
#pragma GCC unroll 4
    for (size_t r = 0; r < WR; ++r) {
      acc[r][i] = _mm512_fmadd_ps(we[r], xe, acc[r][i]);
      acc[r][i] = _mm512_fmadd_ps(wo[r], xo, acc[r][i]);
    }
  }
}

// y[r][i * ldy] = W row w[r] . x row i, for r < WR, i < MR.
template <size_t WR, size_t MR>
__attribute__((target("avx512f,avx512bw,fma"))) inline void TileBf16Avx512(const uint16_t* const (&w)[WR], size_t in,
                                                                           const float* xs, size_t ldx,
                                                                           float* const (&y)[WR], size_t ldy) {
  constexpr size_t kAhead = 2048;  // bytes
  const size_t full = in / 32 * 32;
  __m512 acc[WR][MR];
#pragma GCC unroll 4
  for (size_t r = 0; r < WR; ++r)
#pragma GCC unroll 4
    for (size_t i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  size_t k = 0;
  for (; k < full; k += 32) {
#pragma GCC unroll 4
    for (size_t r = 0; r < WR; ++r) _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + kAhead, _MM_HINT_T0);
    StepTileBf16<WR, MR>(w, k, ~__mmask32{0}, xs, ldx, acc);
  }
  if (k < in) StepTileBf16<WR, MR>(w, k, static_cast<__mmask32>((uint64_t{1} << (in - full)) - 1), xs, ldx, acc);
#pragma GCC unroll 4
  for (size_t r = 0; r < WR; ++r)
#pragma GCC unroll 4
    for (size_t i = 0; i < MR; ++i) y[r][i * ldy] = _mm512_reduce_add_ps(acc[r][i]);
}

constexpr size_t kTileRowsBf16 = 4;  // MR

// Every x row in tiles of kTileRowsBf16 (the last one shorter).
template <size_t WR>
__attribute__((target("avx512f,avx512bw,fma"))) void TileColumnBf16Avx512(const uint16_t* const (&w)[WR], size_t in,
                                                                           const float* xs, size_t ldx, size_t n,
                                                                           float* const (&y)[WR], size_t ldy) {
  size_t t = 0;
  for (; t + kTileRowsBf16 <= n; t += kTileRowsBf16) {
    float* yt[WR];
    for (size_t r = 0; r < WR; ++r) yt[r] = y[r] + t * ldy;
    TileBf16Avx512<WR, kTileRowsBf16>(w, in, xs + t * ldx, ldx, yt, ldy);
  }
  if (t == n) return;
  float* yt[WR];
  for (size_t r = 0; r < WR; ++r) yt[r] = y[r] + t * ldy;
  switch (n - t) {
    case 1: return TileBf16Avx512<WR, 1>(w, in, xs + t * ldx, ldx, yt, ldy);
    case 2: return TileBf16Avx512<WR, 2>(w, in, xs + t * ldx, ldx, yt, ldy);
    default: return TileBf16Avx512<WR, 3>(w, in, xs + t * ldx, ldx, yt, ldy);
  }
}

// Rows [o0, o1) of Y [n, out] = X W^T: four W rows a quarter of the range
// apart at a time, then the rows left over one by one. The x rows go in
// tiles of kTileRowsBf16, each tile (4 x in floats, in L1) against every W
// row of the range: W is read from memory by the first tile and from L2
// (a task's 256 KiB) by the others, so a step reads 4 lines of W from L2
// and 8 of x from L1 for its 32 FMAs.
__attribute__((target("avx512f,avx512bw,fma"))) void BlockBf16Avx512(const uint16_t* W, size_t in, const float* xs,
                                                                     size_t ldx, size_t n, size_t o0, size_t o1,
                                                                     float* Y, size_t out) {
  const size_t q = (o1 - o0) / 4;
  for (size_t t = 0; t < n; t += kTileRowsBf16) {
    const size_t mr = n - t < kTileRowsBf16 ? n - t : kTileRowsBf16;
    const float* xt = xs + t * ldx;
    float* yt = Y + t * out;
    for (size_t o = o0; o < o0 + q; ++o) {
      const uint16_t* const w[4] = {W + o * in, W + (o + q) * in, W + (o + 2 * q) * in, W + (o + 3 * q) * in};
      float* const y[4] = {yt + o, yt + o + q, yt + o + 2 * q, yt + o + 3 * q};
      TileColumnBf16Avx512<4>(w, in, xt, ldx, mr, y, out);
    }
    for (size_t o = o0 + 4 * q; o < o1; ++o) {
      const uint16_t* const w[1] = {W + o * in};
      float* const y[1] = {yt + o};
      TileColumnBf16Avx512<1>(w, in, xt, ldx, mr, y, out);
    }
  }
}
#endif

using DotFn = float (*)(const uint16_t*, const float*, size_t);

void MatVecBf16Many(std::span<const Bf16MatVecJob> jobs, size_t n, Isa isa);

}  // namespace

void MatMulBf16Ref(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  std::vector<float> row(in);
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) row[i] = Bf16(W[o * in + i]);
    for (size_t t = 0; t < n; ++t) {
      float acc = 0.0f;
      for (size_t i = 0; i < in; ++i) acc += row[i] * X[t * in + i];
      Y[t * out + o] = acc;
    }
  }
}

void MatVecBf16ManyRef(std::span<const Bf16MatVecJob> jobs, size_t n) {
  for (const Bf16MatVecJob& j : jobs) MatMulBf16Ref(j.W, j.out, j.in, j.X, n, j.Y);
}

namespace {

// Up to kSmallBatchMaxRows rows (a batched decode step) matmul_bf16 runs the
// multi-row matrix-vector kernels: W read from memory once, each load of it
// widened once in registers for a tile of 4 activation rows. From here
// on (prefill), W is widened to fp32 for the GEMM, which writes and reads W
// again at twice its size and so pays only when the rows are many. (Before
// the row tiles, widening at 8 rows made a gpt-oss-20b-shaped step of 8
// sequences slower than 8 single steps, and the per-row kernel from 8 to 31
// rows re-read each task's W from L2 once per row.)
constexpr size_t kBf16WidenMinRows = kSmallBatchMaxRows + 1;
// On AVX-512, from kBf16WidenMinRows up to this many rows (a routed expert's
// share of a prefill chunk: ~80 rows at 512 tokens, top-10 of 64 experts)
// the BF16 weights go straight into bf16_gemm_cols_avx512, without widening:
// single-threaded on the shared 2-core EPYC (thread CPU time, 16 cold
// experts), 1024 x 2048 at 80 rows 125-127 against 87-90 GFLOP/s, at 128 rows
// 137 against 86, at 256 rows 131 against 116; at 512 rows it lost
// (4096 x 2048: 82-110 against 124), so larger products take the fp32 GEMM's
// panels, widened from BF16 as they are packed (bf16_panel_gemm_cols_avx512:
// the bits of the widened path without the fp32 copy of W).
constexpr size_t kBf16LanesMaxRows = 256;

// matmul_bf16 for one Isa (not kReference).
void MatMulBf16(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y, Isa isa) {
  if (out == 0 || n == 0) return;
#if defined(__x86_64__)
  if (isa == Isa::kAvx512 && n >= kBf16WidenMinRows && n <= kBf16LanesMaxRows) {
    // Contiguous column ranges, one per thread (each transposes X for
    // itself); inside a pool task (experts side by side) the one range.
    ThreadPool& pool = DefaultThreadPool();
    const size_t threads = static_cast<size_t>(pool.size());
    const size_t chunk = (out + threads - 1) / threads;
    pool.ParallelFor((out + chunk - 1) / chunk, [&](size_t c) {
      cpu::bf16_gemm_cols_avx512(W, out, in, X, n, Y, c * chunk, std::min(out, (c + 1) * chunk));
    });
    return;
  }
  if (isa == Isa::kAvx512 && n > kBf16LanesMaxRows) {
    // The column ranges matmul_f32 gives the widened matrix (one per thread,
    // whole strips of 32), so the sums are the same.
    ThreadPool& pool = DefaultThreadPool();
    const size_t threads = static_cast<size_t>(pool.size());
    if (threads == 1 || static_cast<double>(out) * static_cast<double>(in) * static_cast<double>(n) < 65536.0)
      return cpu::bf16_panel_gemm_cols_avx512(W, out, in, X, n, Y, 0, out);
    const size_t chunk = ((out + threads - 1) / threads + 31) / 32 * 32;
    pool.ParallelFor((out + chunk - 1) / chunk, [&](size_t c) {
      cpu::bf16_panel_gemm_cols_avx512(W, out, in, X, n, Y, c * chunk, std::min(out, (c + 1) * chunk));
    });
    return;
  }
#endif
  if (n >= kBf16WidenMinRows) {
    // Arithmetic-bound: widen once (cost of one read of W) and use the fp32 GEMM.
    thread_local std::vector<float> wide;
    wide.resize(out * in);
    float* dst = wide.data();  // workers must not name the thread_local: theirs is another vector
    DefaultThreadPool().ParallelFor((out + 255) / 256, [&](size_t c) {
      const size_t b = c * 256, e = std::min(out, b + 256);
      for (size_t i = b * in; i < e * in; ++i) dst[i] = Bf16(W[i]);
    });
    Kernels(isa).matmul_f32(wide.data(), out, in, X, n, Y);
    return;
  }
  const Bf16MatVecJob job{W, out, in, X, Y};
  MatVecBf16Many(std::span(&job, 1), n, isa);
}

// matvec_bf16_many for one Isa (not kReference).
void MatVecBf16Many(std::span<const Bf16MatVecJob> jobs, size_t n, Isa isa) {
  // Memory-bound: each task reads a contiguous run of one job's rows once for
  // all n activations; all jobs' tasks share one parallel-for, and little
  // work runs on the calling thread alone (a hand-off costs more than its read).
  // Tasks of about 2 MiB of weights (whole rows, a multiple of 4 for the
  // kernel's four streams; SplitTailTasks splits the last ones so that the
  // threads finish together): each task start costs its streams a prefetch
  // ramp. A small-preset DeltaNet layer's six projections, cold, interleaved
  // runs: 26.6 GB/s with 64-row (128 KiB) tasks, 27.3-28.7 with 256 KiB;
  // 4096 x 4096 at one row (bench_roofline, 3 alternating runs, quiet):
  // 53.6 / 42.8 / 46.4 GB/s with 256 KiB, 58.3 / 51.0 / 57.5 with 2 MiB.
  constexpr size_t kTaskBytes = 2048 << 10, kTailChunk = 16;
  thread_local std::vector<RangeTask> tasks;
  tasks.clear();
  double work = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const size_t chunk = std::max<size_t>(kTailChunk, kTaskBytes / std::max<size_t>(1, jobs[j].in * 2) / 4 * 4);
    for (size_t r = 0; r < jobs[j].out; r += chunk) tasks.push_back({j, r, std::min(jobs[j].out, r + chunk)});
    work += static_cast<double>(jobs[j].out) * static_cast<double>(jobs[j].in);
  }
  if (tasks.empty()) return;
  SplitTailTasks(tasks, work, [&](size_t j) { return static_cast<double>(jobs[j].in); }, kTailChunk);
#if defined(__x86_64__)
  if (isa == Isa::kAvx512) {
    // x de-interleaved per 32 for BlockBf16Avx512, once per job and row of X,
    // rows 64 bytes more than a multiple of 32 floats apart: at a multiple of
    // 4 KiB the rows of a tile alias the same L1 sets.
    thread_local std::vector<float> split;
    thread_local std::vector<size_t> offsets;
    // Jobs with the same input (a layer's projections of x) share one copy.
    thread_local std::vector<char> owner;  // whether job j fills its copy
    const auto ld_of = [](size_t in) { return (in + 31) / 32 * 32 + 16; };
    offsets.assign(jobs.size(), 0);
    owner.assign(jobs.size(), 1);
    size_t total = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
      for (size_t i = 0; i < j && owner[j]; ++i)
        if (owner[i] && jobs[i].X == jobs[j].X && jobs[i].in == jobs[j].in) {
          owner[j] = 0;
          offsets[j] = offsets[i];
        }
      if (!owner[j]) continue;
      offsets[j] = total;
      total += n * ld_of(jobs[j].in);
    }
    split.assign(total, 0.0f);
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (!owner[j]) continue;
      const size_t in = jobs[j].in, ldx = ld_of(in);
      float* xs = split.data() + offsets[j];
      for (size_t t = 0; t < n; ++t) {
        const float* x = jobs[j].X + t * in;
        float* d = xs + t * ldx;
        for (size_t i = 0; i < in; i += 2) d[i / 32 * 32 + i % 32 / 2] = x[i];
        for (size_t i = 1; i < in; i += 2) d[i / 32 * 32 + 16 + i % 32 / 2] = x[i];
      }
    }
    const float* xs_all = split.data();
    const size_t* off = offsets.data();
    const RangeTask* task = tasks.data();
    auto run = [&](size_t i) {
      const Bf16MatVecJob& jb = jobs[task[i].job];
      BlockBf16Avx512(jb.W, jb.in, xs_all + off[task[i].job], ld_of(jb.in), n, task[i].begin, task[i].end, jb.Y,
                      jb.out);
    };
    if (work * static_cast<double>(n) < 65536.0) {
      for (size_t i = 0; i < tasks.size(); ++i) run(i);
    } else {
      DefaultThreadPool().ParallelFor(tasks.size(), run);
    }
    return;
  }
#endif
#if defined(__x86_64__)
  const DotFn dot = isa == Isa::kScalar ? DotBf16Scalar : DotBf16Avx2;
#else
  const DotFn dot = DotBf16Scalar;
#endif
  const RangeTask* task = tasks.data();
  auto run = [&](size_t i) {
    const Bf16MatVecJob& jb = jobs[task[i].job];
    const size_t b = task[i].begin, e = task[i].end;
    for (size_t o = b; o < e; ++o)
      for (size_t t = 0; t < n; ++t) jb.Y[t * jb.out + o] = dot(jb.W + o * jb.in, jb.X + t * jb.in, jb.in);
  };
  if (work * static_cast<double>(n) < 65536.0) {
    for (size_t i = 0; i < tasks.size(); ++i) run(i);
  } else {
    DefaultThreadPool().ParallelFor(tasks.size(), run);
  }
}

}  // namespace

namespace cpu {
#define MOESERVE_BF16_VARIANTS(sfx, isa)                                                                     \
  void matmul_bf16_##sfx(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {    \
    MatMulBf16(W, out, in, X, n, Y, isa);                                                                    \
  }                                                                                                          \
  void matvec_bf16_many_##sfx(std::span<const Bf16MatVecJob> jobs, size_t n) { MatVecBf16Many(jobs, n, isa); }
MOESERVE_BF16_VARIANTS(scalar, Isa::kScalar)
MOESERVE_BF16_VARIANTS(avx2, Isa::kAvx2)
MOESERVE_BF16_VARIANTS(avx512, Isa::kAvx512)
#undef MOESERVE_BF16_VARIANTS
}  // namespace cpu

}  // namespace moeserve::kernels
