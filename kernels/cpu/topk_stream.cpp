// The streamed top-k (topk_stream.hpp): a threshold compare per score, a
// buffer of the few that pass, cut back to the best k at 2k entries.
#include "moeserve/kernels/topk_stream.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>
#include <functional>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/topk_binned.hpp"
#include "topk_order.hpp"

namespace moeserve::kernels {
namespace {

using topk::Entry;
using topk::KeyScore;

// Appends the entries of scores[i, n) above t (position first + index) to
// out[m, ...) until m reaches cap or the scores run out; returns m and sets
// *next to the first score not looked at. Writes up to 16 entries past m.
// The scan that rejects nearly every score: AVX-512 where the CPU has it
// (a compare per 16 scores, a compress-store of the few above), else plain.
using AppendFn = size_t (*)(const float*, int, int, int, float, uint64_t*, size_t, size_t, int*);

size_t AppendPortable(const float* s, int i, int n, int first, float t, uint64_t* out, size_t m, size_t cap,
                      int* next) {
  for (; i < n && m < cap; ++i) {
    out[m] = Entry(s[i], first + i);
    m += s[i] > t ? 1 : 0;
  }
  *next = i;
  return m;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) size_t AppendAvx512(const float* s, int i, int n, int first, float t,
                                                        uint64_t* out, size_t m, size_t cap, int* next) {
  const __m512 tv = _mm512_set1_ps(t);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (; i + 16 <= n && m < cap; i += 16) {
    const __m512 v = _mm512_loadu_ps(s + i);
    const __mmask16 above = _mm512_cmp_ps_mask(v, tv, _CMP_GT_OQ);
    if (!above) continue;
    // OrderKey: -0 as +0, then negatives inverted, positives with the sign bit set.
    const __mmask16 zero = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_EQ_OQ);
    const __m512i b = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~zero), _mm512_castps_si512(v));
    const __mmask16 neg = _mm512_test_epi32_mask(b, sign);
    const __m512i key = _mm512_mask_xor_epi32(_mm512_or_si512(b, sign), neg, b, _mm512_set1_epi32(-1));
    const __m512i pos = _mm512_xor_si512(_mm512_add_epi32(_mm512_set1_epi32(first + i), lane), _mm512_set1_epi32(-1));
    // Entries (key << 32 | ~position), two halves of 8.
    const __m512i lo = _mm512_or_si512(_mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(key)), 32),
                                       _mm512_cvtepu32_epi64(_mm512_castsi512_si256(pos)));
    const __m512i hi =
        _mm512_or_si512(_mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(key, 1)), 32),
                        _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(pos, 1)));
    const __mmask8 mlo = static_cast<__mmask8>(above), mhi = static_cast<__mmask8>(above >> 8);
    _mm512_mask_compressstoreu_epi64(out + m, mlo, lo);
    m += static_cast<size_t>(__builtin_popcount(mlo));
    _mm512_mask_compressstoreu_epi64(out + m, mhi, hi);
    m += static_cast<size_t>(__builtin_popcount(mhi));
  }
  if (m < cap) return AppendPortable(s, i, n, first, t, out, m, cap, next);
  *next = i;
  return m;
}
AppendFn PickAppend() { return __builtin_cpu_supports("avx512f") ? AppendAvx512 : AppendPortable; }
#else
AppendFn PickAppend() { return AppendPortable; }
#endif

}  // namespace

