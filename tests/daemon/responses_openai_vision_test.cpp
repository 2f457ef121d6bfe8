// daemon.responses_openai_vision: the official `openai` npm client, unchanged,
// sends a PNG as an input_image part of POST /v1/responses (in a user message
// and in a function_call_output) to a daemon serving a model with the small
// random vision tower, and continues the response with previous_response_id;
// tests/daemon/responses_openai_vision.mjs checks that the usage counts the
// image's span each time (replayed from the store on the continuation).
#include "vision_client_run.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(ResponsesOpenAiVision, AnInputImageThroughTheOfficialClient) { ExpectVisionScriptPasses("tests/daemon/responses_openai_vision.mjs", "responses_vision", 11); }

}  // namespace
}  // namespace moeserve::daemon::testing
