// config.json validation (model.md section 2): each rule's failure names the field.
#include "moeserve/engine/model_config.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace moeserve::engine {
namespace {

using nlohmann::json;

json Tiny() {
  auto c = PresetConfig("tiny");
  EXPECT_TRUE(c) << c.error().ToString();
  return json::parse(c->ToJson());
}

std::string Refusal(const json& j) {
  auto r = ParseModelConfig(j.dump(), "m/config.json");
  if (r) return "";
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  return r.error().message();
}

TEST(ModelConfig, TinyPresetMatchesModelMd) {
  auto c = PresetConfig("tiny");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->vocab_size, 384);
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_EQ(c->num_layers, 6);
  EXPECT_EQ(c->layer_types[2], LayerKind::kDelta);
  EXPECT_EQ(c->layer_types[3], LayerKind::kDsa);
  EXPECT_EQ(c->mla.kv_lora_rank, 64);
  EXPECT_EQ(c->dsa.index_topk, 2048);
  EXPECT_EQ(c->moe.n_group, 4);
  EXPECT_DOUBLE_EQ(c->moe.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c->rope.yarn);
  EXPECT_EQ(c->max_position_embeddings, 1048576);
  EXPECT_EQ(c->thinking_budgets.medium, 2048);
  // ToJson round-trips.
  auto again = ParseModelConfig(c->ToJson());
  ASSERT_TRUE(again);
  EXPECT_EQ(again->ToJson(), c->ToJson());
  EXPECT_TRUE(PresetConfig("small"));
  EXPECT_FALSE(PresetConfig("huge"));
}

TEST(ModelConfig, EveryValidationRuleNamesTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["layer_types"].push_back("mla"); }, "layer_types: has 7 entries but num_layers is 6"},
      {[](json& j) { j["layer_types"][1] = "mamba"; }, "layer_types[1]: 'mamba' is not one of"},
      {[](json& j) { j["layer_types"][1] = 3; }, "layer_types[1]: must be a string"},
      {[](json& j) { j["dsa"]["index_head_dim"] = 8; }, "dsa.index_head_dim: 8 must be >= mla.qk_rope_head_dim (16)"},
      {[](json& j) { j["dsa"]["index_head_dim"] = 33; }, "dsa.index_head_dim: 33 must be even"},
      {[](json& j) { j["mla"]["qk_rope_head_dim"] = 15; j["dsa"]["index_head_dim"] = 32; }, "mla.qk_rope_head_dim: 15 must be even"},
      {[](json& j) { j["hidden_size"] = 250; }, "hidden_size: 250 must be a multiple of 32"},
      {[](json& j) { j["moe"]["moe_intermediate_size"] = 100; }, "moe.moe_intermediate_size: 100 must be a multiple of 32"},
      {[](json& j) { j["moe"]["n_group"] = 3; }, "moe.num_experts: 16 must be divisible by moe.n_group (3)"},
      {[](json& j) { j["moe"]["n_group"] = 16; j["moe"]["topk_group"] = 4; }, "moe.n_group: num_experts / n_group = 1"},
      {[](json& j) { j["moe"]["topk_group"] = 5; }, "moe.topk_group: 5 must be <= moe.n_group (4)"},
      {[](json& j) { j["moe"]["topk_group"] = 1; j["moe"]["experts_per_token"] = 5; }, "moe.experts_per_token: 5 exceeds"},
      {[](json& j) { j["vocab_size"] = 267; }, "vocab_size: 267 must be >= 268"},
      {[](json& j) { j["max_position_embeddings"] = 4096 * 256 + 1; }, "max_position_embeddings: 1048577 exceeds rope.factor"},
      {[](json& j) { j["vocab_size"] = "384"; }, "vocab_size: must be an integer"},
      {[](json& j) { j["hidden_size"] = 256.5; }, "hidden_size: must be an integer"},
      {[](json& j) { j.erase("num_layers"); }, "num_layers: missing"},
      {[](json& j) { j["mla"].erase("kv_lora_rank"); }, "mla.kv_lora_rank: missing"},
      {[](json& j) { j.erase("delta"); }, "delta: missing"},
      {[](json& j) { j["moe"]["score_func"] = "softmax"; }, "moe.score_func: 'softmax' is not supported"},
      {[](json& j) { j["rope"]["scaling"] = "ntk"; }, "rope.scaling: 'ntk' is not one of"},
      {[](json& j) { j["quantization"]["block_size"] = 16; }, "quantization.block_size: must be 32"},
      {[](json& j) { j["architecture"] = "llama"; }, "architecture: 'llama' is not supported"},
      {[](json& j) { j["mla"]["num_heads"] = 0; }, "mla.num_heads: must be a positive integer"},
      {[](json& j) { j["thinking_budgets"]["low"] = 99999; }, "thinking_budgets: must satisfy low <= medium <= high"},
      {[](json& j) { j["first_dense_layers"] = 7; }, "first_dense_layers: 7 exceeds num_layers (6)"},
  };
  for (const auto& c : cases) {
    json j = Tiny();
    c.edit(j);
    std::string msg = Refusal(j);
    EXPECT_NE(msg.find("m/config.json: " + c.field), std::string::npos) << "expected '" << c.field << "', got '" << msg << "'";
  }
  EXPECT_NE(Refusal(json::array()).find("top level must be a JSON object"), std::string::npos);
  auto bad_json = ParseModelConfig("{", "m/config.json");
  ASSERT_FALSE(bad_json);
  EXPECT_NE(bad_json.error().message().find("m/config.json: not valid JSON"), std::string::npos);
}

TEST(ModelConfig, YarnOffAllowsAnyContext) {
  json j = Tiny();
  j["rope"]["scaling"] = "none";
  j["max_position_embeddings"] = 1 << 24;
  EXPECT_EQ(Refusal(j), "");
}

TEST(ModelConfig, SectionsOnlyRequiredWhenUsed) {
  json j = Tiny();
  j["layer_types"] = {"mla", "mla", "mla", "mla", "mla", "mla"};
  j.erase("dsa");
  j.erase("delta");
  EXPECT_EQ(Refusal(j), "");
  j["first_dense_layers"] = 6;
  j.erase("moe");
  EXPECT_EQ(Refusal(j), "");
}

TEST(ModelConfig, WorldSizeMustDivideExperts) {
  auto c = PresetConfig("tiny");
  ASSERT_TRUE(c);
  EXPECT_TRUE(ValidateWorldSize(*c, 4));
  auto bad = ValidateWorldSize(*c, 3);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("moe.num_experts (16) must be divisible"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::engine
