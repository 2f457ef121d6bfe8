// The latent-attention tiles of mla_flash_avx512.cpp with BF16 dot products
// (vdpbf16ps: two products per fp32 lane per instruction, twice an FMA's),
// for the BF16-activation kernel set: queries, cached rows and softmax
// weights rounded to BF16, sums and the softmax itself in fp32. Compiled
// with AVX-512 BF16 only here; reached only when the CPU reports
// avx512_bf16 (attention.cpp).
//
// vdpbf16ps adds to each fp32 lane the products of one pair of BF16 values
// from each operand, so the pairs run along a reduction. Scores: lanes are
// head-queries, pairs consecutive row elements (queries packed as
// Qt2[w/2][lane], each cached row rounded into contiguous pairs, a pair
// broadcast per key). Weighted sums: lanes are latent columns, pairs
// consecutive keys (two keys' latent rows interleaved in registers, each
// head-query's pair of weights broadcast; LatentRows).
//
// The cached rows a call reads are rounded to BF16 once per call, before the
// tiles run (every tile of a causal block, and every sparse row's query,
// reads most of them: rounding them per tile cost as much as the products
// for 8-head queries).
#include <cstring>
#include <vector>

#include "avx512_mxfp4_scales.hpp"
#include "mla_flash_tiles.hpp"

