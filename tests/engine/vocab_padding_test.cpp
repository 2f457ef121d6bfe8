// A config vocab_size larger than tokenizer.json's ids: real checkpoints pad
// the embedding (to a multiple of 64 or 128), so the model directory opens,
// the extra ids are padding, and sampling never returns one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "moeserve/engine/sampler.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

// The tiny preset (vocab_size 384) with a tokenizer.json of only `ids` ids.
std::string ModelWithTokenizerOf(int ids, const std::string& tag) {
  std::string dir = testing_util::TempPath("vocab_pad_" + tag);
  std::filesystem::remove_all(dir);
  ModelGenOptions o;
  o.config = *PresetConfig("tiny");
  o.seed = 1;
  auto st = GenerateModel(o, dir);
  EXPECT_TRUE(st) << st.error().ToString();
  std::ofstream(dir + "/tokenizer.json") << Tokenizer::Builtin(ids).ToJson();
  return dir;
}

TEST(VocabPadding, ConfigVocabAboveTheTokenizerOpens) {
  ASSERT_EQ(PresetConfig("tiny")->vocab_size, 384);
  auto m = OpenModelDir(ModelWithTokenizerOf(300, "300"));
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->tokenizer.vocab_size(), 384);
  for (int id = 300; id < 384; ++id) EXPECT_TRUE(m->tokenizer.IsPadding(id)) << id;
  EXPECT_FALSE(m->tokenizer.ValidateInput(std::vector<int>{'a', 350}).has_value());
}

TEST(VocabPadding, TokenizerWithMoreIdsThanTheConfigIsRefused) {
  auto m = OpenModelDir(ModelWithTokenizerOf(400, "400"));
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message().find("config.json vocab_size is only 384"), std::string::npos) << m.error().message();
}

TEST(VocabPadding, PaddingIdsAreNeverSampled) {
  // Padding rows hold the largest logits: greedy and sampling must still skip them.
  std::vector<float> logits(384, 0.0f);
  for (int id = 300; id < 384; ++id) logits[static_cast<size_t>(id)] = 50.0f;
  logits[7] = 1.0f;
  std::mt19937_64 rng(1);
  for (float temperature : {0.0f, 1.0f, 5.0f}) {
    for (int draw = 0; draw < 50; ++draw) {
      std::vector<float> row = logits;
      MaskPadding(row);
      SamplingParams params;
      params.temperature = temperature;
      int id = SampleToken(row, params, rng);
      ASSERT_GE(id, 0);
      ASSERT_LT(id, tok::kFirstPadding) << "temperature " << temperature;
    }
  }
}

}  // namespace
}  // namespace moeserve::engine
