// POST /v1/responses bodies (the OpenAI Responses API), parsed, validated and
// translated into the chat-completions body that ChatService runs, so that
// rendering, constrained decoding, tiers, budgets and rate limits are the
// chat path's own.
//
// Every refusal is a 400 whose `param` names the culprit in the request's own
// terms ("input[3].call_id", "tools[0].parameters", "text.format.schema").
// Unknown top-level fields are ignored, as OpenAI does; what the daemon does
// not implement (built-in tools such as web_search, input_image parts,
// item_reference items, truncation "auto") is refused by name rather than
// silently dropped.
//
// Thread safety: free functions over values.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/chat_api.hpp"

namespace moeserve::daemon {

// Items in `input`: far more than any conversation the context holds, few
// enough that a hostile array is refused before it is walked twice.
inline constexpr size_t kMaxResponseInputItems = 4096;
// Content parts of one message, and tools in one request.
inline constexpr size_t kMaxResponseContentParts = 256;
inline constexpr size_t kMaxResponseTools = 128;

struct ResponsesRequest {
  std::string model;
  std::optional<std::string> instructions;
  // The new input as chat messages, and for each the request field it came
  // from ("input", "input[2]"), so that an error about messages[k] can name it.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::vector<std::string> message_params;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // as the response echoes them
  nlohmann::ordered_json tool_choice = "auto";                     // as the response echoes it
  bool parallel_tool_calls = true;
  std::optional<std::string> effort;  // low, medium, high (minimal is low)
  std::optional<int64_t> max_output_tokens;
  std::optional<double> temperature, top_p;
  nlohmann::ordered_json text_format = {{"type", "text"}};  // text.format as echoed
  bool store = true;
  bool stream = false;
  bool background = false;
  std::optional<std::string> previous_response_id;
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  std::string user;
  // moeserve's extensions, passed to the chat path as they are.
  nlohmann::ordered_json seed, thinking_budget, speculative;
};

// Parses and validates raw body bytes (UTF-8 JSON, bounded like chat bodies).
ApiResult<ResponsesRequest> ParseResponsesRequest(std::string_view body);

// The chat-completions body for `req`, continuing `history` (the chat
// messages of the previous response's conversation, or an empty array):
// instructions first (a system message), then the history, then the new input.
nlohmann::ordered_json ChatBodyFor(const ResponsesRequest& req, const nlohmann::ordered_json& history);

// An error the chat path reported about its body, renamed into the Responses
// request's terms: messages[k] becomes the input item it came from (or
// previous_response_id for history), tools[i].function.x tools[i].x,
// response_format.json_schema.x text.format.x, max_completion_tokens
// max_output_tokens. `history_size` is the number of history messages.
ApiError RenameChatError(ApiError error, const ResponsesRequest& req, size_t history_size);

}  // namespace moeserve::daemon
