// The vision tower's config keys, the resize rule's token counts and the
// image spans of a prompt (model-format section 14).
#include "moeserve/engine/vision.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "moeserve/engine/model_config.hpp"

namespace moeserve::engine {
namespace {

using nlohmann::json;

json TinyWithVision() {
  auto c = PresetConfig("tiny");
  EXPECT_TRUE(c) << c.error().ToString();
  json j = json::parse(c->ToJson());
  j["vision"] = {{"hidden_size", 64}, {"num_layers", 2}, {"num_heads", 4}, {"intermediate_size", 128}};
  return j;
}

std::string Refusal(const json& j) {
  auto r = ParseModelConfig(j.dump(), "m/config.json");
  if (r) return "";
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  return r.error().message();
}

VisionConfig Qwen2VlLike() {
  VisionConfig v;
  v.hidden_size = 64;
  v.num_heads = 4;
  v.num_layers = 1;
  v.intermediate_size = 128;
  v.projector_hidden_size = 256;
  return v;  // patch 14, merge 2, max_patches 1024: units of 28 pixels, at most 256 tokens
}

TEST(VisionConfig, AbsentMeansNoTower) {
  auto c = PresetConfig("tiny");
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->vision.has_value());
  EXPECT_EQ(json::parse(c->ToJson()).count("vision"), 0u);
}

TEST(VisionConfig, DefaultsAndRoundTrip) {
  auto c = ParseModelConfig(TinyWithVision().dump());
  ASSERT_TRUE(c) << c.error().ToString();
  ASSERT_TRUE(c->vision);
  const VisionConfig& v = *c->vision;
  EXPECT_EQ(v.patch_size, 14);
  EXPECT_EQ(v.merge_size, 2);
  EXPECT_EQ(v.max_patches, 1024);
  EXPECT_EQ(v.projector_hidden_size, 4 * 64);
  EXPECT_EQ(v.image_token_id, 268);
  EXPECT_EQ(v.image_start_token_id, 269);
  EXPECT_EQ(v.image_end_token_id, 270);
  EXPECT_DOUBLE_EQ(v.image_std[1], 0.5);
  auto again = ParseModelConfig(c->ToJson());
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_EQ(again->ToJson(), c->ToJson());
}

TEST(VisionConfig, EachBadFieldIsNamed) {
  struct Case {
    const char* field;
    json value;
    const char* want;
  };
  const Case cases[] = {
      {"num_heads", 3, "vision.num_heads: 3 must divide hidden_size"},
      {"num_heads", 32, "vision.num_heads: the head size hidden_size / num_heads = 2 must be a multiple of 4"},
      {"merge_size", 3, "vision.merge_size: 3 must be 1 or 2"},
      {"max_patches", 2, "vision.max_patches: 2 must be >= merge_size^2"},
      {"patch_size", 0, "vision.patch_size: must be a positive integer"},
      {"patch_size", 65, "vision.patch_size: 65 must be in [1, 64]"},
      {"image_token_id", 12, "vision.image_token_id: 12 must be a padding id in [268, vocab_size 384)"},
      {"image_end_token_id", 384, "vision.image_end_token_id: 384 must be a padding id"},
      {"image_start_token_id", 268, "vision.image_start_token_id: 268 is also image_token_id"},
      {"image_mean", json::array({0.5, 0.5}), "vision.image_mean: must be an array of 3 numbers"},
      {"image_std", json::array({0.5, 0, 0.5}), "vision.image_std[1]: must be a finite number > 0"},
      {"hidden_size", "64", "vision.hidden_size: must be an integer"},
  };
  for (const Case& c : cases) {
    json j = TinyWithVision();
    j["vision"][c.field] = c.value;
    EXPECT_NE(Refusal(j).find(c.want), std::string::npos) << c.field << ": " << Refusal(j);
  }
  json j = TinyWithVision();
  j["vision"] = 5;
  EXPECT_NE(Refusal(j).find("vision: must be an object"), std::string::npos) << Refusal(j);
  j = TinyWithVision();
  j["vision"].erase("num_layers");
  EXPECT_NE(Refusal(j).find("vision.num_layers: missing"), std::string::npos) << Refusal(j);
}

// Section 14.2's worked examples: 28-pixel units, at most 256 of them.
TEST(VisionConfig, TokenCountFollowsTheResizeRule) {
  const VisionConfig v = Qwen2VlLike();
  struct Case {
    int w, h, grid_h, grid_w;
  };
  const Case cases[] = {
      {224, 224, 16, 16},   // 8 x 8 units, fits as it is
      {300, 200, 14, 22},   // rounded to whole units: 7 x 11
      {41, 13, 2, 2},       // tiny images become one unit
      {1, 1, 2, 2},
      {1000, 500, 22, 44},  // 18 x 36 = 648 units > 256: scaled by sqrt(256 / (17.86 * 35.71))
      {1920, 1080, 24, 42},
      {10000, 1, 2, 512},   // extreme aspect: one row, the columns trimmed to fit
      {1, 10000, 512, 2},
  };
  for (const Case& c : cases) {
    auto g = ImageGridFor(v, c.w, c.h);
    ASSERT_TRUE(g) << g.error().ToString();
    EXPECT_EQ(g->grid_h, c.grid_h) << c.w << "x" << c.h;
    EXPECT_EQ(g->grid_w, c.grid_w) << c.w << "x" << c.h;
    auto n = ImageTokenCount(v, c.w, c.h);
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, int64_t{c.grid_h} * c.grid_w / 4);
    EXPECT_LE(*n * 4, v.max_patches);
    EXPECT_EQ(*ImageSpanTokens(v, c.w, c.h), *n + 2);
  }
  for (auto [w, h] : {std::pair<int64_t, int64_t>{0, 5}, {5, -1}, {kMaxImageSide + 1, 1}}) {
    auto n = ImageTokenCount(v, w, h);
    ASSERT_FALSE(n) << w << "x" << h;
    EXPECT_NE(n.error().message().find("must have sides in [1, 65536]"), std::string::npos);
  }
}

