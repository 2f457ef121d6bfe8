// The one check of tool-call chains in a conversation, used wherever a
// history is accepted or rewritten: the stateless endpoint's
// invalid_tool_history (chat_request.cpp) and the session history's
// compression (session_history.cpp), so that what one accepts the other can
// never break.
//
// A chain is an assistant message's tool calls and the tool messages that
// answer them. The rules (api.md, invalid_tool_history):
// - every tool call id is used by one call only;
// - every tool message answers an earlier, still unanswered call, by id;
// - every call is answered before the next user message.
// Calls may still be unanswered at the end of the conversation: the client
// runs the tools and sends the results with its next request.
//
// Thread safety: a free function over values.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/engine/chat_format.hpp"

namespace moeserve::chat {

struct ToolChainViolation {
  enum class Kind {
    kDuplicateCallId,  // `message`/`call`: the second call with `id`
    kUnknownResult,    // `message`: a tool message whose id matches no earlier
                       // call
    kAnsweredTwice,    // `message`: a tool message whose call was already answered
    kUnanswered,       // `message`/`call`: a call with no result before the user
                       // message `before`
  };
  Kind kind = Kind::kUnknownResult;
  size_t message = 0;  // index into the messages
  size_t call = 0;     // index into that message's tool_calls (kDuplicateCallId, kUnanswered)
  size_t before = 0;   // kUnanswered: the user message that came first
  std::string id;      // the tool call id concerned
};

// The first violation in message order, or nothing when every chain is whole.
// With several calls unanswered at a user message, the one with the smallest
// id is named (a stable choice, so the same body always gets the same error).
std::optional<ToolChainViolation> FindToolChainViolation(const std::vector<engine::ChatMessage>& messages);

}  // namespace moeserve::chat
