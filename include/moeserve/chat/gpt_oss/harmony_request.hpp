// A chat request as a gpt-oss prompt: the harmony rendering of the
// request's messages and tools (engine::RenderHarmonyChat), with the checks
// and the tool_choice handling this family needs (docs/chat-formats.md).
//
//   tool_choice auto      tools in the developer message; the model may call any
//   tool_choice none      no tools rendered; a call in the output breaks the format
//   named, or required    the prompt ends with the call's header
//   with one tool         (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`):
//                         the model writes the arguments only
//   required, several     the prompt ends with `<|channel|>commentary to=functions.`:
//                         the model writes the name (constrained to the tools'),
//                         the server the rest of the header, the model the arguments
// Tool schemas are checked as for moe-dsa-v1 (engine::JsonGrammar: unsatisfiable
// schemas, and with strict unsupported keywords, are a 400); the arguments of
// the calls tool_choice demands are constrained by them (harmony_arguments.hpp),
// and so are the calls the model opens itself under `auto` (harmony_structure.hpp).
// response_format json_schema is rendered as harmony's structured output
// (`# Response Formats` in the developer message, under the schema's name
// and description); json_object as a format named `json_object` with the
// schema {"type":"object"}; the final answer is constrained to the schema.
//
// Thread safety: a function over values.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/chat/api_error.hpp"
#include "moeserve/chat/chat_request.hpp"
#include "moeserve/chat/gpt_oss/harmony_arguments.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/engine/harmony.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::chat {

// What the daemon serving a gpt-oss model renders with.
struct HarmonyServing {
  const engine::HfTokenizer* tokenizer = nullptr;  // the engine's; outlives every request
  engine::HarmonyTokens tokens;
  std::string current_date;  // "YYYY-MM-DD" in the system message; empty leaves it out
  // The vocabulary by bytes, for constraining the calls the server opens (null: not constrained).
  std::shared_ptr<const TokenByteIndex> token_bytes;
};

struct HarmonyPrompt {
  std::vector<int> prompt;               // ends with <|start|>assistant, then `prefill`
  std::vector<int> prefill;              // the header the server wrote (tool_choice), else empty
  std::vector<std::string> tool_names;   // the functions the output may call
  // The function whose call `prefill` opened (its arguments come next), when it names one.
  std::optional<ToolSpec> opened_call;
  // tool_choice required with several tools: the functions the model chooses
  // among after `prefill`, and the rest of the header after the name.
  std::vector<ToolSpec> call_choices;
  std::vector<int> header_tail;  // <|constrain|>json<|message|>
};

ApiResult<HarmonyPrompt> RenderHarmonyRequest(const ChatRequest& request, ReasoningEffort effort,
                                              const HarmonyServing& serving, const engine::GrammarLimits& limits);

}  // namespace moeserve::chat
