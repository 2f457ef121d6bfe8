// The int8 DSA indexer scores (indexer_int8.hpp): the quantisers' codes and
// scales, the integer dot products against a plain int64 sum of the codes,
// every variant of indexer_scores_int8 bit-identical to the reference on
// paged caches (head counts and key counts off the AVX-512 variant's 8 heads
// and 32-key blocks and the AVX2 one's 4 and 16, several queries with their
// own causal lengths), and the int8 scores close to the fp32 scores of the
// same vectors.
#include "moeserve/kernels/indexer_int8.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "each_variant.hpp"
#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"

namespace moeserve::kernels {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// n keys of dim, each quantised into a row of `width` floats at offset 3, the
// rows in blocks of 16 visited in shuffled order; keys_f32 keeps the fp32
// keys in rows of their own for the fp32 scores.
struct Int8Cache {
  std::vector<std::vector<float>> blocks;
  std::vector<const float*> rows;
  std::vector<float> keys_f32;
  std::vector<const float*> f32_rows;
  static constexpr size_t kOffset = 3;
  Int8Cache(int n, int dim, std::mt19937& rng) {
    const size_t width = kOffset + IndexerInt8KeyFloats(dim) + 2;
    const int nb = (n + 15) / 16;
    std::vector<int> order(static_cast<size_t>(nb));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    blocks.assign(static_cast<size_t>(nb), std::vector<float>(16 * width, -1.0f));
    keys_f32 = Random(static_cast<size_t>(n) * dim, rng);
    for (int i = 0; i < n; ++i) {
      float* row = &blocks[static_cast<size_t>(order[i / 16])][static_cast<size_t>(i % 16) * width];
      QuantizeIndexerKeyInt8(&keys_f32[static_cast<size_t>(i) * dim], dim, row + kOffset);
      rows.push_back(row);
    }
    for (int i = 0; i < n; ++i) f32_rows.push_back(&keys_f32[static_cast<size_t>(i) * dim]);
  }
};

struct Int8Queries {
  std::vector<int8_t> codes;
  std::vector<float> wt;
  std::vector<int32_t> offset;
  IndexerInt8Query view() const { return {codes.data(), wt.data(), offset.data()}; }
  Int8Queries(const std::vector<float>& q, const std::vector<float>& w, int queries, int heads, int dim)
      : codes(static_cast<size_t>(queries) * heads * dim), wt(static_cast<size_t>(queries) * heads), offset(wt.size()) {
    for (int b = 0; b < queries; ++b) {
      const size_t qh = static_cast<size_t>(b) * heads;
      QuantizeIndexerQueryInt8(&q[qh * dim], &w[qh], heads, dim, &codes[qh * dim], &wt[qh], &offset[qh]);
    }
  }
};

TEST(IndexerInt8, QuantisersRoundToTheNearestCodeOfASymmetricScale) {
  std::mt19937 rng(11);
  for (int dim : {4, 32, 128}) {
    auto k = Random(static_cast<size_t>(dim), rng);
    k[1] = -3.0f * std::fabs(k[0]) - 4.0f;  // the largest magnitude: code -127
    std::vector<float> row(IndexerInt8KeyFloats(dim)), back(static_cast<size_t>(dim));
    QuantizeIndexerKeyInt8(k.data(), dim, row.data());
    float s;
    std::memcpy(&s, &row[static_cast<size_t>(dim / 4)], sizeof s);
    EXPECT_EQ(s, std::fabs(k[1]) / 127.0f);
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(row.data());
    EXPECT_EQ(bytes[1], 1);  // -127 + 128
    DequantizeIndexerKeyInt8(row.data(), dim, back.data());
    for (int d = 0; d < dim; ++d) {
      EXPECT_GE(bytes[d], 1);
      EXPECT_LE(std::fabs(back[static_cast<size_t>(d)] - k[static_cast<size_t>(d)]), 0.5f * s * 1.0001f) << d;
    }
    // A zero key: scale 0, every code 0 (byte 128): scores 0.
    std::vector<float> zero(static_cast<size_t>(dim), 0.0f);
    QuantizeIndexerKeyInt8(zero.data(), dim, row.data());
    std::memcpy(&s, &row[static_cast<size_t>(dim / 4)], sizeof s);
    EXPECT_EQ(s, 0.0f);
    for (int d = 0; d < dim; ++d) EXPECT_EQ(bytes[d], 128);
  }
  // Queries: the scale folded into the weight, the offset 128 x the codes' sum.
  const int heads = 3, dim = 16;
  auto q = Random(static_cast<size_t>(heads) * dim, rng);
  std::vector<float> w = {0.5f, -2.0f, 1.0f};
  std::vector<int8_t> codes(q.size());
  std::vector<float> wt(heads);
  std::vector<int32_t> off(heads);
  QuantizeIndexerQueryInt8(q.data(), w.data(), heads, dim, codes.data(), wt.data(), off.data());
  for (int h = 0; h < heads; ++h) {
    float amax = 0.0f;
    int32_t sum = 0;
    for (int d = 0; d < dim; ++d) {
      amax = std::max(amax, std::fabs(q[static_cast<size_t>(h * dim + d)]));
      sum += codes[static_cast<size_t>(h * dim + d)];
    }
    EXPECT_EQ(wt[static_cast<size_t>(h)], w[static_cast<size_t>(h)] * (amax / 127.0f));
    for (int d = 0; d < dim; ++d)
      EXPECT_EQ(codes[static_cast<size_t>(h * dim + d)], std::nearbyint(q[static_cast<size_t>(h * dim + d)] / (amax / 127.0f)));
    EXPECT_EQ(off[static_cast<size_t>(h)], 128 * sum);
  }
}

TEST(IndexerInt8, DotIsTheExactProductOfTheCodes) {
  std::mt19937 rng(12);
  for (int dim : {4, 64, 128, 1024}) {
    // Extreme codes too: every key element at the largest magnitude.
    auto k = Random(static_cast<size_t>(dim), rng);
    for (int d = 0; d < dim; d += 3) k[static_cast<size_t>(d)] = d % 2 ? 1.0f : -1.0f;
    auto q = Random(static_cast<size_t>(dim), rng);
    std::vector<float> row(IndexerInt8KeyFloats(dim));
    QuantizeIndexerKeyInt8(k.data(), dim, row.data());
    std::vector<int8_t> codes(static_cast<size_t>(dim));
    float wt;
    int32_t off;
    const float one = 1.0f;
    QuantizeIndexerQueryInt8(q.data(), &one, 1, dim, codes.data(), &wt, &off);
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(row.data());
    int64_t want = 0;
    for (int d = 0; d < dim; ++d) want += static_cast<int64_t>(static_cast<int>(bytes[d]) - 128) * codes[static_cast<size_t>(d)];
    EXPECT_EQ(IndexerInt8Dot(codes.data(), off, row.data(), dim), want) << dim;
  }
}

// Random queries over the cache's keys (query b sees n0 + b of them) and
// the row form reference's scores, -7 past each query's keys.
struct ReferenceRun {
  Int8Queries iq;
  std::vector<int> n;
  size_t ld;
  std::vector<float> ref;
  ReferenceRun(const Int8Cache& cache, int queries, int heads, int dim, int n0, std::mt19937& rng)
      : iq(Random(static_cast<size_t>(queries) * heads * dim, rng), Random(static_cast<size_t>(queries) * heads, rng),
           queries, heads, dim),
        n(static_cast<size_t>(queries)),
        ld(static_cast<size_t>(n0 + queries - 1) + 3),
        ref(static_cast<size_t>(queries) * ld, -7.0f) {
    for (int b = 0; b < queries; ++b) n[static_cast<size_t>(b)] = n0 + b;
    IndexerScoresInt8Ref(iq.view(), queries, heads, dim, cache.rows.data(), Int8Cache::kOffset, n.data(), ref.data(), ld);
  }
};

TEST(IndexerInt8, EveryVariantMatchesTheReferenceBitForBit) {
  std::mt19937 rng(13);
  // queries, heads, dim, keys of the first query (each next query one more).
  for (auto [queries, heads, dim, n0] : {std::tuple{1, 64, 128, 5000}, std::tuple{1, 4, 32, 1}, std::tuple{3, 9, 36, 77},
                                         std::tuple{16, 8, 64, 2049}, std::tuple{5, 3, 4, 31}, std::tuple{2, 13, 128, 33},
                                         std::tuple{1, 1, 1024, 40}}) {
    SCOPED_TRACE("queries " + std::to_string(queries) + ", heads " + std::to_string(heads) + ", dim " +
                 std::to_string(dim) + ", keys " + std::to_string(n0));
    const int n_max = n0 + queries - 1;
    Int8Cache cache(n_max, dim, rng);
    const ReferenceRun run(cache, queries, heads, dim, n0, rng);
    const Int8Queries& iq = run.iq;
    const std::vector<int>& n = run.n;
    const size_t ld = run.ld;
    const std::vector<float>& ref = run.ref;
    // The reference is the stated expression: integer dots, ReLU, the
    // heads' fmas in order, the key's scale last.
    for (int b = 0; b < queries; ++b)
      for (int s : {0, n[static_cast<size_t>(b)] - 1}) {
        const float* key = cache.rows[static_cast<size_t>(s)] + Int8Cache::kOffset;
        float I = 0.0f;
        for (int h = 0; h < heads; ++h) {
          const size_t g = static_cast<size_t>(b) * heads + static_cast<size_t>(h);
          const int32_t dot = IndexerInt8Dot(&iq.codes[g * dim], iq.offset[g], key, dim);
          I = std::fma(iq.wt[g], static_cast<float>(std::max(dot, 0)), I);
        }
        float scale;
        std::memcpy(&scale, key + dim / 4, sizeof scale);
        EXPECT_EQ(ref[static_cast<size_t>(b) * ld + static_cast<size_t>(s)], I * scale) << b << " " << s;
      }
    ForEachVariant("indexer_scores_int8", [&](const KernelSet& k) {
      SCOPED_TRACE(k.indexer_scores_int8.name);
      std::vector<float> got(ref.size(), -7.0f);
      k.indexer_scores_int8(iq.view(), queries, heads, dim, cache.rows.data(), Int8Cache::kOffset, n.data(), got.data(), ld);
      int differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &ref[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0) << "scores not bit-identical to the reference (past each query's keys: untouched -7)";
    });
  }
}

// The same keys stored by blocks (indexer_int8.hpp's second layout, the
// engine pool's): every blocked variant gives the row form reference's
// scores bit for bit, for block sizes on and off the VNNI kernel's 16-key
// vectors, key counts that end mid-block, blocks visited out of order, and
// several queries with their own lengths.
TEST(IndexerInt8, BlockedKeysScoreAsTheRowsDoInEveryVariant) {
  std::mt19937 rng(29);
  for (auto [queries, heads, dim, n0, block_keys] :
       {std::tuple{1, 64, 128, 3000, 16}, std::tuple{1, 4, 32, 1, 16}, std::tuple{3, 9, 36, 77, 16},
        std::tuple{2, 4, 32, 1000, 32}, std::tuple{5, 3, 4, 31, 5}, std::tuple{2, 13, 128, 200, 1},
        std::tuple{4, 8, 64, 517, 48}, std::tuple{1, 1, 1024, 40, 16}}) {
    SCOPED_TRACE("queries " + std::to_string(queries) + ", heads " + std::to_string(heads) + ", dim " +
                 std::to_string(dim) + ", keys " + std::to_string(n0) + ", block " + std::to_string(block_keys));
    const int n_max = n0 + queries - 1;
    Int8Cache cache(n_max, dim, rng);
    // The blocks in shuffled order, each filled from the fp32 keys, with
    // slots past the last key left as noise (-1 bits).
    const int nb = (n_max + block_keys - 1) / block_keys;
    const size_t block_floats = IndexerInt8KeyFloats(dim) * static_cast<size_t>(block_keys);
    std::vector<float> storage(static_cast<size_t>(nb) * block_floats + 16, -1.0f);
    std::vector<int> order(static_cast<size_t>(nb));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<const float*> blocks(static_cast<size_t>(nb));
    for (int b = 0; b < nb; ++b) blocks[static_cast<size_t>(b)] = &storage[static_cast<size_t>(order[b]) * block_floats];
    std::vector<float> back(IndexerInt8KeyFloats(dim));
    for (int s = 0; s < n_max; ++s) {
      float* block = const_cast<float*>(blocks[static_cast<size_t>(s / block_keys)]);
      StoreIndexerKeyInt8Blocked(&cache.keys_f32[static_cast<size_t>(s) * dim], dim, block, block_keys, s % block_keys);
      LoadIndexerKeyInt8Blocked(block, dim, block_keys, s % block_keys, back.data());
      ASSERT_EQ(std::memcmp(back.data(), cache.rows[static_cast<size_t>(s)] + Int8Cache::kOffset, back.size() * 4), 0)
          << "key " << s << " does not read back as its row form";
    }
    const ReferenceRun run(cache, queries, heads, dim, n0, rng);
    const Int8Queries& iq = run.iq;
    const std::vector<int>& n = run.n;
    const size_t ld = run.ld;
    const std::vector<float>& ref = run.ref;
    std::vector<float> blocked_ref(ref.size(), -7.0f);
    IndexerScoresInt8BlockedRef(iq.view(), queries, heads, dim, blocks.data(), block_keys, n.data(), blocked_ref.data(), ld);
    EXPECT_EQ(std::memcmp(blocked_ref.data(), ref.data(), ref.size() * sizeof(float)), 0);
    ForEachVariant("indexer_scores_int8_blocked", [&](const KernelSet& k) {
      SCOPED_TRACE(k.indexer_scores_int8_blocked.name);
      std::vector<float> got(ref.size(), -7.0f);
      k.indexer_scores_int8_blocked(iq.view(), queries, heads, dim, blocks.data(), block_keys, n.data(), got.data(), ld);
      int differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &ref[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0) << "scores not bit-identical to the row form's reference (past each query's keys: untouched -7)";
    });
  }
}

TEST(IndexerInt8, ScoresAreCloseToTheFp32ScoresOfTheSameVectors) {
  std::mt19937 rng(14);
  const int heads = 16, dim = 128, n = 3000;
  Int8Cache cache(n, dim, rng);
  auto q = Random(static_cast<size_t>(heads) * dim, rng);
  auto w = Random(static_cast<size_t>(heads), rng);
  Int8Queries iq(q, w, 1, heads, dim);
  std::vector<float> exact(static_cast<size_t>(n)), got(exact.size());
  IndexerScoresRef(q.data(), w.data(), heads, dim, cache.f32_rows.data(), 0, n, exact.data());
  IndexerScoresInt8Ref(iq.view(), 1, heads, dim, cache.rows.data(), Int8Cache::kOffset, &n, got.data(), exact.size());
  // Each element within half a step of its scale, so a head's dot within
  // about sqrt(dim) x (|q| step + |k| step) of its exact value: a few
  // percent of the scores' spread. Measured: 0.0088 of max|score|; bound 0.03.
  double mx = 0, diff = 0;
  for (int s = 0; s < n; ++s) {
    mx = std::max(mx, std::fabs(static_cast<double>(exact[static_cast<size_t>(s)])));
    diff = std::max(diff, std::fabs(static_cast<double>(exact[static_cast<size_t>(s)]) - got[static_cast<size_t>(s)]));
  }
  ASSERT_GT(mx, 0.0);
  EXPECT_LE(diff, 0.03 * mx) << "max diff " << diff << " of " << mx;
  std::printf("int8 scores against fp32: max diff %.4g of max|score| %.4g (%.4f)\n", diff, mx, diff / mx);
}

}  // namespace
}  // namespace moeserve::kernels
