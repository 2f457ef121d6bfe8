// daemon.openai_vision: the official `openai` npm client, unchanged, sends a
// PNG (written here by libpng) as an image_url part, in a user message and in
// a tool result, to a daemon serving a model with the small random vision
// tower (moe-model-gen --vision), and gets answers whose usage counts the
// image's span; tests/daemon/openai_vision.mjs does the checks.
#include "vision_client_run.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(OpenAiVision, APngThroughTheOfficialClient) { ExpectVisionScriptPasses("tests/daemon/openai_vision.mjs", "openai_vision", 9); }

}  // namespace
}  // namespace moeserve::daemon::testing
