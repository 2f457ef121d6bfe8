// POST /v1/chat/completions bodies: ParseChatRequest, then what the handler
// does next with an accepted request (tool history, RenderChat; image parts
// recorded in user and tool messages at offsets inside their text). Any body
// must be refused with an ApiError that says what is wrong, or accepted and
// rendered (or refused by the renderer with a message); nothing may crash.
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
#include "moeserve/chat/chat_request.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/tokenizer.hpp"

using namespace moeserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto request = daemon::ParseChatRequest(body);
  if (!request) {
    FUZZ_CHECK(!request.error().message.empty(), "a refusal says why");
    FUZZ_CHECK(request.error().status >= 400 && request.error().status < 500, request.error().message);
    return 0;
  }
  FUZZ_CHECK(!request->messages.empty(), "an accepted request has messages");
  // Image parts sit in user or tool messages, inside their text, in order.
  for (size_t i = 0; i < request->images.size(); ++i) {
    const auto& image = request->images[i];
    FUZZ_CHECK(image.message < request->messages.size(), "an image part names its message");
    const auto& m = request->messages[image.message];
    FUZZ_CHECK(m.role == engine::ChatRole::kUser || m.role == engine::ChatRole::kTool, "an image in a user or tool message");
    FUZZ_CHECK(image.text_offset <= m.content.size(), "an image offset inside its message's text");
    FUZZ_CHECK(!image.url.empty() && !image.param.empty(), "an image part has a url and a param");
    if (i > 0) FUZZ_CHECK(image.message >= request->images[i - 1].message, "image parts in message order");
  }
  (void)daemon::ValidateToolHistory(request->messages);

  const nlohmann::ordered_json* tools = request->tools.is_null() ? nullptr : &request->tools;
  auto ids = engine::RenderChat(request->messages, tools, /*add_generation_prompt=*/true);
  if (!ids) {
    FUZZ_CHECK(!ids.error().message().empty(), "a render refusal says why");
    return 0;
  }
  FUZZ_CHECK(!ids->empty() && ids->front() == engine::tok::kBos, "a prompt starts with <|bos|>");
  FUZZ_CHECK(ids->back() == engine::tok::kThink, "the generation prompt ends with <|think|>");
  for (int id : *ids) FUZZ_CHECK(id >= 0 && id < engine::tok::kFirstPadding, "rendered id " + std::to_string(id));
  return 0;
}
