// The family registry (family_registry.hpp). Adding a family: its folder
// under engine/families/, its header included here, and its line in kFamilies.
#include "moeserve/engine/family_registry.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "families/deepseek_v32/family.hpp"
#include "families/gpt_oss/family.hpp"
#include "families/moe_dsa_v1/family.hpp"
#include "families/qwen3_next/family.hpp"
#include "moeserve/engine/model.hpp"

namespace moeserve::engine {

namespace {

// First match wins; moe-dsa-v1 also takes what no other entry claims.
const FamilyEntry kFamilies[] = {
    DeepseekV32Family(),
    GptOssFamily(),
    Qwen3NextFamily(),
    MoeDsaV1Family(),
};

}  // namespace

std::span<const FamilyEntry> Families() { return kFamilies; }

Result<ConfigProbe> ProbeConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(Error::NotFound(path + ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Fail(Error::InvalidArgument(path + ": not a JSON object"));
  ConfigProbe probe;
  auto str = [&](const char* key) { return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : ""; };
  probe.model_type = str("model_type");
  probe.architecture = str("architecture");
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a.is_string()) probe.architectures.push_back(a.get<std::string>());
  return probe;
}

Result<const FamilyEntry*> FindFamily(const std::string& dir) {
  MOE_ASSIGN_OR_RETURN(ConfigProbe probe, ProbeConfig(dir));
  for (const FamilyEntry& f : kFamilies)
    if (f.matches(probe)) return &f;
  return &kFamilies[std::size(kFamilies) - 1];
}

Result<std::unique_ptr<Model>> LoadLayerGraph(const std::string& dir, const ModelOptions& options) {
  MOE_ASSIGN_OR_RETURN(const FamilyEntry* family, FindFamily(dir));
  MOE_ASSIGN_OR_RETURN(FamilyParts parts, family->load(dir, options));
  auto* graph = dynamic_cast<Model*>(parts.model.get());
  if (!graph)
    return Fail(Error::InvalidArgument(dir + ": the " + std::string(family->name) +
                                       " family does not run on the shared layer graph (expert parallelism needs it)"));
  parts.model.release();
  return std::unique_ptr<Model>(graph);
}

}  // namespace moeserve::engine
