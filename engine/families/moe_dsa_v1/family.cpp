#include "families/moe_dsa_v1/family.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "families/converted_dir.hpp"
#include "families/mxfp4_requantised.hpp"
#include "moeserve/engine/family_registry.hpp"

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

// The directory's tensors with its BF16 routed experts requantised to MXFP4
// as the loader (or a converted directory's writer) asks for them.
void RequantiseExperts(ModelDir& opened) {
  auto ck = std::make_shared<const Checkpoint>(std::move(opened.checkpoint));
  std::vector<std::string> names;
  for (const TensorView* t : ck->AllTensors()) names.push_back(t->name);
  opened.source = std::make_shared<families::Mxfp4RequantisedSource>(ck, families::RoutedExpertBases(names));
  opened.checkpoint = Checkpoint();
  opened.config.expert_format = ExpertFormat::kMxfp4;
}

Result<FamilyParts> Load(const std::string& dir, const ModelOptions& options) {
  MOE_ASSIGN_OR_RETURN(ModelDir opened, OpenModelDir(dir));
  // experts: mxfp4 of a checkpoint with BF16 experts (model.md 1.2):
  // requantised at load. MXFP4 experts asked for as BF16 stay refused
  // (Model::Load): their values are MXFP4's whatever the format.
  if (options.experts == ExpertFormat::kMxfp4 && opened.config.expert_format == ExpertFormat::kBf16)
    RequantiseExperts(opened);
  FamilyParts parts;
  MOE_ASSIGN_OR_RETURN(parts.model, Model::Load(opened, options));
  parts.chat = MoeDsaV1Chat();
  return parts;
}

// publish --experts mxfp4 of a checkpoint with BF16 experts: every tensor
// as it is but the routed experts, requantised; config.json's quantization
// says mxfp4 and carries the converted marker.
Status WriteConvertedDir(const std::string& dir, const std::string& out, const ConversionOptions& options) {
  MOE_ASSIGN_OR_RETURN(ModelDir opened, OpenModelDir(dir));
  if (options.experts != ExpertFormat::kMxfp4 || opened.config.expert_format != ExpertFormat::kBf16)
    return Fail(Error::InvalidArgument(
        dir + " holds its routed experts as " + std::string(ExpertFormatName(opened.config.expert_format)) +
        ": moe-dsa-v1 converts BF16 experts to MXFP4 only (MXFP4 experts in BF16 would hold the same values)"));
  std::vector<std::string> names;
  for (const TensorView* t : opened.checkpoint.AllTensors()) {
    if (t->name.ends_with(".ffn.experts.w13.weight") || t->name.ends_with(".ffn.experts.w2.weight")) {
      const std::string base = t->name.substr(0, t->name.size() - 7);
      names.push_back(base + ".blocks");
      names.push_back(base + ".scales");
    } else {
      names.push_back(t->name);
    }
  }
  RequantiseExperts(opened);
  MOE_ASSIGN_OR_RETURN(nlohmann::ordered_json cfg, families::ConvertedConfig(dir, ExpertFormat::kMxfp4));
  cfg["quantization"] = {{"format", "mxfp4"}, {"block_size", 32}, {"applies_to", {"experts"}}};
  families::ConvertedDirPlan plan{.names = std::move(names), .source = opened.source.get(),
                                  .config_json = cfg.dump(2) + "\n"};
  return families::WriteConvertedDir(dir, out, plan);
}

// What config.json's quantization says (model.md 1.2).
Result<std::optional<ExpertFormat>> StoredExperts(const std::string& dir) {
  MOE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig((std::filesystem::path(dir) / "config.json").string()));
  return std::optional<ExpertFormat>(config.expert_format);
}

}  // namespace

FamilyEntry MoeDsaV1Family() {
  return {"moe-dsa-v1", Matches, Load, WriteConvertedDir, families::ConvertedMarker, StoredExperts};
}

std::shared_ptr<const ChatHooks> MoeDsaV1Chat() {
  static const auto hooks = std::make_shared<const MoeDsaV1ChatHooks>();
  return hooks;
}

}  // namespace moeserve::engine