// Every size up to a bound stays within max_patches and keeps the aspect
// ratio within one unit (the rule the daemon's token limit relies on).
TEST(VisionConfig, GridNeverExceedsTheBudget) {
  VisionConfig v = Qwen2VlLike();
  v.max_patches = 64;
  int checked = 0;
  for (int w = 1; w <= 1200; w += 37) {
    for (int h = 1; h <= 1200; h += 41) {
      auto g = ImageGridFor(v, w, h);
      ASSERT_TRUE(g);
      ASSERT_LE(g->patches(), 64) << w << "x" << h;
      ASSERT_EQ(g->grid_h % 2, 0);
      ASSERT_EQ(g->grid_w % 2, 0);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 33 * 30);
}

TEST(VisionConfig, ContentHashCoversSizeAndPixels) {
  const std::vector<uint8_t> rgb = {1, 2, 3, 4, 5, 6};
  // sha256(<u32 width LE><u32 height LE><rgb>), computed with Python's hashlib.
  EXPECT_EQ(ImageContentHash(2, 1, rgb), "f25af82c68d29a6c012779bae23ccc6e5640b399d8b0e0b4eddb25ea7f2a61dd");
  EXPECT_EQ(ImageContentHash(1, 2, rgb), "4cb90cb51e66702075ecb4cf1fd9fa4fd15ce37dc64dc656143415789fcebafd");
  auto in = MakeImageInput(2, 1, rgb);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->content_hash, ImageContentHash(2, 1, rgb));
  auto bad = MakeImageInput(2, 2, rgb);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("has 6 RGB bytes, expected 12"), std::string::npos);
}

ImageInput Gray(uint32_t w, uint32_t h, uint8_t value) {
  auto in = MakeImageInput(w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, value));
  EXPECT_TRUE(in);
  return *in;
}

TEST(VisionConfig, AppendImageWritesAFramedSpan) {
  const VisionConfig v = Qwen2VlLike();
  std::vector<int> prompt = {256, 259};
  std::vector<ImageSpan> spans;
  ASSERT_TRUE(AppendImage(v, Gray(300, 200, 7), prompt, spans));
  prompt.push_back(104);
  ASSERT_TRUE(AppendImage(v, Gray(56, 28, 9), prompt, spans));
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].offset, 3);
  EXPECT_EQ(spans[0].tokens, 77);
  EXPECT_EQ(prompt[2], 269);
  EXPECT_EQ(prompt[3], 268);
  EXPECT_EQ(prompt[79], 268);
  EXPECT_EQ(prompt[80], 270);
  EXPECT_EQ(prompt[81], 104);
  EXPECT_EQ(spans[1].offset, 83);
  EXPECT_EQ(spans[1].tokens, 2);
  EXPECT_EQ(prompt.size(), 86u);
  EXPECT_TRUE(ValidateImageSpans(v, prompt, spans));
}

TEST(VisionConfig, SpansThatLieAreRefused) {
  const VisionConfig v = Qwen2VlLike();
  std::vector<int> prompt = {256};
  std::vector<ImageSpan> spans;
  ASSERT_TRUE(AppendImage(v, Gray(56, 28, 1), prompt, spans));  // prompt: 256 269 268 268 270
  ASSERT_TRUE(ValidateImageSpans(v, prompt, spans));
  auto message = [&](std::vector<int> p, std::vector<ImageSpan> s) {
    Status st = ValidateImageSpans(v, p, s);
    return st ? std::string() : st.error().message();
  };
  {
    auto s = spans;
    s[0].tokens = 1;
    EXPECT_NE(message(prompt, s).find("image 0: spans 1 placeholder tokens, but a 56x28 image becomes 2"), std::string::npos);
  }
  {
    auto s = spans;
    s[0].image.content_hash = ImageContentHash(56, 28, std::vector<uint8_t>(56 * 28 * 3, 2));
    EXPECT_NE(message(prompt, s).find("image 0: content_hash does not match"), std::string::npos);
  }
  {
    auto p = prompt;
    p[1] = 104;
    EXPECT_NE(message(p, spans).find("not framed"), std::string::npos);
  }
  {
    auto s = spans;
    s[0].offset = 4;  // runs past the prompt
    EXPECT_NE(message(prompt, s).find("leaves the prompt"), std::string::npos);
  }
  {
    auto p = prompt;
    p.push_back(268);  // a placeholder the client typed, with no image behind it
    EXPECT_NE(message(p, spans).find("prompt token 5: image token 268 outside an image span"), std::string::npos);
  }
  {
    std::vector<int> p = {256, 270, 104};
    EXPECT_NE(message(p, {}).find("prompt token 1: image token 270"), std::string::npos);
  }
  {
    auto s = spans;
    s.push_back(spans[0]);  // the same span twice overlaps
    EXPECT_NE(message(prompt, s).find("image 1: span at 2"), std::string::npos);
  }
  {
    auto s = spans;
    s[0].image.rgb = nullptr;
    EXPECT_NE(message(prompt, s).find("image 0: has no pixels"), std::string::npos);
  }
}

}  // namespace
}  // namespace moeserve::engine
