// The DSA indexer scored in tiles of keys (ModelOptions::indexer_tile_keys,
// each row's running top-k kept between tiles) selects the same keys as one
// pass over every cached key, so a prefill's logits are the same bits:
// checked on the tiny model with top-32 selection over a 300-token prompt,
// batched and deterministic, with tiles smaller than, equal to and not a
// multiple of the top-k, with fp32 and int8 scores. Deterministic rows are
// one query each, as a decode step: from two tiles of keys on, their keys
// are scored in ranges, each with its own top-k, merged after.
#include <cstring>

#include "moeserve/engine/model.hpp"
#include "selection_run.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

// Two segments of the prompt: the second's rows see the first's keys
// through the cache as a later prefill chunk does.
SelectionRun Prefill(const ModelDir& dir, bool deterministic, IndexerScores scores, int tile_keys,
                     const std::vector<int>& prompt) {
  ModelOptions mo;
  mo.deterministic = deterministic;
  mo.indexer_scores = scores;
  mo.indexer_tile_keys = tile_keys;
  const size_t half = prompt.size() / 2;
  return ForwardInParts(dir, mo, prompt, {half, prompt.size() - half});
}

void ExpectTilesChangeNothing(bool deterministic, IndexerScores scores) {
  constexpr int kTopK = 32;
  auto dir = OpenModelDir(TinyModel(1, kTopK));
  ASSERT_TRUE(dir) << dir.error().ToString();
  const std::vector<int> prompt = TestPrompt(300);
  const SelectionRun whole = Prefill(*dir, deterministic, scores, 1 << 30, prompt);
  ASSERT_EQ(whole.logits.size(), prompt.size() * static_cast<size_t>(dir->config.vocab_size));
  // The selections are sparse past position 32: every such row picks 32 of
  // its keys, so the tiles below really merge top-k lists.
  size_t sparse_rows = 0;
  for (const auto& [layer, rows] : whole.selected)
    for (const auto& keys : rows) sparse_rows += keys.size() == kTopK;
  EXPECT_GE(sparse_rows, 2 * (prompt.size() - kTopK));
  for (int tile : {7, 32, 33, 96, 256}) {
    const SelectionRun tiled = Prefill(*dir, deterministic, scores, tile, prompt);
    ASSERT_EQ(tiled.logits.size(), whole.logits.size()) << "tile " << tile;
    EXPECT_EQ(std::memcmp(tiled.logits.data(), whole.logits.data(), whole.logits.size() * sizeof(float)), 0)
        << "tile " << tile << ": logits differ";
    EXPECT_TRUE(tiled.selected == whole.selected) << "tile " << tile << ": selections differ";
  }
}

TEST(IndexerTiles, BatchedPrefillSelectsTheSameKeys) { ExpectTilesChangeNothing(false, IndexerScores::kExact); }

TEST(IndexerTiles, DeterministicPrefillSelectsTheSameKeys) { ExpectTilesChangeNothing(true, IndexerScores::kExact); }

TEST(IndexerTiles, BatchedPrefillSelectsTheSameKeysWithInt8Scores) {
  ExpectTilesChangeNothing(false, IndexerScores::kInt8);
}

TEST(IndexerTiles, DeterministicPrefillSelectsTheSameKeysWithInt8Scores) {
  ExpectTilesChangeNothing(true, IndexerScores::kInt8);
}

}  // namespace
}  // namespace moeserve::engine
