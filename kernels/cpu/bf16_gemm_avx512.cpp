// BF16 weights times fp32 activations at prefill row counts (matmul_bf16 from
// kSmallBatchMaxRows + 1 rows), AVX-512 F + FMA, compiled with those flags
// only here.
//
// The fp32 GEMM (matmul_avx512.cpp) packs W into k-major panels of 32 output
// columns and broadcasts X: from BF16 that meant widening the whole matrix to
// fp32 (a write and a read of twice its bytes) and then transposing it
// element by element into the panels. At a routed expert's ~80 rows that
// work is not amortised: 1024 x 2048 at 80 rows ran at about half the fp32
// FMA peak of one core. Here the roles are swapped: the tokens are the
// vector lanes (X transposed once per call, a small n x in copy) and each
// weight is broadcast, so W is read in its own row-major order, widened
// 16 at a time into a small fp32 strip (three vector operations per 16
// weights) and never transposed.
//
// Tile: MR weight rows x NV vectors of 16 tokens, MR * NV accumulators
// (<= 25 of the 32 registers), per k NV loads of X^T and MR broadcasts for
// MR * NV FMAs. The tokens go in passes of at most 6 vectors (96 rows); a
// call's k is cut into chunks whose X^T stays in L2 (kXtBytes), and the
// partial sums of every chunk after the first are added in a transposed
// result (Yt), which is written to Y at the end. Each output is summed in k
// order within a chunk and the chunks in order, whatever the tile or pass.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "avx512_transpose.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

constexpr size_t kLanes = 16;
constexpr size_t kMaxPassVectors = 6;  // token vectors per pass (96 rows)
constexpr size_t kXtBytes = 512 << 10;  // X^T of one k chunk, meant to stay in L2

// MR weight rows for a pass of nv token vectors: as many accumulators as the
// registers hold beside the nv loads of X^T and one broadcast.
constexpr size_t RowsFor(size_t nv) { return nv <= 1 ? 24 : nv == 2 ? 12 : nv == 3 ? 8 : nv == 4 ? 6 : nv == 5 ? 5 : 4; }

