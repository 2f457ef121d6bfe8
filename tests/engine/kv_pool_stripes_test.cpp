// KvPool stripes: each part of the per-token floats in a region of its own,
// block after block, so that one part of consecutive blocks is one stream;
// the same part rows, and the same bytes in and out of a block, as the
// one-stripe pool.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

constexpr int kBlocks = 5, kBlockTokens = 4;
constexpr size_t kFloats = 10;
// Three parts: a 6-float latent, a 3-float key, a 1-float tail.
struct Part {
  size_t offset, floats;
};
constexpr Part kParts[] = {{0, 6}, {6, 3}, {9, 1}};

// Writes a value unique to (block, slot, part, float) through PartRow.
void Fill(KvPool& pool) {
  for (int b = 0; b < kBlocks; ++b)
    for (int s = 0; s < kBlockTokens; ++s)
      for (const Part& p : kParts)
        for (size_t f = 0; f < p.floats; ++f)
          pool.PartRow(b, s, p.offset, p.floats)[f] = static_cast<float>(1000 * b + 100 * s + 10 * p.offset + f);
}

TEST(KvPoolStripes, PartRowsAndBlockBytesMatchTheOneStripePool) {
  KvPool plain(kBlocks, kBlockTokens, kFloats);
  KvPool striped(kBlocks, kBlockTokens, kFloats, {0, 6, 9});
  ASSERT_EQ(plain.num_stripes(), 1u);
  ASSERT_EQ(striped.num_stripes(), 3u);
  Fill(plain);
  Fill(striped);
  std::vector<float> out(striped.block_floats());
  for (int b = 0; b < kBlocks; ++b) {
    // A block leaves a striped pool as the one-stripe pool holds it.
    striped.CopyBlockOut(b, out.data());
    EXPECT_EQ(std::memcmp(out.data(), plain.TokenRow(b, 0), out.size() * sizeof(float)), 0) << "block " << b;
  }
  // And comes back in the same way, into another block.
  std::vector<float> in(plain.block_floats());
  std::memcpy(in.data(), plain.TokenRow(3, 0), in.size() * sizeof(float));
  striped.CopyBlockIn(0, in.data());
  striped.CopyBlock(1, 0);
  for (int s = 0; s < kBlockTokens; ++s)
    for (const Part& p : kParts)
      for (size_t f = 0; f < p.floats; ++f) {
        const float want = static_cast<float>(3000 + 100 * s + 10 * p.offset + f);
        EXPECT_EQ(striped.PartRow(0, s, p.offset, p.floats)[f], want);
        EXPECT_EQ(striped.PartRow(1, s, p.offset, p.floats)[f], want);
      }
  // The other blocks are untouched.
  EXPECT_EQ(striped.PartRow(2, 0, 6, 3)[0], 2060.0f);
}

TEST(KvPoolStripes, OnePartOfConsecutiveBlocksIsOneStream) {
  KvPool plain(kBlocks, kBlockTokens, kFloats);
  KvPool striped(kBlocks, kBlockTokens, kFloats, {0, 6, 9});
  for (const Part& p : kParts)
    for (int b = 0; b + 1 < kBlocks; ++b) {
      EXPECT_EQ(striped.PartRow(b + 1, 0, p.offset, p.floats), striped.PartRow(b, 0, p.offset, p.floats) + kBlockTokens * p.floats);
      EXPECT_EQ(plain.PartRow(b + 1, 0, p.offset, p.floats), plain.PartRow(b, 0, p.offset, p.floats) + kBlockTokens * kFloats);
    }
}

TEST(KvPoolStripes, BadStripesAreRefused) {
  for (const std::vector<size_t>& starts : std::vector<std::vector<size_t>>{{1}, {0, 5, 5}, {0, 7, 6}, {0, 10}, {0, 11}})
    EXPECT_THROW(KvPool(kBlocks, kBlockTokens, kFloats, starts), std::invalid_argument) << starts.back();
}

// The moe-dsa-v1 graph gives a stripe for each layer's latent rows and each
// DSA layer's indexer keys.
TEST(KvPoolStripes, TheModelStripesEachCachePart) {
  auto dir = OpenModelDir(testing_util::TinyModel());
  ASSERT_TRUE(dir) << dir.error().ToString();
  auto model = Model::Load(*dir);
  ASSERT_TRUE(model) << model.error().ToString();
  const ModelConfig& c = (*model)->config();
  const size_t latent = static_cast<size_t>(c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
  std::vector<size_t> want;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerKind kind = c.layer_types[static_cast<size_t>(l)];
    if (kind == LayerKind::kDelta) continue;
    want.push_back((*model)->layer_cache_offset(l));
    if (kind == LayerKind::kDsa) want.push_back((*model)->layer_cache_offset(l) + latent);
  }
  ASSERT_GE(want.size(), 2u);
  EXPECT_EQ((*model)->cache_stripes(), want);
  KvPool pool(4, 16, (*model)->cache_floats_per_token(), (*model)->cache_stripes());
  EXPECT_EQ(pool.num_stripes(), want.size());
}

}  // namespace
}  // namespace moeserve::engine
