// What a forward pass of a prompt selected and produced, for the tests of the
// DSA indexer's variants (tiles, int8 scores): every position's logits and
// each DSA layer's selected keys per row, from a fresh sequence fed the
// prompt in consecutive parts (a later part sees the earlier ones through the
// cache, as a later prefill chunk or a decode step does).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <span>
#include <vector>

#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"

namespace moeserve::engine::testing_util {

struct SelectionRun {
  std::vector<float> logits;
  std::map<int, std::vector<std::vector<int>>> selected;  // layer -> row -> keys
};

// `parts` are the lengths of the consecutive segments; they must add up to
// the prompt's length.
inline SelectionRun ForwardInParts(const ModelDir& dir, const ModelOptions& options, const std::vector<int>& prompt,
                                   const std::vector<size_t>& parts) {
  auto model = Model::Load(dir, options);
  EXPECT_TRUE(model) << model.error().ToString();
  if (!model) return {};
  KvPool pool(64, 16, (*model)->cache_floats_per_token());
  SequenceCache cache = (*model)->NewSequence();
  ForwardTrace trace;
  SelectionRun run;
  EXPECT_TRUE(EnsureBlocks(pool, cache, static_cast<int64_t>(prompt.size())));
  size_t at = 0;
  for (size_t length : parts) {
    EXPECT_LE(at + length, prompt.size());
    if (at + length > prompt.size()) return {};
    ForwardSegment seg{&cache, std::span(prompt).subspan(at, length), true};
    std::vector<float> logits;
    EXPECT_TRUE((*model)->Forward(pool, std::span(&seg, 1), &logits, &trace));
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
    at += length;
  }
  EXPECT_EQ(at, prompt.size()) << "the parts do not cover the prompt";
  run.selected = trace.dsa_selected;
  return run;
}

}  // namespace moeserve::engine::testing_util
