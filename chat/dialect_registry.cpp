// The chat dialects by family: one line per family, keyed by the name the
// engine's family registry gives it (engine/families/registry.cpp). A
// family's dialect is its folder under chat/ and its line here.
#include <span>

#include "moeserve/chat/dialect.hpp"
#include "moeserve/chat/deepseek_v32/deepseek_dialect.hpp"
#include "moeserve/chat/gpt_oss/gpt_oss_dialect.hpp"
#include "moeserve/chat/moe_dsa_v1/moe_dsa_v1_dialect.hpp"
#include "moeserve/chat/qwen3_next/qwen3_dialect.hpp"

namespace moeserve::chat {

namespace {

struct DialectEntry {
  const char* family;  // engine::FamilyEntry::name
  Result<std::shared_ptr<const ChatDialect>> (*load)(const DialectInputs& inputs);
};

constexpr DialectEntry kDialects[] = {
    {"moe-dsa-v1", LoadMoeDsaV1Dialect},
    {"gpt-oss", LoadGptOssDialect},
    {"deepseek_v32", LoadDeepseekDialect},
    {"qwen3_next", LoadQwen3Dialect},
};

}  // namespace

Result<std::shared_ptr<const ChatDialect>> LoadDialect(const std::string& family, const DialectInputs& inputs) {
  for (const DialectEntry& entry : kDialects)
    if (family == entry.family) return entry.load(inputs);
  return Fail(Error::InvalidArgument("the daemon has no chat format for " + family +
                                     " models yet (moe-run --prompt-ids runs them on token ids)"));
}

std::vector<std::string> DialectFamilies() {
  std::vector<std::string> names;
  for (const DialectEntry& entry : kDialects) names.emplace_back(entry.family);
  return names;
}

}  // namespace moeserve::chat