namespace {
// maxima[g] = the largest of s[r * groups + g] over r < rows: groups of
// scores strided by `groups`, so that their maxima are an element-wise max
// of consecutive rows of scores (one vector max per 16 scores; contiguous
// groups of 16 took a chain of 16 scalar compares each).
using StridedMaximaFn = void (*)(const float* s, int rows, int groups, float* maxima);

void StridedMaximaPortable(const float* s, int rows, int groups, float* maxima) {
  std::copy(s, s + groups, maxima);
  for (int r = 1; r < rows; ++r) {
    const float* row = s + static_cast<size_t>(r) * groups;
    for (int g = 0; g < groups; ++g) maxima[g] = row[g] > maxima[g] ? row[g] : maxima[g];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) void StridedMaximaAvx512(const float* s, int rows, int groups, float* maxima) {
  // Row by row, in memory order (the maxima, 2k floats, stay in L1).
  std::copy(s, s + groups, maxima);
  for (int r = 1; r < rows; ++r) {
    const float* row = s + static_cast<size_t>(r) * groups;
    int g = 0;
    for (; g + 16 <= groups; g += 16)
      _mm512_storeu_ps(maxima + g, _mm512_max_ps(_mm512_loadu_ps(maxima + g), _mm512_loadu_ps(row + g)));
    for (; g < groups; ++g) maxima[g] = row[g] > maxima[g] ? row[g] : maxima[g];
  }
}
StridedMaximaFn PickStridedMaxima() {
  return __builtin_cpu_supports("avx512f") ? StridedMaximaAvx512 : StridedMaximaPortable;
}
#else
StridedMaximaFn PickStridedMaxima() { return StridedMaximaPortable; }
#endif
}  // namespace

void TopKStream::Reset(int k) {
  k_ = std::max(1, k);
  full_ = false;
  threshold_ = 0;
  floor_ = -std::numeric_limits<float>::infinity();
  size_ = 0;
  // 2k held at most, plus a block's unconditional writes past the end.
  buf_.resize(Capacity() + kBlock);
}

namespace {
// The k-th largest of the n unique entries e (1 <= k < n). A sample of
// kSample entries, sorted, brackets it: one branchless pass counts the
// entries above the bracket and gathers those inside it, and the k-th is
// selected among those few, about a fifth of the entries; when the bracket
// misses (a sample unlike the whole), among all of them. nth_element over
// all 2k entries, with a mispredicted branch per comparison, was most of a
// cut's time.
uint64_t KthLargest(const uint64_t* e, size_t n, size_t k, std::vector<uint64_t>& scratch) {
  constexpr size_t kSample = 128, kMargin = 12;
  scratch.resize(n);
  if (n >= 8 * kSample) {
    uint64_t sample[kSample];
    for (size_t i = 0; i < kSample; ++i) sample[i] = e[i * n / kSample];
    std::sort(sample, sample + kSample, std::greater<uint64_t>());
    // The k-th largest's expected place in the sorted sample, widened by the
    // margin either way (about two standard deviations of a sample's rank).
    const size_t at = k * kSample / n;
    const uint64_t hi = at > kMargin ? sample[at - kMargin - 1] : ~uint64_t{0};
    const uint64_t lo = at + kMargin < kSample ? sample[at + kMargin] : 0;
    size_t above = 0, m = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t x = e[i];
      above += x > hi;
      scratch[m] = x;
      m += static_cast<size_t>((x >= lo) & (x <= hi));
    }
    if (above < k && above + m >= k) {
      const auto kth = scratch.begin() + static_cast<std::ptrdiff_t>(k - above - 1);
      std::nth_element(scratch.begin(), kth, scratch.begin() + static_cast<std::ptrdiff_t>(m), std::greater<uint64_t>());
      return *kth;
    }
  }
  std::copy(e, e + n, scratch.begin());
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1), scratch.end(),
                   std::greater<uint64_t>());
  return scratch[k - 1];
}
}  // namespace

void TopKStream::Cut() {
  const size_t k = static_cast<size_t>(k_);
  if (size_ <= k) return;
  // The k-th largest entry (entries are unique), then a pass in position
  // order keeping those at or above it: exactly k, still in position order.
  // (A radix select here, as TopKIndicesRef's, measured slower: it clears
  // and fills 5K counters a cut, and an ascending stream cuts every k scores.)
  const uint64_t kth = KthLargest(buf_.data(), size_, k, scratch_);
  size_t w = 0;
  for (size_t i = 0; i < size_; ++i) {
    const uint64_t e = buf_[i];
    buf_[w] = e;
    w += e >= kth;
  }
  size_ = w;
  full_ = true;
  threshold_ = std::max(KeyScore(static_cast<uint32_t>(kth >> 32)), floor_);
}

float TopKStream::LowerBound() const {
  // threshold_ is the k-th score held or one below a raised bound (seeded
  // or another stream's): in each case k scores at or above it exist.
  return full_ ? threshold_ : -std::numeric_limits<float>::infinity();
}

