// The answer of a chat completion as a Responses API object: output items
// (`reasoning` with its summary text, `message` with output_text,
// `function_call`), `usage` in the Responses names, the status, and the
// object every endpoint returns (POST, GET, cancel).
//
// Thread safety: free functions over values.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/responses/response_request.hpp"

namespace moeserve::daemon {

// What a chat completion answered, in the order the model wrote it.
struct ChatAnswer {
  std::string reasoning;
  std::string content;
  struct Call {
    std::string call_id, name, arguments;
  };
  std::vector<Call> calls;
  std::string finish_reason;  // stop, length, tool_calls
  nlohmann::ordered_json usage;  // the chat completion's usage object
  std::string tier;
};

// Reads a chat.completion body (choices[0].message, usage, tier).
ChatAnswer ChatAnswerFrom(const nlohmann::ordered_json& completion);

// "msg_", "rs_", "fc_" followed by 24 random letters and digits.
std::string NewItemId(const std::string& prefix);

// The output items of a whole answer (a non-streamed one).
nlohmann::ordered_json OutputItems(const ChatAnswer& answer);
nlohmann::ordered_json ReasoningItem(const std::string& id, const std::string& text);
nlohmann::ordered_json MessageItem(const std::string& id, const std::string& text, const std::string& status);
nlohmann::ordered_json FunctionCallItem(const std::string& id, const ChatAnswer::Call& call, const std::string& status);

// {input_tokens, input_tokens_details.cached_tokens, output_tokens,
// output_tokens_details.reasoning_tokens, total_tokens} from a chat usage.
nlohmann::ordered_json ResponseUsage(const nlohmann::ordered_json& chat_usage);

// The response object before any output: status as given, output [], usage
// null, and the request's settings echoed as OpenAI echoes them.
nlohmann::ordered_json ResponseShell(const std::string& id, int64_t created_at, const std::string& model,
                                     const ResponsesRequest& req, const std::string& status);

// Completes `response` with its output items and the answer's usage; the
// status is completed, or incomplete (max_output_tokens) for a cut answer.
void FinishResponse(nlohmann::ordered_json& response, nlohmann::ordered_json output, const ChatAnswer& answer);

// The conversation after this response: the history, the new input and the
// answer as an assistant message (what a later previous_response_id continues).
nlohmann::ordered_json ConversationAfter(const nlohmann::ordered_json& history, const ResponsesRequest& req,
                                         const ChatAnswer& answer);

}  // namespace moeserve::daemon