// acc = sum_k Wf[r][k] * Xt[k][16 j ..] for r < MR, j < NV, then into
// Yt[r * ldyt + 16 j] (stored at the first chunk, added after). Meanwhile
// the next tile's weight rows (next[r], kc BF16 each; null: none) are
// prefetched to L2, a line per row every 32 k: read afresh from memory by
// WidenRows they stalled it (a routed expert's weights are not in cache).
template <size_t MR, size_t NV>
void Tile(const float* __restrict Wf, size_t kc, const float* __restrict Xt, float* __restrict Yt, size_t ldyt,
          bool first, const uint16_t* const* next) {
  __m512 acc[MR][NV];
#pragma GCC unroll 24
  for (size_t r = 0; r < MR; ++r)
#pragma GCC unroll 6
    for (size_t j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  const auto step = [&](size_t k) __attribute__((always_inline)) {
    __m512 x[NV];
#pragma GCC unroll 6
    for (size_t j = 0; j < NV; ++j) x[j] = _mm512_load_ps(Xt + (k * NV + j) * kLanes);
#pragma GCC unroll 24
    for (size_t r = 0; r < MR; ++r) {
      const __m512 w = _mm512_set1_ps(Wf[r * kc + k]);
#pragma GCC unroll 6
      for (size_t j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(w, x[j], acc[r][j]);
    }
  };
  size_t k = 0;
  if (next) {
    for (; k + 32 <= kc; k += 32) {
      for (size_t r = 0; r < MR; ++r) _mm_prefetch(reinterpret_cast<const char*>(next[r] + k), _MM_HINT_T1);
      for (size_t i = 0; i < 32; ++i) step(k + i);
    }
    for (size_t r = 0; r < MR; ++r) _mm_prefetch(reinterpret_cast<const char*>(next[r] + k), _MM_HINT_T1);
  }
  for (; k < kc; ++k) step(k);
#pragma GCC unroll 24
  for (size_t r = 0; r < MR; ++r)
#pragma GCC unroll 6
    for (size_t j = 0; j < NV; ++j) {
      float* y = Yt + r * ldyt + j * kLanes;
      _mm512_store_ps(y, first ? acc[r][j] : _mm512_add_ps(acc[r][j], _mm512_load_ps(y)));
    }
}

template <size_t MR>
void TilePass(size_t nv, const float* Wf, size_t kc, const float* Xt, float* Yt, size_t ldyt, bool first,
              const uint16_t* const* next) {
  switch (nv) {
    case 1: return Tile<MR, 1>(Wf, kc, Xt, Yt, ldyt, first, next);
    case 2: if constexpr (MR * 2 <= 26) return Tile<MR, 2>(Wf, kc, Xt, Yt, ldyt, first, next); break;
    case 3: if constexpr (MR * 3 <= 26) return Tile<MR, 3>(Wf, kc, Xt, Yt, ldyt, first, next); break;
    case 4: if constexpr (MR * 4 <= 26) return Tile<MR, 4>(Wf, kc, Xt, Yt, ldyt, first, next); break;
    case 5: if constexpr (MR * 5 <= 26) return Tile<MR, 5>(Wf, kc, Xt, Yt, ldyt, first, next); break;
    case 6: if constexpr (MR * 6 <= 26) return Tile<MR, 6>(Wf, kc, Xt, Yt, ldyt, first, next); break;
  }
  __builtin_unreachable();
}

inline __mmask16 FirstLanes(size_t count) {
  return count >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1);
}

// X^T of tokens [16 v0, 16 (v0 + nv)) and elements [k0, k0 + kc), as the
// block xt[k][16 nv] (tokens past n zero), 16 x 16 at a time in registers:
// element by element, each store went to another cache line.
void PackXt(const float* X, size_t in, size_t n, size_t k0, size_t kc, size_t v0, size_t nv, float* xt) {
  const size_t width = nv * kLanes;
  for (size_t j = 0; j < nv; ++j) {
    const size_t t0 = (v0 + j) * kLanes;
    for (size_t kb = 0; kb < kc; kb += kLanes) {
      const size_t valid = std::min(kLanes, kc - kb);
      const __mmask16 m = FirstLanes(valid);
      __m512 r[16];
      for (size_t i = 0; i < kLanes; ++i)
        r[i] = t0 + i < n ? _mm512_maskz_loadu_ps(m, X + (t0 + i) * in + k0 + kb) : _mm512_setzero_ps();
      Transpose16(r);
      for (size_t i = 0; i < valid; ++i) _mm512_store_ps(xt + (kb + i) * width + j * kLanes, r[i]);
    }
  }
}

// Y[t][o] = Yt[o - o_begin][t] for t < n, o in [o_begin, o_end); Yt rows
// n_pad floats apart, at least o_end - o_begin rounded up to 16 of them.
// Sixteen rows of Y at a time, each written left to right (sixteen
// sequential streams): column block by column block, the rows (out floats
// apart, a multiple of 4 KiB for the experts) fell in the same L1 sets.
void StoreTransposed(const float* Yt, size_t n_pad, size_t n, float* Y, size_t out, size_t o_begin, size_t o_end) {
  for (size_t tb = 0; tb < n; tb += kLanes) {
    for (size_t ob = o_begin; ob < o_end; ob += kLanes) {
      const __mmask16 m = FirstLanes(o_end - ob);
      __m512 r[16];
      for (size_t i = 0; i < kLanes; ++i) r[i] = _mm512_load_ps(Yt + (ob - o_begin + i) * n_pad + tb);
      Transpose16(r);
      const size_t valid = std::min(kLanes, n - tb);
      for (size_t i = 0; i < valid; ++i) _mm512_mask_storeu_ps(Y + (tb + i) * out + ob, m, r[i]);
    }
  }
}

// Rows [o, o + MR) of W (those below o_end; zero beyond), elements
// [k0, k0 + kc), widened to fp32 rows of kc.
template <size_t MR>
void WidenRows(const uint16_t* W, size_t in, size_t o, size_t o_end, size_t k0, size_t kc, float* Wf) {
  const size_t kv = kc / kLanes * kLanes;
  for (size_t r = 0; r < MR; ++r) {
    float* d = Wf + r * kc;
    if (o + r >= o_end) {
      std::memset(d, 0, kc * sizeof(float));
      continue;
    }
    const uint16_t* w = W + (o + r) * in + k0;
    size_t k = 0;
    for (; k < kv; k += kLanes) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
      _mm512_storeu_ps(d + k, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
    for (; k < kc; ++k) {
      const uint32_t u = static_cast<uint32_t>(w[k]) << 16;
      std::memcpy(d + k, &u, 4);
    }
  }
}

// Scratch kept per thread between calls: the buffers (up to ~1 MiB) would
// otherwise be mapped and faulted in afresh by every product.
struct Scratch {
  float* p = nullptr;
  size_t floats = 0;
  float* Get(size_t want) {
    if (want > floats) {
      FreeScratch(p);
      p = AllocScratch(want);
      floats = want;
    }
    return p;
  }
  ~Scratch() { FreeScratch(p); }
};

template <size_t MR>
void Gemm(const uint16_t* W, size_t in, const float* X, size_t n, float* Y, size_t out, size_t o_begin,
          size_t o_end, size_t nvt, size_t npass, size_t kc_max) {
  const size_t n_pad = nvt * kLanes;
  // Yt's rows: whole tiles, and whole blocks of 16 for StoreTransposed.
  const size_t rows = std::max((o_end - o_begin + MR - 1) / MR * MR, (o_end - o_begin + kLanes - 1) / kLanes * kLanes);
  // Pass p covers token vectors [p * nvt / npass, (p + 1) * nvt / npass).
  const auto pass_v0 = [&](size_t p) { return p * nvt / npass; };
  thread_local Scratch xt_buf, wf_buf, yt_buf;
  float* const Xt = xt_buf.Get(n_pad * kc_max);
  float* const Wf = wf_buf.Get(MR * kc_max);
  float* const Yt = yt_buf.Get(rows * n_pad);  // Yt[o - o_begin][t]
  for (size_t k0 = 0; k0 < in; k0 += kc_max) {
    const size_t kc = std::min(kc_max, in - k0);
    // X^T of the chunk, pass by pass: pass p's block is [kc][its vectors x 16]
    // (contiguous in k).
    for (size_t p = 0; p < npass; ++p)
      PackXt(X, in, n, k0, kc, pass_v0(p), pass_v0(p + 1) - pass_v0(p), Xt + pass_v0(p) * kLanes * kc);
    for (size_t o = o_begin; o < o_end; o += MR) {
      WidenRows<MR>(W, in, o, o_end, k0, kc, Wf);
      // The next tile's rows (the last valid row repeated past o_end).
      const uint16_t* next[MR];
      const bool has_next = o + MR < o_end;
      for (size_t r = 0; r < MR && has_next; ++r) next[r] = W + std::min(o + MR + r, o_end - 1) * in + k0;
      for (size_t p = 0; p < npass; ++p) {
        const size_t v0 = pass_v0(p), nv = pass_v0(p + 1) - v0;
        TilePass<MR>(nv, Wf, kc, Xt + v0 * kLanes * kc, Yt + (o - o_begin) * n_pad + v0 * kLanes, n_pad, k0 == 0,
                     has_next && p == 0 ? next : nullptr);
      }
    }
  }
  StoreTransposed(Yt, n_pad, n, Y, out, o_begin, o_end);
}

}  // namespace

void bf16_gemm_cols_avx512(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                           size_t o_begin, size_t o_end) {
  if (o_begin >= o_end || n == 0) return;
  if (in == 0) {
    for (size_t t = 0; t < n; ++t) std::fill(Y + t * out + o_begin, Y + t * out + o_end, 0.0f);
    return;
  }
  const size_t nvt = (n + kLanes - 1) / kLanes;
  const size_t npass = (nvt + kMaxPassVectors - 1) / kMaxPassVectors;
  const size_t widest = (nvt + npass - 1) / npass;
  // k chunks of equal length (a multiple of 16) with X^T under kXtBytes.
  const size_t k_fit = std::max<size_t>(kLanes, kXtBytes / (nvt * kLanes * sizeof(float)) / kLanes * kLanes);
  const size_t chunks = (in + k_fit - 1) / k_fit;
  const size_t kc_max = std::min(in, ((in + chunks - 1) / chunks + kLanes - 1) / kLanes * kLanes);
  switch (RowsFor(widest)) {
    case 24: return Gemm<24>(W, in, X, n, Y, out, o_begin, o_end, nvt, npass, kc_max);
    case 12: return Gemm<12>(W, in, X, n, Y, out, o_begin, o_end, nvt, npass, kc_max);
    case 8: return Gemm<8>(W, in, X, n, Y, out, o_begin, o_end, nvt, npass, kc_max);
    case 6: return Gemm<6>(W, in, X, n, Y, out, o_begin, o_end, nvt, npass, kc_max);
    case 5: return Gemm<5>(W, in, X, n, Y, out, o_begin, o_end, nvt, npass, kc_max);
    default: return Gemm<4>(W, in, X, n, Y, out, o_begin, o_end, nvt, npass, kc_max);
  }
}

}  // namespace moeserve::kernels::cpu
