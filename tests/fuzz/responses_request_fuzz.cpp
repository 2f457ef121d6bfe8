// POST /v1/responses bodies: ParseResponsesRequest, then what the service
// does next with an accepted request: the chat body it builds (ChatBodyFor,
// after a stored conversation) must be one the chat path parses or refuses
// with an error, and a refusal renamed into the Responses request's terms
// (RenameChatError) still says why. Any body must be refused with a 4xx
// that says what is wrong, or accepted; nothing may crash.
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
#include "moeserve/chat/chat_request.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/responses/response_request.hpp"

using namespace moeserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto request = daemon::ParseResponsesRequest(body);
  if (!request) {
    FUZZ_CHECK(!request.error().message.empty(), "a refusal says why");
    FUZZ_CHECK(request.error().status == 400, request.error().message);
    return 0;
  }
  FUZZ_CHECK(request->messages.size() == request->message_params.size(), "every message names its input item");
  const nlohmann::ordered_json history = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "earlier"}}});
  const nlohmann::ordered_json chat = daemon::ChatBodyFor(*request, history);
  FUZZ_CHECK(chat["messages"].size() == request->messages.size() + 1 + (request->instructions ? 1 : 0),
             "instructions, history and input all reach the chat body");
  auto parsed = daemon::ParseChatRequestJson(chat);
  if (!parsed) {
    const daemon::ApiError renamed = daemon::RenameChatError(parsed.error(), *request, history.size());
    FUZZ_CHECK(!renamed.message.empty() && renamed.status >= 400 && renamed.status < 500, renamed.message);
    FUZZ_CHECK(!renamed.param.starts_with("messages["), "a renamed error names the request's own field: " + renamed.param);
  }
  return 0;
}