void TopKStream::RaiseLowerBound(float bound) {
  if (!(bound > -std::numeric_limits<float>::infinity())) return;
  // "> the float below bound" is ">= bound" (-0 and +0 alike: both above
  // the negative denormal below +0).
  const float below = std::nextafter(bound, -std::numeric_limits<float>::infinity());
  if (below <= floor_) return;
  floor_ = below;
  if (!full_ || threshold_ < floor_) threshold_ = floor_;
  full_ = true;
}

void TopKStream::Push(const float* scores, int n, int first) {
  // A first push of many scores seeds the threshold from them (only those
  // above it can be among the best k of what they hold, let alone of the
  // whole stream), so that its first 2k scores do not all enter.
  // (A bound raised from another stream may already hold: the higher wins.)
  if (size_ == 0 && n >= 4 * k_) SeedFrom(scores, n);
  const size_t cap = Capacity();
  int i = 0;
  // Until k are held every score is a candidate.
  for (; i < n && !full_; ++i) {
    buf_[size_++] = Entry(scores[i], first + i);
    if (size_ >= cap) Cut();
  }
  // Then only a score above the threshold can enter (one equal to it would
  // lose the tie: a later position); a cut each time 2k are held.
  static const AppendFn append = PickAppend();
  while (i < n) {
    size_ = append(scores, i, n, first, threshold_, buf_.data(), size_, cap, &i);
    if (size_ >= cap) Cut();
  }
}

int TopKStream::Finish(int* out) {
  Cut();
  for (size_t i = 0; i < size_; ++i) out[i] = static_cast<int>(~static_cast<uint32_t>(buf_[i]));
  return static_cast<int>(size_);
}

int TopKStream::FinishMerged(std::span<TopKStream> streams, int* out) {
  if (streams.empty()) return 0;
  // Entries are unique across the streams (their positions are), so the
  // best k are those at or above the k-th largest; concatenated in stream
  // order they are in position order, and a pass keeps them so.
  thread_local std::vector<uint64_t> all, order;
  all.clear();
  for (TopKStream& s : streams) {
    s.Cut();
    all.insert(all.end(), s.buf_.begin(), s.buf_.begin() + static_cast<std::ptrdiff_t>(s.size_));
  }
  const size_t k = static_cast<size_t>(streams.front().k_);
  size_t w = all.size();
  if (all.size() > k) {
    // The bracketed selection, as a cut's (nth_element over the streams'
    // 4-8K entries was 4% of a 1M decode step).
    const uint64_t kth = KthLargest(all.data(), all.size(), k, order);
    w = 0;
    for (const uint64_t e : all) {
      all[w] = e;
      w += e >= kth;
    }
  }
  for (size_t i = 0; i < w; ++i) out[i] = static_cast<int>(~static_cast<uint32_t>(all[i]));
  return static_cast<int>(w);
}

void TopKStream::SeedFrom(const float* scores, int n) {
  const int k = k_;
  // A lower bound on the k-th best score: the k-th largest of the maxima of
  // 2k disjoint groups of n / 2k scores (k groups hold a score at or above
  // it, at k positions; the groups are strided, scores left over in none).
  // Scores below it never enter: about 2.5k do in all on random scores, one
  // cut. The k-th of the maxima comes from the binned selection (nth_element
  // over the 4K maxima cost as much again as their scan), and groups under
  // 8 scores would make the bound cost nearly what the exact k-th of the
  // scores does: there that is the bound.
  const int groups = 2 * k;
  const int rows = n / groups;
  float bound = 0;
  if (rows >= 8) {
    static const StridedMaximaFn strided_maxima = PickStridedMaxima();
    maxima_.resize(static_cast<size_t>(groups));
    strided_maxima(scores, rows, groups, maxima_.data());
    if (!KthLargestBinned(maxima_.data(), groups, k, &bound)) {  // an infinite score
      std::nth_element(maxima_.begin(), maxima_.begin() + (k - 1), maxima_.end(), std::greater<float>());
      bound = maxima_[static_cast<size_t>(k - 1)];
    }
    RaiseLowerBound(bound);
    return;
  }
  if (KthLargestBinned(scores, n, k, &bound)) RaiseLowerBound(bound);
}

void TopKIndicesStreamed(const float* scores, int n, int k, int* out) {
  if (k <= 0) return;
  thread_local TopKStream stream;
  stream.Reset(k);
  stream.Push(scores, n, 0);
  stream.Finish(out);
}

}  // namespace moeserve::kernels
