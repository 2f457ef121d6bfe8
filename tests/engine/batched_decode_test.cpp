// A batched decode step gives each sequence the bits it gets alone, without
// the deterministic option: up to kSmallBatchMaxRows (64) rows, every
// product runs kernels whose result for a row does not depend on the rows
// beside it (the MXFP4 and BF16 row tiles, and on AVX-512 the F32 ones),
// attention and the DeltaNet state update run per sequence, and routing is
// per token. A target sequence, prefilled alone, decodes greedily alone and
// then beside 7 and 40 other sequences (each prefilled in its own pass, so
// only the decode steps are shared): its logits must be the same bits at
// every step. Past 64 rows the products switch to the GEMMs, whose sums
// depend on the batch: a control with 70 others shows the comparison can
// fail. (Before the row tiles this test failed at 41 sequences.)
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

constexpr int kPrompt = 24, kDecode = 5;

int Argmax(const float* row, int V) {
  int best = 0;
  for (int v = 1; v < V; ++v)
    if (row[v] > row[best]) best = v;
  return best;
}

// The target's logits at each of kDecode greedy decode steps, `others`
// sequences decoding beside it (the target in the middle of each step).
std::vector<float> DecodeLogits(const Model& m, int others) {
  const int V = m.config().vocab_size;
  KvPool pool(1024, 16, m.cache_floats_per_token());
  std::vector<SequenceCache> caches;
  std::vector<std::vector<int>> feed;
  for (int i = 0; i <= others; ++i) {
    caches.push_back(m.NewSequence());
    // Sequence 0 is the target; the others' prompts differ in length and content.
    feed.push_back(i == 0 ? TestPrompt(kPrompt, 9) : TestPrompt(3 + 2 * i, 200 + static_cast<uint64_t>(i)));
  }
  std::vector<float> logits, out;
  // Prefill: each sequence in a pass of its own.
  for (int i = 0; i <= others; ++i) {
    SequenceCache& c = caches[static_cast<size_t>(i)];
    EXPECT_TRUE(EnsureBlocks(pool, c, static_cast<int64_t>(feed[static_cast<size_t>(i)].size())));
    ForwardSegment seg{&c, std::span<const int>(feed[static_cast<size_t>(i)]), false};
    auto st = m.Forward(pool, std::span(&seg, 1), &logits);
    EXPECT_TRUE(st) << st.error().ToString();
    feed[static_cast<size_t>(i)].assign(1, Argmax(logits.data(), V));
  }
  std::vector<int> order;  // segment order; 0 is the target
  for (int i = 1; i <= others; ++i) order.push_back(i);
  order.insert(order.begin() + others / 2, 0);
  for (int step = 0; step < kDecode; ++step) {
    std::vector<ForwardSegment> segs;
    for (const int i : order) {
      SequenceCache& c = caches[static_cast<size_t>(i)];
      EXPECT_TRUE(EnsureBlocks(pool, c, c.length + 1));
      segs.push_back({&c, std::span<const int>(feed[static_cast<size_t>(i)]), false});
    }
    auto st = m.Forward(pool, segs, &logits);
    EXPECT_TRUE(st) << st.error().ToString();
    for (size_t s = 0; s < order.size(); ++s) {
      const float* row = &logits[s * static_cast<size_t>(V)];
      feed[static_cast<size_t>(order[s])].assign(1, Argmax(row, V));
      if (order[s] == 0) out.insert(out.end(), row, row + V);
    }
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<Model> Load(ExpertFormat experts) {
  auto d = OpenModelDir(TinyModel(1, 16, experts));  // sparse DSA selection past 16 tokens
  EXPECT_TRUE(d) << d.error().ToString();
  auto m = Model::Load(*d, ModelOptions{});
  EXPECT_TRUE(m) << m.error().ToString();
  return std::move(*m);
}

void ExpectBatchInvariantDecode(ExpertFormat experts) {
  // The row tiles come with the AVX-512 row's fp32 building block, which
  // the amx row borrows (engine/ffn.cpp asks the same way).
  const bool row_tiles =
      kernels::IsaSupported(kernels::Isa::kAvx512) &&
      kernels::Kernels(kernels::BestIsa()).f32_matmul_cols.fn == kernels::Kernels(kernels::Isa::kAvx512).f32_matmul_cols.fn;
  if (!row_tiles)
    GTEST_SKIP() << "the F32 row tiles are AVX-512 only; this CPU's best kernels are "
                 << kernels::IsaName(kernels::BestIsa());
  auto m = Load(experts);
  const std::vector<float> alone = DecodeLogits(*m, 0);
  ASSERT_EQ(alone.size(), static_cast<size_t>(kDecode) * m->config().vocab_size);
  EXPECT_TRUE(SameBits(DecodeLogits(*m, 7), alone)) << "8 sequences a step";
  EXPECT_TRUE(SameBits(DecodeLogits(*m, 40), alone)) << "41 sequences a step";
  // Control: 71 rows run the GEMMs.
  EXPECT_FALSE(SameBits(DecodeLogits(*m, 70), alone)) << "71 sequences a step (the GEMMs)";
}

TEST(BatchedDecode, EachSequenceGetsTheBitsItGetsAloneMxfp4Experts) { ExpectBatchInvariantDecode(ExpertFormat::kMxfp4); }

TEST(BatchedDecode, EachSequenceGetsTheBitsItGetsAloneBf16Experts) { ExpectBatchInvariantDecode(ExpertFormat::kBf16); }

}  // namespace
}  // namespace moeserve::engine
