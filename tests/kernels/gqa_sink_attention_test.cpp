// gpt-oss attention (GqaSinkAttention: grouped-query heads, a sink logit per
// head, causal or banded key ranges) on every Isa this CPU supports against
// GqaSinkAttentionRef, on paged caches (non-contiguous rows, the layer's keys
// and values at offsets inside each row): one query (decode) and prefill
// blocks with odd sizes, heads per key/value head 1, 3 and 8, head sizes the
// AVX-512 form takes (a multiple of 4) and one it leaves to the plain loops,
// key ranges across several 64-key tiles, scores that grow along the keys
// (the running maxima rescale the sums), and a one-key case computed by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"

namespace moeserve::kernels {
namespace {

struct Case {
  int heads, kv_heads, head_dim;
  int cached;   // positions already in the cache before the queries
  int queries;  // the queries are positions cached .. cached + queries - 1
  int window;   // 0: causal over everything; else the last `window` positions
  float q_scale = 1.0f;
  float ramp = 0.0f;  // keys grow with their position: later scores larger
};

struct Setup {
  std::vector<std::vector<float>> blocks;
  std::vector<const float*> rows;
  std::vector<float> q, sinks;
  std::vector<int> first, last;
  GqaSinkShape shape{};
};

// Cache rows of `width` floats in blocks of 16, visited in shuffled block order.
Setup Make(const Case& c, std::mt19937& rng) {
  Setup s;
  const int kvd = c.kv_heads * c.head_dim, n = c.cached + c.queries;
  const size_t key_off = 3, value_off = key_off + static_cast<size_t>(kvd) + 5;
  const int width = static_cast<int>(value_off) + kvd + 2;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int nb = (n + 15) / 16;
  std::vector<int> order(static_cast<size_t>(nb));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  s.blocks.resize(static_cast<size_t>(nb));
  for (auto& b : s.blocks) {
    b.resize(16u * static_cast<size_t>(width));
    for (auto& x : b) x = nd(rng);
  }
  for (int i = 0; i < n; ++i) {
    float* row = &s.blocks[static_cast<size_t>(order[static_cast<size_t>(i / 16)])][static_cast<size_t>(i % 16) * width];
    for (int e = 0; e < kvd; ++e) row[key_off + static_cast<size_t>(e)] += c.ramp * static_cast<float>(i) / n;
    s.rows.push_back(row);
  }
  s.q.resize(static_cast<size_t>(c.queries) * c.heads * c.head_dim);
  for (auto& x : s.q) x = nd(rng) * c.q_scale;
  // With a ramp, the queries point along it: the newest keys score highest.
  if (c.ramp != 0)
    for (auto& x : s.q) x = std::fabs(x);
  s.sinks.resize(static_cast<size_t>(c.heads));
  for (auto& x : s.sinks) x = nd(rng) * 2.0f;
  for (int i = 0; i < c.queries; ++i) {
    const int pos = c.cached + i;
    s.last.push_back(pos);
    s.first.push_back(c.window > 0 ? std::max(0, pos - c.window + 1) : 0);
  }
  s.shape = GqaSinkShape{c.heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                         s.sinks.data(), key_off, value_off};
  return s;
}

void Check(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const Setup s = Make(c, rng);
  const size_t out_n = s.q.size();
  std::vector<float> want(out_n);
  GqaSinkAttentionRef(s.shape, c.queries, s.q.data(), s.rows.data(), s.first.data(), s.last.data(), want.data());
  double mx = 0;
  for (float v : want) mx = std::max(mx, std::fabs(static_cast<double>(v)));
  ASSERT_GT(mx, 0.0);
  for (Isa isa : SupportedIsas()) {
    std::vector<float> got(out_n, std::nanf(""));
    GqaSinkAttention(s.shape, c.queries, s.q.data(), s.rows.data(), s.first.data(), s.last.data(), got.data(), isa);
    double diff = 0;
    for (size_t i = 0; i < out_n; ++i) {
      const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
      diff = std::isnan(d) ? INFINITY : std::max(diff, d);  // an unwritten (NaN) output must fail
    }
    EXPECT_LE(diff, 2e-5 * mx) << IsaName(isa) << ": heads " << c.heads << "/" << c.kv_heads << " d " << c.head_dim
                               << " cached " << c.cached << " queries " << c.queries << " window " << c.window
                               << ": max diff " << diff << " of " << mx;
  }
}

TEST(GqaSinkAttention, GptOssShapesCausalAndBanded) {
  // gpt-oss's heads: 64 query heads over 8 key/value heads of 64.
  Check({64, 8, 64, 0, 1, 0}, 1);       // the first token: its own key only
  Check({64, 8, 64, 300, 1, 0}, 2);     // decode over 301 keys
  Check({64, 8, 64, 300, 1, 128}, 3);   // decode, banded
  Check({64, 8, 64, 0, 77, 0}, 4);      // a first chunk: blocks of 16 queries and a tail
  Check({64, 8, 64, 150, 70, 0}, 5);    // a later chunk
  Check({64, 8, 64, 150, 70, 128}, 6);  // banded: ranges start inside tiles
  Check({64, 8, 64, 0, 200, 128}, 7);   // banded from the start
}

TEST(GqaSinkAttention, OddShapes) {
  Check({6, 2, 12, 5, 19, 0}, 11);   // 3 heads a group: lanes padded
  Check({6, 2, 12, 40, 33, 7}, 12);  // a narrow band
  Check({3, 3, 8, 70, 300, 0}, 13);  // one head a group: blocks of 128 queries and a tail
  Check({4, 1, 10, 20, 9, 0}, 14);   // head size not a multiple of 4: the plain loops
  Check({4, 2, 16, 0, 3, 1}, 15);    // window 1: each query its own key only
  Check({8, 1, 4, 130, 5, 64}, 16);  // 8 heads a group, tiny heads
}

TEST(GqaSinkAttention, GrowingScoresRescale) {
  // The largest scores come last, far above the sink and the first tiles'
  // maxima: every tile raises the running maximum.
  Check({16, 2, 64, 400, 20, 0, 3.0f, 8.0f}, 21);
  Check({16, 2, 64, 400, 20, 128, 3.0f, 8.0f}, 22);
  // Scores far below the sinks: the sinks take almost all the weight.
  Check({16, 2, 64, 100, 10, 0, 0.01f, 0.0f}, 23);
}

TEST(GqaSinkAttention, OneKeyByHand) {
  // One key, one head: out = v * e^s / (e^s + e^sink), s = scale q . k.
  const int d = 8;
  std::vector<float> row(2 * d), q(d);
  for (int e = 0; e < d; ++e) {
    row[static_cast<size_t>(e)] = 0.25f * static_cast<float>(e + 1);          // key
    row[static_cast<size_t>(d + e)] = static_cast<float>(e) - 3.0f;           // value
    q[static_cast<size_t>(e)] = e % 2 ? 1.0f : -0.5f;
  }
  const float sink = 0.7f, scale = 0.5f;
  float dot = 0;
  for (int e = 0; e < d; ++e) dot += q[static_cast<size_t>(e)] * row[static_cast<size_t>(e)];
  const double s = static_cast<double>(scale) * dot;
  const double p = std::exp(s) / (std::exp(s) + std::exp(static_cast<double>(sink)));
  const float* rows[1] = {row.data()};
  const int first = 0, last = 0;
  const GqaSinkShape shape{1, 1, d, scale, &sink, 0, static_cast<size_t>(d)};
  std::vector<Isa> isas = SupportedIsas();
  for (Isa isa : isas) {
    std::vector<float> out(d, std::nanf(""));
    GqaSinkAttention(shape, 1, q.data(), rows, &first, &last, out.data(), isa);
    for (int e = 0; e < d; ++e)
      EXPECT_NEAR(out[static_cast<size_t>(e)], p * row[static_cast<size_t>(d + e)], 1e-6) << IsaName(isa) << " e " << e;
  }
  std::vector<float> ref(d);
  GqaSinkAttentionRef(shape, 1, q.data(), rows, &first, &last, ref.data());
  for (int e = 0; e < d; ++e) EXPECT_NEAR(ref[static_cast<size_t>(e)], p * row[static_cast<size_t>(d + e)], 1e-6);
}

}  // namespace
}  // namespace moeserve::kernels
