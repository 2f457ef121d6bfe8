// The harmony chat format of the gpt-oss family: how a conversation becomes
// token ids, and how the ids a model generates become reasoning, content and
// tool calls (docs/model-format.md, "Chat formats per family").
//
// A prompt is a sequence of messages, each
//   <|start|>{author}[ to={recipient}]<|channel|>{channel}[ <|constrain|>json]<|message|>{text}<|end|>
// where an assistant's tool call ends in <|call|> instead of <|end|>. What is
// rendered:
//   system     model identity, knowledge cutoff, the current date when given,
//              `Reasoning: low|medium|high`, the valid channels line (and where
//              function calls go when tools are present)
//   developer  `# Instructions` with the request's system/developer text,
//              `# Tools` with the function tools as `namespace functions {..}`
//              (JSON schemas as harmony's TypeScript-like types), and
//              `# Response Formats` with a structured-output schema; omitted
//              when there is none of these
//   user       the text
//   assistant  reasoning on analysis, content on final (on commentary, as a
//              preamble, when the message also calls tools), each call as
//              `<|channel|>commentary to=functions.NAME <|constrain|>json`
//   tool       `<|start|>functions.NAME to=assistant<|channel|>commentary`
//   generation `<|start|>assistant`
// Reasoning retention is harmony's: the reasoning of every assistant message up
// to the last final answer is dropped; reasoning after it (a tool loop still
// under way) is kept.
//
// Text is encoded with AddedTokenText::kSpecialAsText, so text that spells a
// special token ("<|end|>") stays plain text; only the renderer writes control
// tokens.
//
// Thread safety: RenderHarmonyChat is a function over values; a
// HarmonyOutputParser holds one generation's state.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::engine {

enum class HarmonyEffort { kLow, kMedium, kHigh };

// A structured-output format: the developer message ends with
// `# Response Formats\n\n## {name}\n\n// {description}\n{schema as compact JSON}`
// (the description line only when there is one), as harmony writes it.
struct HarmonyResponseFormat {
  std::string name;
  std::string description;
  nlohmann::ordered_json schema;
};

struct HarmonySystemOptions {
  std::string model_identity = "You are ChatGPT, a large language model trained by OpenAI.";
  std::string knowledge_cutoff = "2024-06";
  std::string current_date;  // "YYYY-MM-DD"; empty omits the line
  HarmonyEffort effort = HarmonyEffort::kMedium;
  std::optional<HarmonyResponseFormat> response_format;  // rendered in the developer message
};

// The control tokens' ids in a tokenizer; refused (naming the token) when one is missing.
struct HarmonyTokens {
  int start = -1, end = -1, message = -1, channel = -1, constrain = -1, return_ = -1, call = -1;
  static Result<HarmonyTokens> From(const HfTokenizer& tokenizer);
};

// One JSON schema as harmony's TypeScript-like type (`{\nlocation: string,\n}`,
// `"a" | "b"`, `string[]`, ...), written as the harmony library writes it.
// Schemas nesting deeper than kChatJsonMaxDepth are refused.
Result<std::string> HarmonySchemaType(const nlohmann::ordered_json& schema, const std::string& indent = "");

// `# Tools\n\n## functions\n\nnamespace functions {...} // namespace functions` for
// a request's `tools` array ({"type":"function","function":{...}} elements).
Result<std::string> HarmonyFunctionsSection(const nlohmann::ordered_json& tools);

// Renders a conversation (ChatMessage as chat_format.hpp defines it; system
// messages, in any position, become the developer instructions joined with
// "\n"). A tool message's tool_call_id must name an earlier call, whose
// function name becomes the tool message's author. Errors name the culprit as
// "messages[i]: ..." or "tools[i]: ...".
Result<std::vector<int>> RenderHarmonyChat(const HfTokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                           const nlohmann::ordered_json* tools, const HarmonySystemOptions& system,
                                           bool add_generation_prompt);

// The ids that end a generation: <|return|> (final answer) and <|call|> (tool call).
std::vector<int> HarmonyStopTokens(const HarmonyTokens& tokens);

// What one pushed id produced, for streaming.
struct HarmonyDelta {
  enum class Kind { kReasoning, kContent, kToolCallBegin, kToolCallArguments };
  Kind kind = Kind::kContent;
  std::string text;      // reasoning/content/arguments text; the name for kToolCallBegin
  int tool_index = -1;   // which call, for the tool-call kinds
  std::string tool_id;   // kToolCallBegin
};

struct HarmonyToolCall {
  std::string id;
  std::string name;
  std::string arguments_text;  // as generated
};

enum class HarmonyEnd {
  kRunning,     // no terminator yet
  kFinal,       // <|return|>, or <|end|> after a final message
  kToolCalls,   // <|call|>
  kCutOff,      // Finish() inside a message, or before any final answer or call
  kMalformed,   // see error()
};

// Reads generated ids one at a time. The prompt ended with `<|start|>assistant`,
// so the first header is read as an assistant's. analysis goes to reasoning,
// final to content, commentary without a recipient (a preamble meant for the
// user) to content, and a message to `functions.NAME` (a tool the request
// offered) becomes a tool call. Anything else (an unknown recipient, a header
// without a channel, an unknown channel, another author, a control token
// inside a message or text outside one) stops parsing with kMalformed and a
// message naming it; what was parsed before stays. Reasoning never reaches
// content.
class HarmonyOutputParser {
 public:
  // tool_names: the functions the request offered. new_id makes each call's id
  // (NewToolCallId when empty).
  HarmonyOutputParser(const HfTokenizer& tokenizer, HarmonyTokens tokens, std::vector<std::string> tool_names,
                      std::function<std::string()> new_id = {});

  // Consumes one id; returns what it produced (often nothing).
  std::vector<HarmonyDelta> Push(int id);
  // End of generation without a stop token (length limit): flushes held text.
  std::vector<HarmonyDelta> Finish();

  HarmonyEnd end() const { return end_; }
  const std::string& error() const { return error_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  const std::vector<HarmonyToolCall>& tool_calls() const { return tool_calls_; }
  // The function whose arguments are being generated now, for a caller that
  // constrains them by the tool's schema.
  std::optional<std::string> ArgumentsOpenFor() const;
  // A message whose text goes to content (final, or a commentary preamble) is
  // open: the next id, unless a control token, is content text. For a caller
  // that follows the content tokens (logprobs).
  bool ReadingContent() const { return state_ == State::kBody && target_ == Target::kContent; }

 private:
  enum class State { kHeader, kBody, kBetween, kDone };
  enum class Target { kReasoning, kContent, kToolArguments };
  void Fail(std::string message);
  void StartBody(std::vector<HarmonyDelta>& out);
  void Emit(std::string text, std::vector<HarmonyDelta>& out);
  void EndMessage(int terminator, std::vector<HarmonyDelta>& out);

  const HfTokenizer* tokenizer_;
  HarmonyTokens tokens_;
  std::vector<std::string> tool_names_;
  std::function<std::string()> new_id_;

  State state_ = State::kHeader;
  bool first_header_ = true;
  std::vector<int> header_;
  Target target_ = Target::kContent;
  std::optional<HfStreamDecoder> body_decoder_;
  bool saw_final_ = false;

  HarmonyEnd end_ = HarmonyEnd::kRunning;
  std::string error_;
  std::string reasoning_, content_;
  std::vector<HarmonyToolCall> tool_calls_;
};

}  // namespace moeserve::engine
