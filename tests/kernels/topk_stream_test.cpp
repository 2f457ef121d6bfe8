// The streamed top-k (topk_stream.hpp), the binned one (topk_binned.hpp) and
// TopKIndices against the radix reference TopKIndicesRef, bit for bit, on inputs that stress the tie rule
// (ties to the lower position) and the threshold: many equal scores, -0 and
// +0, -inf, ascending and descending runs, k above the number of scores, and
// streams cut into tiles of many sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/topk_binned.hpp"
#include "moeserve/kernels/topk_stream.hpp"

namespace moeserve::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> MakeScores(const std::string& kind, int n, std::mt19937& rng) {
  std::vector<float> s(static_cast<size_t>(n));
  std::uniform_int_distribution<int> small(-3, 3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int i = 0; i < n; ++i) {
    float& v = s[static_cast<size_t>(i)];
    if (kind == "equal") v = 1.5f;
    else if (kind == "few_values") v = static_cast<float>(small(rng));
    else if (kind == "signed_zeros") v = small(rng) < 0 ? -0.0f : (small(rng) > 1 ? 1.0f : 0.0f);
    else if (kind == "ascending") v = static_cast<float>(i / 3);  // runs of 3 equal
    else if (kind == "descending") v = static_cast<float>((n - i) / 3);
    else if (kind == "neg_inf") v = small(rng) < 1 ? -kInf : static_cast<float>(small(rng));
    else if (kind == "all_neg_inf") v = -kInf;
    else if (kind == "saw") v = static_cast<float>(i % 257) - (i % 2 ? 0.0f : 0.5f);
    else if (kind == "outlier") v = i == n / 3 ? 1e30f : g(rng);  // one bin holds nearly every score
    else if (kind == "dense_bin") v = 1.0f + static_cast<float>(i % 7919) * 1e-7f;  // 7919 values, one apart in ulps
    else v = g(rng);  // "normal"
  }
  return s;
}

// The selection written by a stable sort: the specification of the tie rule.
std::vector<int> StableSortTopK(const std::vector<float>& s, int k) {
  std::vector<int> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return s[a] > s[b]; });
  idx.resize(std::min<size_t>(idx.size(), static_cast<size_t>(k)));
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<int> Streamed(const std::vector<float>& s, int k, int tile) {
  TopKStream stream;
  stream.Reset(k);
  const int n = static_cast<int>(s.size());
  for (int t0 = 0; t0 < n; t0 += tile) stream.Push(s.data() + t0, std::min(tile, n - t0), t0);
  std::vector<int> out(static_cast<size_t>(std::min(k, n)), -1);
  const int got = stream.Finish(out.data());
  EXPECT_EQ(got, std::min(k, n));
  return out;
}