namespace moeserve::kernels::cpu {
namespace {

using flash::kBlock;
using flash::Tile;

// 16 words (a[j] low, b[j] high) in BF16.
alignas(64) constexpr uint16_t kPairs16[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                               8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
alignas(32) constexpr uint16_t kPairs8[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};

inline __m512i PairUp16(__m512 a, __m512 b) {
  const __m512i idx = _mm512_load_si512(kPairs16);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

struct ZmmBf16 : flash::Zmm {
  using I = __m512i;
  static I LoadBits(const uint32_t* p) { return _mm512_load_si512(p); }
  static void StoreBits(uint32_t* p, I v) { _mm512_store_si512(p, v); }
  static I Set1Bits(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static R Dot(R acc, I a, I b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
};
struct YmmBf16 : flash::Ymm {
  using I = __m256i;
  static I LoadBits(const uint32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static void StoreBits(uint32_t* p, I v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
  static I Set1Bits(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static R Dot(R acc, I a, I b) { return _mm256_dpbf16_ps(acc, (__m256bh)a, (__m256bh)b); }
};

// Pairs of x[0 .. n) (the last one's high half 0 for odd n) into out.
inline void RoundRow(const float* x, int n, uint32_t* out) {
  int w = 0;
  for (; w + 32 <= n; w += 32)
    _mm512_storeu_si512(out + w / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + w + 16), _mm512_loadu_ps(x + w)));
  if (w < n) {
    const int rest = n - w;
    const __m512 lo = _mm512_maskz_loadu_ps(LaneMask(static_cast<size_t>(std::min(rest, 16))), x + w);
    const __m512 hi = _mm512_maskz_loadu_ps(rest > 16 ? LaneMask(static_cast<size_t>(rest - 16)) : __mmask16(0), x + w + 16);
    _mm512_mask_storeu_epi32(out + w / 2, LaneMask(static_cast<size_t>((rest + 1) / 2)),
                             (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

template <class V, int NV>
struct Bf16Dot {
  using R = typename V::R;
  using I = typename V::I;
  static constexpr int kLanes = V::kWidth * NV;
  static constexpr int kKeyTile = NV == 1 ? 12 : 8;
  // The rows come rounded (RoundedRows): the latent first. (The scores'
  // half of a tile's products; the weighted sums are LatentRows'.)
  static const uint32_t* Words(const float* row) { return reinterpret_cast<const uint32_t*>(row); }

  struct Work {
    int W2, L;
    uint32_t *Qt2, *P2;
    static uint32_t* Words(size_t n) { return reinterpret_cast<uint32_t*>(AllocScratch(n)); }
    Work(int W, int L_)
        : W2((W + 1) / 2),
          L(L_),
          Qt2(Words(static_cast<size_t>(W2 + 1) * kLanes)),  // (+1: whole groups of 2 or 4 words, Bf16DotFewHeads)
          P2(Words(static_cast<size_t>(kBlock / 2 + 1) * kLanes)) {}
    ~Work() {
      for (uint32_t* p : {Qt2, P2}) FreeScratch(reinterpret_cast<float*>(p));
    }
  };

  // Qt2[p][j] = head-query j's word p (0 in pad lanes); at(p, j) places
  // word p of lane j (Bf16DotFewHeads lays them out otherwise). Each row is
  // rounded to BF16 pairs a vector at a time, then its words stored.
  template <class At>
  static void PackQRows(Work& ws, int W, const flash::QuerySlice& q, At at) {
    std::fill(ws.Qt2, ws.Qt2 + static_cast<size_t>(ws.W2 + 1) * kLanes, 0u);
    float* row = AllocScratch(static_cast<size_t>(W));
    uint32_t* words = reinterpret_cast<uint32_t*>(AllocScratch(static_cast<size_t>(ws.W2)));
    for (int j = 0; j < q.lanes; ++j) {
      q.Row(j, row);
      RoundRow(row, W, words);
      for (int p = 0; p < ws.W2; ++p) ws.Qt2[at(p, j)] = words[p];
    }
    FreeScratch(reinterpret_cast<float*>(words));
    FreeScratch(row);
  }
  static void PackQ(Work& ws, int W, const flash::QuerySlice& q) {
    PackQRows(ws, W, q, [](int p, int j) { return static_cast<size_t>(p) * kLanes + j; });
  }

  template <int KN>
  [[gnu::noinline]] static void ScoreTile(const uint32_t* __restrict Qt2, const float* const* k, int W2,
                                          float* __restrict St) {
    const uint32_t* kb[KN];
    for (int i = 0; i < KN; ++i) kb[i] = Words(k[i]);
    R a[NV][KN];
#pragma GCC unroll 12
    for (int i = 0; i < KN; ++i)
      for (int v = 0; v < NV; ++v) a[v][i] = V::Zero();
    for (int p = 0; p < W2; ++p) {
      I q[NV];
      for (int v = 0; v < NV; ++v) q[v] = V::LoadBits(Qt2 + p * kLanes + v * V::kWidth);
#pragma GCC unroll 12
      for (int i = 0; i < KN; ++i) {
        const I kv = V::Set1Bits(kb[i][p]);
        for (int v = 0; v < NV; ++v) a[v][i] = V::Dot(a[v][i], q[v], kv);
      }
    }
#pragma GCC unroll 12
    for (int i = 0; i < KN; ++i)
      for (int v = 0; v < NV; ++v) V::Store(St + i * kLanes + v * V::kWidth, a[v][i]);
  }

  static void Score(Work& ws, const float* const* k, int n, int /*W*/, float* St) {
    flash::KeyTiles<kKeyTile>(
        n, [&](auto kn, int i) { ScoreTile<decltype(kn)::value>(ws.Qt2, k + i, ws.W2, St + i * kLanes); });
  }
};

// The weighted sum turned around: each head-query's output is a row of
// latent columns in the vector lanes (Ot[lane][Padded(L)], each 32-column
// run in the order below). A key pair's two latent rows are interleaved in
// registers (one unpack for each half of a run) and each head-query's
// weight pair is broadcast: per key pair, 32 columns and 8 head-queries,
// 2 loads, 2 unpacks and 8 broadcasts for 16 dot products, and no pairs
// stored. (With head-queries in the lanes, each block's row pairs had to be
// stored first, by every tile, and 8 head-queries took 16 broadcasts for
// 16 half-width products.) P2[ip][lane]: the weight pairs of keys
// (2 ip, 2 ip + 1) of the block.
// A tile is G head-queries by 256 / G columns (16 accumulators): 8 heads by
// one 32-column run, or 4 by two runs (for the heads of 4-head sparse rows).
template <int kLanesAll, int G = 8>
struct LatentRows {
  static constexpr int kRuns = 8 / G, kColumns = 32 * kRuns;  // per tile
  static int Padded(int L) { return (L + kColumns - 1) / kColumns * kColumns; }
  static size_t OtFloats(int L) { return static_cast<size_t>(kLanesAll) * Padded(L); }
  // Lane j's row of Ot, back in column order: the unpacks leave each
  // 32-column run with columns 8q .. 8q + 3 in 128-bit lane q of its low
  // half and 8q + 4 .. 8q + 7 in lane q of its high half.
  static void WriteOut(const float* Ot, int j, int L, float r, float* out) {
    alignas(64) static constexpr int kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
    alignas(64) static constexpr int kSecond[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
    const __m512i first = _mm512_load_si512(kFirst), second = _mm512_load_si512(kSecond);
    const __m512 scale = _mm512_set1_ps(r);
    const float* row = Ot + static_cast<size_t>(j) * Padded(L);
    for (int l0 = 0; l0 < L; l0 += 32) {
      const __m512 lo = _mm512_load_ps(row + l0), hi = _mm512_load_ps(row + l0 + 16);
      const int rest = L - l0;
      _mm512_mask_storeu_ps(out + l0, LaneMask(static_cast<size_t>(std::min(rest, 16))),
                            _mm512_mul_ps(scale, _mm512_permutex2var_ps(lo, first, hi)));
      if (rest > 16)
        _mm512_mask_storeu_ps(out + l0 + 16, LaneMask(static_cast<size_t>(std::min(rest - 16, 16))),
                              _mm512_mul_ps(scale, _mm512_permutex2var_ps(lo, second, hi)));
    }
  }

  // Ot[g + h][l0, l0 + kColumns) = alpha[g + h] Ot[g + h][..] + sum_i P[i][g + h] v_i[l0, ..), h < G.
  [[gnu::noinline]] static void TileG(const uint32_t* __restrict P2, const float* const* v, int n, int g, int l0, int L,
                                      const float* alpha, float* __restrict Ot) {
    const int Lp = Padded(L);
    __mmask32 m[kRuns];
    for (int r = 0; r < kRuns; ++r) {
      const int rest = L - l0 - 32 * r;
      m[r] = rest >= 32 ? ~__mmask32(0) : rest <= 0 ? __mmask32(0) : (__mmask32(1) << rest) - 1;
    }
    __m512 a[G][2 * kRuns];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      const __m512 s = _mm512_set1_ps(alpha[g + h]);
      for (int c = 0; c < 2 * kRuns; ++c) a[h][c] = _mm512_mul_ps(s, _mm512_load_ps(Ot + (g + h) * Lp + l0 + 16 * c));
    }
    const auto row = [&](int i, int r) {
      return _mm512_maskz_loadu_epi16(m[r], reinterpret_cast<const uint16_t*>(v[i]) + l0 + 32 * r);
    };
    const auto pair = [&](int ip, bool partnered) {
      __m512bh lo[kRuns], hi[kRuns];
      for (int r = 0; r < kRuns; ++r) {
        const __m512i x = row(2 * ip, r), y = partnered ? row(2 * ip + 1, r) : _mm512_setzero_si512();
        lo[r] = (__m512bh)_mm512_unpacklo_epi16(x, y);
        hi[r] = (__m512bh)_mm512_unpackhi_epi16(x, y);
      }
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) {
        const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int>(P2[ip * kLanesAll + g + h]));
        for (int r = 0; r < kRuns; ++r) {
          a[h][2 * r] = _mm512_dpbf16_ps(a[h][2 * r], lo[r], p);
          a[h][2 * r + 1] = _mm512_dpbf16_ps(a[h][2 * r + 1], hi[r], p);
        }
      }
    };
    int ip = 0;
    for (; 2 * ip + 1 < n; ++ip) pair(ip, true);
    if (2 * ip < n) pair(ip, false);  // the last key, unpartnered
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < 2 * kRuns; ++c) _mm512_store_ps(Ot + (g + h) * Lp + l0 + 16 * c, a[h][c]);
  }

  // Lanes [0, used) (whole tiles of G).
  static void Sum(const uint32_t* P2, const float* const* v, int n, int L, const float* alpha, float* Ot,
                  int used = kLanesAll) {
    for (int l0 = 0; l0 < L; l0 += kColumns)
      for (int g = 0; g < used; g += G) TileG(P2, v, n, g, l0, L, alpha, Ot);
  }
};

// Causal blocks and sparse rows of more than 8 heads (16 or 32
// head-queries in one or two 512-bit vectors): Bf16Dot's scores,
// LatentRows' weighted sums.
template <int NV>
struct Bf16DotLatentRows : Bf16Dot<ZmmBf16, NV> {
  using Base = Bf16Dot<ZmmBf16, NV>;
  using typename Base::R;
  using typename Base::Work;
  static constexpr int kLanes = Base::kLanes;
  using Rows = LatentRows<kLanes>;
  static size_t OtFloats(int L) { return Rows::OtFloats(L); }
  static void WriteOut(const float* Ot, int j, int L, float r, float* out) { Rows::WriteOut(Ot, j, L, r, out); }
  static void Weighted(Work& ws, const float* P, const float* const* v, int n, int L, const R* alpha, float* Ot) {
    for (int ip = 0; ip < (n + 1) / 2; ++ip)
      for (int u = 0; u < NV; ++u) {
        const __m512 a = _mm512_load_ps(P + 2 * ip * kLanes + u * 16);
        const __m512 b = 2 * ip + 1 < n ? _mm512_load_ps(P + (2 * ip + 1) * kLanes + u * 16) : _mm512_setzero_ps();
        _mm512_store_si512(ws.P2 + ip * kLanes + u * 16, PairUp16(a, b));
      }
    alignas(64) float al[kLanes];
    for (int u = 0; u < NV; ++u) _mm512_store_ps(al + u * 16, alpha[u]);
    Rows::Sum(ws.P2, v, n, L, al, Ot);
  }
};

// Sparse rows of up to 8 heads (one query's heads in 8 lanes), HN (8 or 4)
// of them computed: LatentRows' weighted sums over those heads, and scores
// with the lanes multiplied by M = 16 / HN: lane M h + e holds head h's
// products over the row's words M pp + e, so one broadcast of a key's M
// words (64 or 128 bits) feeds a full-width dot product (a 32-bit broadcast
// fed a half-width one, of which 4-head rows used half); each head's M
// partial sums are added at the end. Qt[pp][M h + e] = the query's word
// M pp + e for head h (0 past W2; rows are padded to whole groups of M).
template <int HN>
struct Bf16DotFewHeads : Bf16Dot<YmmBf16, 1> {
  using V = YmmBf16;
  static constexpr int kHeads = 8, M = 16 / HN;
  static_assert(HN == 8 || HN == 4);
  using Rows = LatentRows<kHeads, HN>;
  static size_t OtFloats(int L) { return Rows::OtFloats(L); }
  static void WriteOut(const float* Ot, int j, int L, float r, float* out) { Rows::WriteOut(Ot, j, L, r, out); }

  static void PackQ(Work& ws, int W, const flash::QuerySlice& q) {
    PackQRows(ws, W, q, [](int p, int h) { return static_cast<size_t>(p / M) * 16 + M * h + p % M; });
  }

  template <int KN>
  [[gnu::noinline]] static void ScoreTile(const uint32_t* __restrict Qt, const float* const* k, int groups,
                                          float* __restrict St) {
    const uint32_t* kb[KN];
    for (int i = 0; i < KN; ++i) kb[i] = Words(k[i]);
    __m512 a[KN];
#pragma GCC unroll 12
    for (int i = 0; i < KN; ++i) a[i] = _mm512_setzero_ps();
    for (int pp = 0; pp < groups; ++pp) {
      const __m512bh q = (__m512bh)_mm512_load_si512(Qt + pp * 16);
#pragma GCC unroll 12
      for (int i = 0; i < KN; ++i) {
        __m512i kv;
        if constexpr (M == 2) {
          uint64_t w;
          std::memcpy(&w, kb[i] + 2 * pp, 8);
          kv = _mm512_set1_epi64(static_cast<long long>(w));
        } else {
          kv = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kb[i] + 4 * pp)));
        }
        a[i] = _mm512_dpbf16_ps(a[i], q, (__m512bh)kv);
      }
    }
    flash::StoreGroupedScores<KN, M>(a, St);
  }
  static void Score(Work& ws, const float* const* k, int n, int /*W*/, float* St) {
    const int groups = (ws.W2 + M - 1) / M;
    flash::KeyTiles<kKeyTile>(
        n, [&](auto kn, int i) { ScoreTile<decltype(kn)::value>(ws.Qt2, k + i, groups, St + i * kLanes); });
  }

  static void Weighted(Work& ws, const float* P, const float* const* v, int n, int L, const R* alpha, float* Ot) {
    // Each key pair's weights as one 512-bit load (as the softmax stored them).
    const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPairs8));
    for (int ip = 0; ip < (n + 1) / 2; ++ip) {
      const __m512 xy = _mm512_maskz_loadu_ps(2 * ip + 1 < n ? __mmask16(0xFFFF) : __mmask16(0xFF), P + 2 * ip * kLanes);
      V::StoreBits(ws.P2 + ip * kLanes, _mm256_permutexvar_epi16(idx, (__m256i)_mm512_cvtneps_pbh(xy)));
    }
    alignas(32) float al[kHeads];
    V::Store(al, alpha[0]);
    Rows::Sum(ws.P2, v, n, L, al, Ot, HN);
  }
};
static_assert(Bf16DotFewHeads<8>::kLanes == Bf16DotFewHeads<8>::kHeads);

// The rows the call reads, rounded to BF16 pairs once: `at` lists them
// (row indices), rounded[i] = the i-th's W2 words. One buffer per calling
// thread, kept between calls (its pages stay mapped) up to
// kAttentionScratchKeepBytes: past that, released when the call ends, so one
// very long context does not hold the thread's memory after it is gone.
struct RoundedRows {
  std::vector<uint32_t> words;
  std::vector<const float*> ptrs;  // per row index, for the tile runner
  size_t HeldBytes() const {
    return words.capacity() * sizeof(uint32_t) + ptrs.capacity() * sizeof(const float*);
  }
  void Trim() {
    if (HeldBytes() <= kAttentionScratchKeepBytes) return;
    std::vector<uint32_t>().swap(words);
    std::vector<const float*>().swap(ptrs);
  }
  // Rows RowWords(W) apart: whole groups of 4 words, so the few-heads
  // scores can read a row's words 2 or 4 at a time (the pad words zero).
  static size_t RowWords(int W) { return static_cast<size_t>(((W + 1) / 2 + 3) & ~3); }
  void Round(const float* const* rows, size_t offset, const std::vector<int>& at, int W) {
    const size_t stride = RowWords(W);
    if (words.size() < at.size() * stride) words.resize(at.size() * stride);
    constexpr size_t kChunk = 64;
    DefaultThreadPool().ParallelFor((at.size() + kChunk - 1) / kChunk, [&](size_t c) {
      for (size_t i = c * kChunk; i < std::min(at.size(), (c + 1) * kChunk); ++i) {
        uint32_t* row = &words[i * stride];
        RoundRow(rows[at[i]] + offset, W, row);
        for (size_t w = static_cast<size_t>((W + 1) / 2); w < stride; ++w) row[w] = 0;
      }
    });
  }
  const float* Row(size_t i, int W) const { return reinterpret_cast<const float*>(&words[i * RowWords(W)]); }
};
thread_local RoundedRows tl_rounded;

}  // namespace

void mla_flash_bf16dot(const MlaDecodeShape& sh, const float* q_abs, const float* q_pe, const float* const* rows,
                       size_t offset, const int* keys, int n_keys, float* lat) {
  // List entries [0, furthest) are all any head-query reads; rounded in list
  // order, the tiles then read them without the key list.
  int furthest = 1;
  for (int h = 0; h < sh.heads; ++h) furthest = std::max(furthest, sh.visible ? std::min(n_keys, sh.visible[h]) : n_keys);
  std::vector<int> at(static_cast<size_t>(furthest));
  for (int i = 0; i < furthest; ++i) at[static_cast<size_t>(i)] = keys ? keys[i] : i;
  RoundedRows& r = tl_rounded;
  const int W = sh.kv_lora + sh.rope;
  r.Round(rows, offset, at, W);
  r.ptrs.resize(at.size());
  for (size_t i = 0; i < at.size(); ++i) r.ptrs[i] = r.Row(i, W);
  flash::DecodeTiles<Tile<flash::Zmm, 2, Bf16DotLatentRows<2>>>(sh, q_abs, q_pe, r.ptrs.data(), 0, nullptr,
                                                                std::min(n_keys, furthest), lat);
  r.Trim();
}

void mla_rows_flash_bf16dot(const MlaDecodeShape& sh, int queries, const float* q_abs, const float* q_pe,
                            const float* const* rows, size_t offset, const int* const* keys, const int* n_keys,
                            float* lat) {
  // The union of the queries' keys, each rounded once; ptrs indexed by key.
  int top = 0;
  for (int j = 0; j < queries; ++j)
    for (int i = 0; i < n_keys[j]; ++i) top = std::max(top, keys[j][i]);
  // Rounded in ascending key order: a query's list (ascending, as
  // TopKIndices writes it) then reads the buffer forwards.
  std::vector<int> slot(static_cast<size_t>(top) + 1, -1), at;
  for (int j = 0; j < queries; ++j)
    for (int i = 0; i < n_keys[j]; ++i) slot[static_cast<size_t>(keys[j][i])] = 0;
  for (size_t key = 0; key < slot.size(); ++key)
    if (slot[key] == 0) {
      slot[key] = static_cast<int>(at.size());
      at.push_back(static_cast<int>(key));
    }
  RoundedRows& r = tl_rounded;
  const int W = sh.kv_lora + sh.rope;
  r.Round(rows, offset, at, W);
  r.ptrs.assign(slot.size(), nullptr);
  for (size_t key = 0; key < slot.size(); ++key)
    if (slot[key] >= 0) r.ptrs[key] = r.Row(static_cast<size_t>(slot[key]), W);
  const float* const* rounded = r.ptrs.data();
  if (sh.heads <= 4)
    flash::RowsTiles<Tile<flash::Ymm, 1, Bf16DotFewHeads<4>>>(sh, queries, q_abs, q_pe, rounded, 0, keys, n_keys, lat);
  else if (sh.heads <= 8)
    flash::RowsTiles<Tile<flash::Ymm, 1, Bf16DotFewHeads<8>>>(sh, queries, q_abs, q_pe, rounded, 0, keys, n_keys, lat);
  else if (sh.heads <= 16)
    flash::RowsTiles<Tile<flash::Zmm, 1, Bf16DotLatentRows<1>>>(sh, queries, q_abs, q_pe, rounded, 0, keys, n_keys, lat);
  else
    flash::RowsTiles<Tile<flash::Zmm, 2, Bf16DotLatentRows<2>>>(sh, queries, q_abs, q_pe, rounded, 0, keys, n_keys, lat);
  r.Trim();
}

size_t mla_bf16dot_held_bytes() { return tl_rounded.HeldBytes(); }

}  // namespace moeserve::kernels::cpu
