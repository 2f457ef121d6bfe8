// DeepSeek-V3.2 in the engine: the converted checkpoint runs on Model; the
// chat hooks come from config.json (eos_token_id) and tokenizer.json (which
// ids are real tokens, and "</think>" when the tokenizer has it).
#include "families/deepseek_v32/family.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/families/deepseek_v32.hpp"
#include "moeserve/engine/model.hpp"

namespace moeserve::engine {

namespace {

class ThinkSpan final : public ReasoningTracker {
 public:
  ThinkSpan(bool in, int end_think) : in_(in), end_think_(end_think) {}
  bool InReasoning() const override { return in_; }
  bool Feed(int token, bool is_stop) override {
    if (!in_ || is_stop) return false;
    if (token == end_think_) {
      in_ = false;
      return false;
    }
    return true;
  }

 private:
  bool in_;
  int end_think_;
};

class DeepseekV32ChatHooks final : public ChatHooks {
 public:
  DeepseekV32ChatHooks(int eos, int sampled, int end_think) : eos_(eos), sampled_(sampled), end_think_(end_think) {}
  std::string family() const override { return deepseek_v32::kModelType; }
  std::vector<int> DefaultStops() const override { return {eos_}; }
  int sampled_ids() const override { return sampled_; }
  std::unique_ptr<ReasoningTracker> NewTracker(const GenerationRequest& request) const override {
    // Without a "</think>" token nothing counts as reasoning.
    return std::make_unique<ThinkSpan>(end_think_ >= 0 && request.starts_in_reasoning, end_think_);
  }
  std::vector<int> CloseReasoning() const override {
    return end_think_ >= 0 ? std::vector<int>{end_think_} : std::vector<int>{};
  }
  std::optional<int> AllMaskedToken() const override { return eos_; }

 private:
  int eos_, sampled_, end_think_;
};

// The ids tokenizer.json defines (model.vocab and added_tokens), and the id
// of "</think>" (-1 when absent). Without the file: every embedding row.
Status ReadTokenizer(const std::string& dir, int vocab, int* sampled, int* end_think) {
  *sampled = vocab;
  *end_think = -1;
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Ok();
  std::ostringstream text;
  text << in.rdbuf();
  MOE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonBounded<nlohmann::json>(
                                             text.str(), {.max_bytes = 256u << 20, .max_depth = kMaxJsonDepth}, path));
  int64_t max_id = -1;
  const auto see = [&](const std::string& content, const nlohmann::json& id) {
    if (!id.is_number_integer()) return;
    max_id = std::max<int64_t>(max_id, id.get<int64_t>());
    if (content == "</think>") *end_think = id.get<int>();
  };
  if (j.contains("model") && j["model"].is_object() && j["model"].contains("vocab") && j["model"]["vocab"].is_object())
    for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) see(it.key(), it.value());
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.is_object() && t.contains("content") && t["content"].is_string() && t.contains("id"))
        see(t["content"].get<std::string>(), t["id"]);
  if (max_id >= vocab)
    return Fail(Error::Corruption(path, "token id " + std::to_string(max_id) + " is past config.json vocab_size (" +
                                            std::to_string(vocab) + ")"));
  if (max_id >= 0) *sampled = static_cast<int>(max_id + 1);
  if (*end_think >= *sampled) *end_think = -1;
  return Ok();
}

bool Matches(const ConfigProbe& probe) { return probe.model_type == deepseek_v32::kModelType; }

Result<FamilyParts> Load(const std::string& dir, const ModelOptions& options) {
  MOE_ASSIGN_OR_RETURN(deepseek_v32::Config cfg, deepseek_v32::LoadConfig(dir));
  if (cfg.eos_token_id < 0 || cfg.eos_token_id >= cfg.model.vocab_size)
    return Fail(Error::InvalidArgument(dir + "/config.json: eos_token_id: missing or outside the vocabulary"));
  int sampled = 0, end_think = -1;
  MOE_TRY(ReadTokenizer(dir, cfg.model.vocab_size, &sampled, &end_think));
  // Converted tensor by tensor as the model loads (no converted copy beside it).
  MOE_ASSIGN_OR_RETURN(ModelDir opened, deepseek_v32::OpenDirStreamed(dir, options.experts));
  for (const auto& w : opened.warnings) log::Info(dir + ": " + w);
  FamilyParts parts;
  MOE_ASSIGN_OR_RETURN(parts.model, Model::Load(opened, options));
  parts.chat = std::make_shared<const DeepseekV32ChatHooks>(cfg.eos_token_id, sampled, end_think);
  return parts;
}

// publish --experts: the converted directory nodes load without converting.
Status WriteConvertedDir(const std::string& dir, const std::string& out, const ConversionOptions& options) {
  return deepseek_v32::WriteConverted(dir, out, options.experts);
}

Result<std::optional<ExpertFormat>> ConvertedExperts(const std::string& out) {
  MOE_ASSIGN_OR_RETURN(deepseek_v32::Config cfg, deepseek_v32::LoadConfig(out));
  return cfg.converted_experts;
}

}  // namespace

FamilyEntry DeepseekV32Family() {
  // Stored as published: FP8 (or BF16 in published names), converted only by
  // WriteConverted, whose marker says the format.
  return {deepseek_v32::kModelType, Matches, Load, WriteConvertedDir, ConvertedExperts, ConvertedExperts};
}

}  // namespace moeserve::engine
