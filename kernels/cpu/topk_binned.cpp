// The binned top-k (topk_binned.hpp): the scores' range, their bins, the bin
// of the k-th best, then an exact order only inside that bin.
#include "moeserve/kernels/topk_binned.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "topk_order.hpp"

namespace moeserve::kernels {
namespace {

constexpr int kBins = 2048;

// bin(x) = min(kBins - 1, trunc((x - lo) * scale)): monotone in x, equal
// for equal x (and for -0 and +0: x - lo is the same value for both when lo
// is not zero, and a zero when it is). The vector forms below compute the
// same IEEE operations lane by lane, never an FMA, so they agree bit for bit.
struct Binning {
  float lo = 0, scale = 0;
  int Of(float x) const { return std::min(kBins - 1, static_cast<int>((x - lo) * scale)); }
};

// What the scan of the scores found: the bin of the k-th best, how many
// scores lie above that bin, how many of its own are needed.
struct Boundary {
  int bin = 0, above = 0, needed = 0;
};

// The passes over all the scores, portable and AVX-512 (one runs, picked
// once by the CPU; both give the same results).
struct Passes {
  // *lo, *hi: the smallest and largest score.
  void (*range)(const float* s, int n, float* lo, float* hi);
  // bins[i] = binning.Of(s[i]).
  void (*bins)(const float* s, int n, Binning b, uint16_t* bins);
  // Positions with a bin above `bin` to above[], equal to it to at[], both
  // in position order; returns the counts through *na, *nt.
  void (*collect)(const float* s, int n, Binning b, int bin, int* above, int* at, int* na, int* nt);
};

void RangePortable(const float* s, int n, float* lo, float* hi) {
  float a = s[0], b = s[0];
  for (int i = 1; i < n; ++i) {
    a = s[i] < a ? s[i] : a;
    b = s[i] > b ? s[i] : b;
  }
  *lo = a;
  *hi = b;
}

void BinsPortable(const float* s, int n, Binning b, uint16_t* bins) {
  for (int i = 0; i < n; ++i) bins[i] = static_cast<uint16_t>(b.Of(s[i]));
}

void CollectPortable(const float* s, int n, Binning b, int bin, int* above, int* at, int* na, int* nt) {
  int a = 0, t = 0;
  for (int i = 0; i < n; ++i) {
    const int x = b.Of(s[i]);
    above[a] = i;
    a += x > bin ? 1 : 0;
    at[t] = i;
    t += x == bin ? 1 : 0;
  }
  *na = a;
  *nt = t;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MOESERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

MOESERVE_AVX512 void RangeAvx512(const float* s, int n, float* lo, float* hi) {
  if (n < 16) return RangePortable(s, n, lo, hi);
  __m512 a = _mm512_loadu_ps(s), b = a;
  int i = 16;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(s + i);
    a = _mm512_min_ps(a, v);
    b = _mm512_max_ps(b, v);
  }
  float l = _mm512_reduce_min_ps(a), h = _mm512_reduce_max_ps(b);
  for (; i < n; ++i) {
    l = s[i] < l ? s[i] : l;
    h = s[i] > h ? s[i] : h;
  }
  *lo = l;
  *hi = h;
}

MOESERVE_AVX512 inline __m512i BinsOf(__m512 v, __m512 lo, __m512 scale) {
  return _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_mul_ps(_mm512_sub_ps(v, lo), scale)),
                          _mm512_set1_epi32(kBins - 1));
}

MOESERVE_AVX512 void BinsAvx512(const float* s, int n, Binning b, uint16_t* bins) {
  const __m512 lo = _mm512_set1_ps(b.lo), scale = _mm512_set1_ps(b.scale);
  int i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bins + i), _mm512_cvtepi32_epi16(BinsOf(_mm512_loadu_ps(s + i), lo, scale)));
  for (; i < n; ++i) bins[i] = static_cast<uint16_t>(b.Of(s[i]));
}

MOESERVE_AVX512 void CollectAvx512(const float* s, int n, Binning b, int bin, int* above, int* at, int* na, int* nt) {
  const __m512 lo = _mm512_set1_ps(b.lo), scale = _mm512_set1_ps(b.scale);
  const __m512i target = _mm512_set1_epi32(bin);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  int a = 0, t = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i x = BinsOf(_mm512_loadu_ps(s + i), lo, scale);
    const __mmask16 gt = _mm512_cmpgt_epi32_mask(x, target), eq = _mm512_cmpeq_epi32_mask(x, target);
    if (!(gt | eq)) continue;
    const __m512i pos = _mm512_add_epi32(_mm512_set1_epi32(i), lane);
    _mm512_mask_compressstoreu_epi32(above + a, gt, pos);
    a += __builtin_popcount(gt);
    _mm512_mask_compressstoreu_epi32(at + t, eq, pos);
    t += __builtin_popcount(eq);
  }
  for (; i < n; ++i) {
    const int x = b.Of(s[i]);
    if (x > bin) above[a++] = i;
    if (x == bin) at[t++] = i;
  }
  *na = a;
  *nt = t;
}

