// daemon.qwen3_serve: the template-family serve tests (template_family_serve.hpp)
// on a tiny random Qwen3-Next checkpoint in the published layout
// (tools/reference/families/qwen3_next.py, the real Qwen3 tokenizer files
// beside it), rendered against the ChatML renderer. How the reader routes
// well-formed output is in daemon.qwen3_output, on scripted token streams.
#include "template_family_serve.hpp"

#include "moeserve/engine/qwen3_chat.hpp"

namespace moeserve::daemon::testing {
namespace {

struct Qwen3Next {
  static constexpr const char* kScript = "qwen3_next.py";
  static constexpr int kLayers = 4;
  static constexpr const char* kServedName = "qwen3-next-tiny";
  static constexpr const char* kLabel = "qwen3-next";
  static Result<std::vector<engine::ChatPiece>> Render(const std::vector<engine::ChatMessage>& messages,
                                                      const nlohmann::ordered_json* tools) {
    return engine::RenderQwen3Chat(messages, tools, true);
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Qwen3Next, TemplateFamilyServe, Qwen3Next);

}  // namespace
}  // namespace moeserve::daemon::testing
