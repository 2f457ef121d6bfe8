// POST /v1/chat/completions bodies: parsing, validation and the mapping of
// OpenAI messages onto the engine's ChatMessage.
//
// Every refusal is an ApiError whose `param` names the culprit in the
// request's own terms ("messages[3].tool_call_id", "tools[0].function.name").
// Unknown fields are ignored, as OpenAI does. Checks that need the model or
// the deployment (context length, model name, tier budgets) happen later, in
// chat_service.cpp; this file needs nothing but the body.
//
// Thread safety: free functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/chat/api_error.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/engine.hpp"

namespace moeserve::chat {

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

struct ToolSpec {
  std::string name;
  nlohmann::ordered_json parameters;  // the function's JSON schema ({} when absent)
  bool strict = false;                // function.strict: every schema keyword must be enforced
  int index = 0;                      // in the request's tools
};

enum class ReasoningEffort { kLow, kMedium, kHigh };
std::string_view ReasoningEffortName(ReasoningEffort e);
std::optional<ReasoningEffort> ParseReasoningEffort(std::string_view s);

// An OpenAI image part ({"type":"image_url","image_url":{"url":...,
// "detail":...}}) of a user or tool message, as sent: its URL is parsed,
// fetched and decoded later (image_prompt.hpp), when the deployment's limits
// and the model are known.
struct ImagePart {
  size_t message = 0;      // index in ChatRequest::messages
  size_t text_offset = 0;  // bytes of the message's joined text parts before it
  std::string url;         // data:image/...;base64,... or http(s)://...
  std::string detail = "auto";  // low | high | auto (accepted; the tower's own resize decides the size)
  std::string param;       // "messages[2].content[1].image_url.url", for errors
};

struct ChatRequest {
  std::string model;
  std::vector<engine::ChatMessage> messages;
  std::vector<ImagePart> images;       // image parts of all messages, in order
  nlohmann::ordered_json tools;        // the request's `tools` array as sent, or null
  std::vector<ToolSpec> tool_specs;    // tools[].function, in order
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;        // kNamed only
  bool parallel_tool_calls = true;
  std::optional<int> max_tokens;       // max_completion_tokens wins over max_tokens
  float temperature = 1.0f;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  std::string user;
  bool json_object = false;            // response_format json_object or json_schema
  nlohmann::ordered_json response_schema;  // json_schema's schema (null: any object)
  nlohmann::ordered_json response_format;  // the object as sent, when json_object (formats that render it)
  bool response_schema_strict = false;     // json_schema.strict
  std::string response_schema_name;        // json_schema.name (empty for json_object)
  std::string response_schema_description; // json_schema.description, when given
  bool logprobs = false;               // log-probabilities of the content tokens
  int top_logprobs = 0;                // 0..20 alternatives per token (needs logprobs)
  std::optional<ReasoningEffort> reasoning_effort;
  std::optional<int> thinking_budget;  // extension: lowers the tier's budget
  // extension: speculative decoding for this request ("off", "mtp", "lookup",
  // "auto"); unset: the deployment's `speculative` setting.
  std::optional<engine::SpeculativeMode> speculative;
};

// The limits on a body and, separately, on every JSON text inside it that is
// parsed (tool-call arguments). The depth is the prompt's (deeper values could
// not be rendered); the default size is the largest max_body_bytes the config
// allows, since the HTTP layer enforces the configured one before parsing.
// Bodies keep the client's key order (ordered_json), whose parse is quadratic
// in the keys of one object: 256 keys per object bound an 8 MiB body to well
// under a second of parsing, and no real schema or tool call has more.
inline constexpr JsonLimits kRequestJsonLimits{.max_bytes = size_t{1} << 32,
                                               .max_depth = engine::kChatJsonMaxDepth,
                                               .max_object_keys = engine::kChatJsonMaxObjectKeys};

// Parses raw body bytes (checked as UTF-8 JSON) and validates them. A body or
// an arguments string that breaks `limits` is refused before anything walks
// it; `param` names the field it was found in ("tools[0].function.parameters",
// "messages[2].tool_calls[0].function.arguments"), the message the full path.
ApiResult<ChatRequest> ParseChatRequest(std::string_view body, const JsonLimits& limits = kRequestJsonLimits);
// Validates an already-parsed body (its depth is checked too, without recursion).
ApiResult<ChatRequest> ParseChatRequestJson(const nlohmann::ordered_json& body,
                                            const JsonLimits& limits = kRequestJsonLimits);

// api.md invalid_tool_history (the rules: tool_chain.hpp): every tool message answers an earlier assistant
// tool call (by id, at most once), and every assistant tool call is answered
// before the next user message.
ApiResult<void> ValidateToolHistory(const std::vector<engine::ChatMessage>& messages);

}  // namespace moeserve::chat