TEST(TopKStream, MatchesTheReferenceOnAdversarialScoresAndTiles) {
  std::mt19937 rng(11);
  int checked = 0;
  for (const char* kind :
       {"equal", "few_values", "signed_zeros", "ascending", "descending", "neg_inf", "all_neg_inf", "saw", "normal",
        "outlier", "dense_bin"}) {
    for (int n : {1, 5, 63, 64, 65, 300, 1000, 5003}) {
      const std::vector<float> s = MakeScores(kind, n, rng);
      for (int k : {1, 2, 7, 64, 100, n / 2 + 1, n - 1, n, n + 5}) {
        if (k < 1) continue;
        std::vector<int> want(static_cast<size_t>(std::min(k, n)));
        TopKIndicesRef(s.data(), n, std::min(k, n), want.data());
        ASSERT_EQ(want, StableSortTopK(s, k)) << kind << " n " << n << " k " << k << ": the reference's tie rule";
        for (int tile : {1, 3, 16, 17, 64, 1000, n}) {
          ASSERT_EQ(Streamed(s, k, tile), want) << kind << " n " << n << " k " << k << " tile " << tile;
          ++checked;
        }
        if (k <= n) {
          std::vector<int> fast(static_cast<size_t>(k), -1);
          TopKIndices(s.data(), n, k, fast.data());
          ASSERT_EQ(fast, want) << kind << " n " << n << " k " << k;
          std::vector<int> streamed(static_cast<size_t>(k), -1);
          TopKIndicesStreamed(s.data(), n, k, streamed.data());
          ASSERT_EQ(streamed, want) << kind << " n " << n << " k " << k;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// Streams over consecutive ranges of the scores (range r's positions
// [bounds[r], bounds[r + 1])), each pushed in tiles, then merged. share: the
// ranges' tiles pushed in turn, each stream raised to the best LowerBound
// of all before its push (as threads sharing one bound would).
std::vector<int> Merged(const std::vector<float>& s, int k, const std::vector<int>& bounds, int tile,
                        bool share = false) {
  std::vector<TopKStream> streams(bounds.size() - 1);
  for (TopKStream& stream : streams) stream.Reset(k);
  float shared = -kInf;
  for (int step = 0;; ++step) {
    bool pushed = false;
    for (size_t r = 0; r + 1 < bounds.size(); ++r) {
      const int t0 = bounds[r] + step * tile;
      if (t0 >= bounds[r + 1]) continue;
      if (share) streams[r].RaiseLowerBound(shared);
      streams[r].Push(s.data() + t0, std::min(tile, bounds[r + 1] - t0), t0);
      shared = std::max(shared, streams[r].LowerBound());
      pushed = true;
    }
    if (!pushed) break;
  }
  const int n = static_cast<int>(s.size());
  std::vector<int> out(static_cast<size_t>(std::min(k, n)), -1);
  EXPECT_EQ(TopKStream::FinishMerged(streams, out.data()), std::min(k, n));
  return out;
}

// FinishMerged over ranges (a decode step's indexer split across threads):
// the reference's selection whatever the split, ties across a range's edge
// to the lower position, ranges shorter than k and empty ones included,
// with and without the streams sharing their lower bounds.
TEST(TopKStream, RangesMergedMatchTheReference) {
  std::mt19937 rng(23);
  int checked = 0;
  for (const char* kind : {"equal", "few_values", "signed_zeros", "ascending", "descending", "neg_inf", "normal",
                           "dense_bin"}) {
    for (int n : {1, 64, 1000, 9000, 40000}) {
      const std::vector<float> s = MakeScores(kind, n, rng);
      for (int k : {1, 7, 64, 2048}) {
        std::vector<int> want(static_cast<size_t>(std::min(k, n)));
        TopKIndicesRef(s.data(), n, std::min(k, n), want.data());
        for (int ranges : {1, 2, 3, 8}) {
          std::vector<int> bounds = {0};
          for (int r = 1; r < ranges; ++r) bounds.push_back(static_cast<int>(static_cast<int64_t>(n) * r / ranges));
          bounds.push_back(n);
          ASSERT_EQ(Merged(s, k, bounds, 4096), want) << kind << " n " << n << " k " << k << " ranges " << ranges;
          ASSERT_EQ(Merged(s, k, bounds, 1000, true), want)
              << kind << " n " << n << " k " << k << " ranges " << ranges << " sharing bounds";
          ++checked;
        }
        // Uneven ranges: one empty, one of a single score, the rest unequal.
        if (n >= 10) {
          const std::vector<int> bounds = {0, 0, 1, n / 7, n / 2, n};
          ASSERT_EQ(Merged(s, k, bounds, 333), want) << kind << " n " << n << " k " << k << " uneven";
          ASSERT_EQ(Merged(s, k, bounds, 333, true), want) << kind << " n " << n << " k " << k << " uneven, sharing";
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 150);
}

// The indexer's shape: k 2048 over tens of thousands of keys in tiles.
TEST(TopKStream, MatchesTheReferenceAtTheIndexersShape) {
  std::mt19937 rng(5);
  for (const char* kind : {"normal", "few_values", "ascending", "descending", "neg_inf", "outlier", "dense_bin"}) {
    for (const int n : {20000, 40000}) {  // the binned selection, then the streamed one
      const int k = 2048;
      const std::vector<float> s = MakeScores(kind, n, rng);
      std::vector<int> want(static_cast<size_t>(k));
      TopKIndicesRef(s.data(), n, k, want.data());
      for (int tile : {4096, 7777, n}) EXPECT_EQ(Streamed(s, k, tile), want) << kind << " tile " << tile;
      std::vector<int> fast(static_cast<size_t>(k));
      TopKIndices(s.data(), n, k, fast.data());
      EXPECT_EQ(fast, want) << kind;
      std::vector<int> streamed(static_cast<size_t>(k));
      TopKIndicesStreamed(s.data(), n, k, streamed.data());  // with the group-maxima bound
      EXPECT_EQ(streamed, want) << kind;
    }
  }
}

// The binned selection: the reference's, bit for bit, wherever it accepts
// the scores; it refuses (false, out untouched) exactly when a score is
// infinite or the range overflows. KthLargestBinned is the k-th score of
// the reference's selection.
TEST(TopKBinned, MatchesTheReferenceOrRefuses) {
  std::mt19937 rng(23);
  int matched = 0, refused = 0;
  for (const char* kind : {"equal", "few_values", "signed_zeros", "ascending", "descending", "neg_inf", "all_neg_inf",
                           "saw", "normal", "outlier", "dense_bin"}) {
    for (int n : {2, 5, 17, 63, 300, 1000, 5003, 40000}) {
      const std::vector<float> s = MakeScores(kind, n, rng);
      bool finite = true;
      for (float v : s) finite = finite && std::isfinite(v);
      for (int k : {1, 2, 7, 64, 100, 2048, n / 2 + 1, n - 1}) {
        if (k < 1 || k >= n) continue;
        std::vector<int> want(static_cast<size_t>(k));
        TopKIndicesRef(s.data(), n, k, want.data());
        std::vector<int> got(static_cast<size_t>(k), -7);
        const bool ok = TopKIndicesBinned(s.data(), n, k, got.data());
        float kth = -7.0f;
        const bool kth_ok = KthLargestBinned(s.data(), n, k, &kth);
        ASSERT_EQ(ok, finite) << kind << " n " << n << " k " << k;
        ASSERT_EQ(kth_ok, finite) << kind << " n " << n << " k " << k;
        if (!ok) {
          EXPECT_EQ(got, std::vector<int>(static_cast<size_t>(k), -7)) << "a refusal writes nothing";
          EXPECT_EQ(kth, -7.0f);
          ++refused;
          continue;
        }
        ASSERT_EQ(got, want) << kind << " n " << n << " k " << k;
        float want_kth = s[static_cast<size_t>(want[0])];
        for (int i : want) want_kth = std::min(want_kth, s[static_cast<size_t>(i)]);
        EXPECT_EQ(kth, want_kth) << kind << " n " << n << " k " << k;
        ++matched;
      }
    }
  }
  EXPECT_GT(matched, 300);
  EXPECT_GT(refused, 10);
}

// A range that overflows a float (-3e38 .. 3e38) gives no finite bins: refused.
TEST(TopKBinned, RefusesARangeThatOverflows) {
  std::vector<float> s = {-3e38f, 1.0f, 3e38f, 2.0f, 0.5f};
  std::vector<int> out(2, -1);
  EXPECT_FALSE(TopKIndicesBinned(s.data(), 5, 2, out.data()));
  std::vector<int> want(2);
  TopKIndices(s.data(), 5, 2, want.data());  // the dispatcher falls back
  EXPECT_EQ(want, (std::vector<int>{2, 3}));
}

// A tie at the threshold must go to the earlier position: scores equal to
// the k-th best arriving later never displace it, earlier ones always win.
TEST(TopKStream, ALaterEqualScoreLosesTheTie) {
  const int k = 4;
  std::vector<float> s = {5, 1, 1, 1, 1, 1, 1, 9, 1, 1};  // best 4: 7 (9), 0 (5), then the first two 1s
  EXPECT_EQ(Streamed(s, k, 3), (std::vector<int>{0, 1, 2, 7}));
  EXPECT_EQ(Streamed(s, k, 1), (std::vector<int>{0, 1, 2, 7}));
  std::vector<float> z = {-0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f};  // -0 and +0 tie
  EXPECT_EQ(Streamed(z, k, 2), (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace moeserve::kernels
