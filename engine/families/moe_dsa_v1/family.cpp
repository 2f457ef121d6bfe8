#include "families/moe_dsa_v1/family.hpp"

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::engine {

namespace {

class ThinkSpan final : public ReasoningTracker {
 public:
  explicit ThinkSpan(bool in) : in_(in) {}
  bool InReasoning() const override { return in_; }
  // A stop token ends the turn; it is never a reasoning token.
  bool Feed(int token, bool is_stop) override {
    if (!in_ || is_stop) return false;
    if (token == tok::kEndThink) {
      in_ = false;
      return false;
    }
    return true;
  }

 private:
  bool in_;
};

class MoeDsaV1ChatHooks final : public ChatHooks {
 public:
  std::string family() const override { return "moe-dsa-v1"; }
  std::vector<int> DefaultStops() const override { return {tok::kEnd, tok::kEos}; }
  int sampled_ids() const override { return tok::kFirstPadding; }
  std::unique_ptr<ReasoningTracker> NewTracker(const GenerationRequest& request) const override {
    return std::make_unique<ThinkSpan>(request.starts_in_reasoning);
  }
  std::vector<int> CloseReasoning() const override { return {tok::kEndThink}; }
  std::optional<int> AllMaskedToken() const override { return tok::kEnd; }
};

bool Matches(const ConfigProbe& probe) { return probe.architecture == "moe-dsa-v1"; }

Result<FamilyParts> Load(const std::string& dir, const ModelOptions& options) {
  MOE_ASSIGN_OR_RETURN(ModelDir opened, OpenModelDir(dir));
  FamilyParts parts;
  MOE_ASSIGN_OR_RETURN(parts.model, Model::Load(opened, options));
  parts.chat = MoeDsaV1Chat();
  return parts;
}

}  // namespace

FamilyEntry MoeDsaV1Family() { return {"moe-dsa-v1", Matches, Load}; }

std::shared_ptr<const ChatHooks> MoeDsaV1Chat() {
  static const auto hooks = std::make_shared<const MoeDsaV1ChatHooks>();
  return hooks;
}

}  // namespace moeserve::engine
