#include "families/qwen3_next/family.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "families/qwen3_next/config.hpp"
#include "families/qwen3_next/graph.hpp"
#include "moeserve/engine/engine.hpp"

namespace moeserve::engine {

namespace {

// The ids of the chat format's special tokens, from tokenizer.json's
// added_tokens (-1 when the directory has no such token).
struct SpecialIds {
  int im_end = -1, end_think = -1;
};

Result<SpecialIds> ReadSpecialIds(const std::string& dir) {
  SpecialIds ids;
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return ids;  // token ids only (moe-run --prompt-ids)
  std::ostringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Fail(Error::InvalidArgument(path + ": not a JSON object"));
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string())
        return Fail(Error::InvalidArgument(path + ": added_tokens: each entry needs an integer id and a content string"));
      const std::string c = t["content"].get<std::string>();
      if (c == "<|im_end|>") ids.im_end = t["id"].get<int>();
      if (c == "</think>") ids.end_think = t["id"].get<int>();
    }
  return ids;
}

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

class Qwen3NextChatHooks final : public ChatHooks {
 public:
  Qwen3NextChatHooks(std::vector<int> stops, SpecialIds ids, int vocab) : stops_(std::move(stops)), ids_(ids), vocab_(vocab) {}
  std::string family() const override { return "qwen3_next"; }
  std::vector<int> DefaultStops() const override { return stops_; }
  int sampled_ids() const override { return vocab_; }
  std::unique_ptr<ReasoningTracker> NewTracker(const GenerationRequest& request) const override {
    return std::make_unique<ThinkSpan>(request.starts_in_reasoning && ids_.end_think >= 0, ids_.end_think);
  }
  std::vector<int> CloseReasoning() const override {
    if (ids_.end_think < 0) return {};
    return {ids_.end_think};
  }
  std::optional<int> AllMaskedToken() const override {
    if (stops_.empty()) return std::nullopt;
    return stops_.front();
  }

 private:
  std::vector<int> stops_;
  SpecialIds ids_;
  int vocab_;
};

bool Matches(const ConfigProbe& probe) { return probe.model_type == "qwen3_next"; }

Result<FamilyParts> Load(const std::string& dir, const ModelOptions& options) {
  // The routed experts as published (BF16), or requantised to MXFP4 at load
  // (options.experts; graph.hpp).
  MOE_ASSIGN_OR_RETURN(qwen3_next::Config config, qwen3_next::LoadConfig(dir));
  MOE_ASSIGN_OR_RETURN(auto model, qwen3_next::LoadModel(dir, config, options));
  MOE_ASSIGN_OR_RETURN(SpecialIds ids, ReadSpecialIds(dir));
  std::vector<int> stops;
  if (ids.im_end >= 0) stops.push_back(ids.im_end);
  for (int e : config.eos_token_ids)
    if (e != ids.im_end) stops.push_back(e);
  for (int s : stops)
    if (s >= model->vocab_size())
      return Fail(Error::InvalidArgument(dir + "/tokenizer.json: <|im_end|> id " + std::to_string(s) +
                                         " is outside the model's vocab_size"));
  FamilyParts parts;
  parts.chat = std::make_shared<const Qwen3NextChatHooks>(std::move(stops), ids, model->vocab_size());
  parts.model = std::move(model);
  return parts;
}

// publish --experts: the converted directory nodes load without requantising.
Status WriteConvertedDir(const std::string& dir, const std::string& out, const ConversionOptions& options) {
  return qwen3_next::WriteConverted(dir, out, options.experts);
}

// As published the routed experts are BF16; a converted directory says.
Result<std::optional<ExpertFormat>> StoredExperts(const std::string& dir) {
  MOE_ASSIGN_OR_RETURN(std::optional<ExpertFormat> converted, qwen3_next::ConvertedExperts(dir));
  return converted ? converted : std::optional<ExpertFormat>(ExpertFormat::kBf16);
}

}  // namespace

FamilyEntry Qwen3NextFamily() {
  return {"qwen3_next", Matches, Load, WriteConvertedDir, qwen3_next::ConvertedExperts, StoredExperts};
}

}  // namespace moeserve::engine
