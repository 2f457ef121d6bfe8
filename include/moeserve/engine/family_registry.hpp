// Which model family serves a model directory. The table lives in
// engine/families/registry.cpp: one line per family, each family in its own
// folder under engine/families/ (family.hpp says what a family supplies).
//
// A directory's family is decided from its config.json: the first entry
// whose `matches` accepts the probe (Hugging Face model_type and
// architectures, or moe-dsa-v1's architecture) wins; a directory that no
// entry claims goes to moe-dsa-v1, whose loader then says what is wrong.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/family.hpp"
#include "moeserve/engine/model_config.hpp"

namespace moeserve::engine {

struct ModelOptions;  // model.hpp: kernels, activations, expert-parallel slice
class Model;         // model.hpp: the shared layer graph

// What the registry reads of DIR/config.json to choose a family.
struct ConfigProbe {
  std::string model_type;                  // Hugging Face: "gpt_oss", "deepseek_v32", ...
  std::vector<std::string> architectures;  // Hugging Face: "GptOssForCausalLM", ...
  std::string architecture;                // moe-dsa-v1's own key
};

// What a directory is converted into for publishing (`moe-daemon publish --experts`).
struct ConversionOptions {
  ExpertFormat experts = ExpertFormat::kMxfp4;  // the routed experts' format in the converted directory
};

struct FamilyEntry {
  const char* name;  // "moe-dsa-v1", "gpt-oss": ChatHooks::family() says the same
  bool (*matches)(const ConfigProbe& probe);
  // Parses the config, loads the weights and tokenizer; errors name the file or field.
  Result<FamilyParts> (*load)(const std::string& dir, const ModelOptions& options);
  // Optional (null: the family's directories are published as they are).
  // Writes DIR converted into the new directory OUT, which the family then
  // loads with no conversion: refused if OUT exists; written under a
  // temporary name and renamed when complete, so an OUT that exists is whole.
  Status (*write_converted)(const std::string& dir, const std::string& out, const ConversionOptions& options) = nullptr;
  // With write_converted: the routed experts' format of a directory it wrote
  // (nullopt when OUT is not one); errors name the file.
  Result<std::optional<ExpertFormat>> (*converted_experts)(const std::string& out) = nullptr;
  // The routed experts' format of DIR as it is stored, published or
  // converted (nullopt: neither MXFP4 nor BF16, DeepSeek-V3.2's FP8 release):
  // `publish --experts` of that format publishes DIR as it is. Null: none.
  Result<std::optional<ExpertFormat>> (*stored_experts)(const std::string& dir) = nullptr;
};

// Every registered family, in matching order.
std::span<const FamilyEntry> Families();

// DIR/config.json read for the registry; errors name the file.
Result<ConfigProbe> ProbeConfig(const std::string& dir);

// The family that serves DIR.
Result<const FamilyEntry*> FindFamily(const std::string& dir);

// DIR's model loaded by its family, for a family whose model runs on the
// shared layer graph (moe-dsa-v1, deepseek_v32, qwen3_next): what an expert-parallel
// follower runs, loaded exactly as rank 0's engine loads it (same
// conversion, same options) but holding only options.ep_rank's experts.
// Other families fail with kInvalidArgument naming the family.
Result<std::unique_ptr<Model>> LoadLayerGraph(const std::string& dir, const ModelOptions& options);

}  // namespace moeserve::engine
