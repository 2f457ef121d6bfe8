// daemon.deepseek_serve: the template-family serve tests
// (template_family_serve.hpp) on a tiny random DeepSeek-V3.2 checkpoint in
// the published layout (tools/reference/families/deepseek_v32.py: FP8
// block-scaled shards with an index, and DeepSeek's tokenizer files beside
// it: npm's DeepSeek-V3 tokenizer.json with <think> and </think> where V3.2's
// has them), rendered against the published-encoding renderer; forced calls
// are DSML. How the reader routes well-formed output is in
// daemon.deepseek_output, on scripted token streams.
#include "template_family_serve.hpp"

#include "moeserve/engine/deepseek_chat.hpp"

namespace moeserve::daemon::testing {
namespace {

struct DeepseekV32 {
  static constexpr const char* kScript = "deepseek_v32.py";
  static constexpr int kLayers = 2;
  static constexpr const char* kServedName = "deepseek-v32-tiny";
  static constexpr const char* kLabel = "deepseek-v3.2";
  static Result<std::vector<engine::ChatPiece>> Render(const std::vector<engine::ChatMessage>& messages,
                                                      const nlohmann::ordered_json* tools) {
    engine::DeepseekChatOptions options;
    options.tools = tools;
    return engine::RenderDeepseekChat(messages, options);
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(DeepseekV32, TemplateFamilyServe, DeepseekV32);

}  // namespace
}  // namespace moeserve::daemon::testing