Passes PickPasses() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return {RangeAvx512, BinsAvx512, CollectAvx512};
  return {RangePortable, BinsPortable, CollectPortable};
}
#else
Passes PickPasses() { return {RangePortable, BinsPortable, CollectPortable}; }
#endif

const Passes& ThePasses() {
  static const Passes passes = PickPasses();
  return passes;
}

// The binning of s and the bin of its k-th best; false when the range does
// not give finite bins (an infinite score, or a range that overflows).
bool FindBoundary(const float* s, int n, int k, Binning* binning, Boundary* boundary, bool* all_equal) {
  float lo = 0, hi = 0;
  ThePasses().range(s, n, &lo, &hi);
  if (!std::isfinite(lo) || !std::isfinite(hi)) return false;
  *all_equal = lo == hi;  // -0 and +0 included: one key
  if (*all_equal) return true;
  const float range = hi - lo;
  const float scale = static_cast<float>(kBins) / range;
  if (!std::isfinite(range) || !std::isfinite(scale)) return false;
  *binning = {lo, scale};
  thread_local std::vector<uint16_t> bins;
  bins.resize(static_cast<size_t>(n));
  ThePasses().bins(s, n, *binning, bins.data());
  // Two interleaved counts: consecutive equal bins would otherwise wait on
  // each other's increments.
  std::array<std::array<uint32_t, kBins>, 2> count{};
  int i = 0;
  for (; i + 2 <= n; i += 2) {
    ++count[0][bins[static_cast<size_t>(i)]];
    ++count[1][bins[static_cast<size_t>(i) + 1]];
  }
  if (i < n) ++count[0][bins[static_cast<size_t>(i)]];
  int above = 0;
  for (int b = kBins - 1; b >= 0; --b) {
    const int c = static_cast<int>(count[0][static_cast<size_t>(b)] + count[1][static_cast<size_t>(b)]);
    if (above + c >= k) {
      *boundary = {b, above, k - above};
      return true;
    }
    above += c;
  }
  return false;  // unreachable for k <= n
}

}  // namespace

bool TopKIndicesBinned(const float* scores, int n, int k, int* out) {
  if (k < 1 || k >= n) return false;
  Binning binning;
  Boundary boundary;
  bool all_equal = false;
  if (!FindBoundary(scores, n, k, &binning, &boundary, &all_equal)) return false;
  if (all_equal) {  // every score ties: the first k positions
    for (int i = 0; i < k; ++i) out[i] = i;
    return true;
  }
  thread_local std::vector<int> above, at;
  above.resize(static_cast<size_t>(n));
  at.resize(static_cast<size_t>(n));
  int na = 0, nt = 0;
  ThePasses().collect(scores, n, binning, boundary.bin, above.data(), at.data(), &na, &nt);
  // The boundary bin's best `needed` (entries order score, then the lower
  // position), kept in position order.
  int taken = nt;
  if (boundary.needed < nt) {
    thread_local std::vector<uint64_t> entries, sorted;
    entries.resize(static_cast<size_t>(nt));
    for (int j = 0; j < nt; ++j) {
      const int pos = at[static_cast<size_t>(j)];
      entries[static_cast<size_t>(j)] = topk::Entry(scores[pos], pos);
    }
    sorted.assign(entries.begin(), entries.end());
    std::nth_element(sorted.begin(), sorted.begin() + (boundary.needed - 1), sorted.end(), std::greater<uint64_t>());
    const uint64_t kth = sorted[static_cast<size_t>(boundary.needed - 1)];
    taken = 0;
    for (int j = 0; j < nt; ++j)
      if (entries[static_cast<size_t>(j)] >= kth) at[static_cast<size_t>(taken++)] = at[static_cast<size_t>(j)];
  }
  // Both lists ascend: merge them.
  std::merge(above.begin(), above.begin() + na, at.begin(), at.begin() + taken, out);
  return true;
}

bool KthLargestBinned(const float* scores, int n, int k, float* kth) {
  if (k < 1 || k > n) return false;
  Binning binning;
  Boundary boundary;
  bool all_equal = false;
  if (!FindBoundary(scores, n, k, &binning, &boundary, &all_equal)) return false;
  if (all_equal) {
    *kth = scores[0];
    return true;
  }
  thread_local std::vector<int> above, at;
  thread_local std::vector<float> values;
  above.resize(static_cast<size_t>(n));
  at.resize(static_cast<size_t>(n));
  int na = 0, nt = 0;
  ThePasses().collect(scores, n, binning, boundary.bin, above.data(), at.data(), &na, &nt);
  values.resize(static_cast<size_t>(nt));
  for (int j = 0; j < nt; ++j) values[static_cast<size_t>(j)] = scores[at[static_cast<size_t>(j)]];
  std::nth_element(values.begin(), values.begin() + (boundary.needed - 1), values.end(), std::greater<float>());
  *kth = values[static_cast<size_t>(boundary.needed - 1)];
  return true;
}

}  // namespace moeserve::kernels
