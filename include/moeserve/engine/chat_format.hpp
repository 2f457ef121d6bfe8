// The chat format of model.md section 8: how a conversation becomes token ids,
// and how the body of a generated tool-call span is read back.
//
//   <|bos|>
//   [<|system|>{system}[<|tools|>{tools JSON}]<|end|>]
//   per user:       <|user|>{content}<|end|>
//   per assistant:  <|assistant|><|think|>{reasoning}<|/think|>{content}{tool calls}<|end|>
//     each call:    <|tool_call|>{"id":"..","name":"..","arguments":{..}}<|/tool_call|>
//   per tool:       <|tool|>{"tool_call_id":"..","content":".."}<|end|>
//   generation:     <|assistant|><|think|>
//
// Text between the tokens is UTF-8 bytes (ids 0-255), so text that looks like
// a special token ("<|end|>") stays plain bytes. Nothing else separates parts.
//
// JSON is written by nlohmann's dump() with no indent and ensure_ascii off,
// which fixes the escaping: `"` and `\` are escaped, \b \f \n \r \t use their
// short forms, other control characters below U+0020 become \u00XX (lowercase
// hex); `/`, DEL and all non-ASCII characters are written as raw UTF-8.
// Object keys keep the client's order (nlohmann::ordered_json). Numbers are
// re-printed by nlohmann (1.0 stays 1.0, 1e2 becomes 100.0). A prompt must
// render identically on every turn for the prefix cache to hit, which is why
// all JSON goes through this one serialiser.
//
// Decisions where model.md is silent:
// - System messages: every system message must come before the first
//   non-system message; several leading ones are joined with "\n" into the one
//   system block (agent frameworks commonly send a framework prompt plus a user
//   prompt). A system message later in the conversation is refused: the
//   format has no place for it, and moving it silently would change meaning.
// - An empty system text with no tools omits the block; tools without a
//   system message give `<|system|><|tools|>[..]<|end|>`. An empty tools
//   array counts as no tools.
// - Tool-call arguments that are valid JSON of any type render as that JSON
//   value (re-serialised compactly), so a call the model generated renders
//   back into the prompt exactly as generated; text that is not valid JSON
//   (including "") renders as a JSON string. The text is parsed once, by
//   ToolCallArgumentsFromText with the caller's limits, and the renderer
//   writes the value it returned; it never parses the text again.
// - JSON values in a prompt (tools, arguments) nest at most kChatJsonMaxDepth
//   deep: serialising recurses once per level, so RenderChat checks (without
//   recursion) and refuses deeper values instead of exhausting the stack.
// - reasoning and tool_calls are allowed only on assistant messages and
//   tool_call_id only on tool messages; anything else is refused, naming the
//   message, so a daemon mapping bug is caught instead of rendered.
// - Whether each tool result answers an earlier call (invalid_tool_history in
//   api.md) is the daemon's check, not the renderer's.
//
// Thread safety: free functions over values; NewToolCallId(rng) uses the
// caller's generator, NewToolCallId() a thread-local one.
#pragma once

#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/common/status.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::engine {

enum class ChatRole { kSystem, kUser, kAssistant, kTool };

// "system" | "developer" (OpenAI's newer name for system) | "user" |
// "assistant" | "tool"; anything else is InvalidArgument.
Result<ChatRole> ParseChatRole(std::string_view role);
std::string_view ChatRoleName(ChatRole role);

inline constexpr int kChatJsonMaxDepth = kMaxJsonDepth;
// Keys in one object of chat JSON (see JsonLimits::max_object_keys: parsing
// into ordered_json is quadratic in them).
inline constexpr size_t kChatJsonMaxObjectKeys = 256;

struct ChatToolCall {
  std::string id;
  std::string name;
  // What the call renders as: the JSON value the client's arguments held, or
  // its text as a JSON string when that was not valid JSON.
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

// The arguments value for a client's arguments text (OpenAI sends a string):
// the JSON it holds, or the text itself when it is not valid JSON. Text that
// breaks `limits` is refused (InvalidArgument, "<what>: nests ..."), not kept
// as a string: a caller that asked for limits wants to hear about it.
Result<nlohmann::ordered_json> ToolCallArgumentsFromText(std::string_view text, const JsonLimits& limits,
                                                         std::string_view what);

// An image of a user or tool message (model.md 14.5). In a user message it
// renders in place, before the content byte `at` (the images in ascending
// `at`, each at most content.size()): text parts and image parts keep their
// order. In a tool message every image renders after the result's JSON object,
// in order (`at` is not used).
struct ChatImage {
  size_t at = 0;
  ImageInput image;
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(ChatRole r, std::string c, std::optional<std::string> reasoning_text = std::nullopt,
              std::vector<ChatToolCall> calls = {}, std::string call_id = {}, std::vector<ChatImage> image_parts = {})
      : role(r), content(std::move(c)), reasoning(std::move(reasoning_text)), tool_calls(std::move(calls)),
        tool_call_id(std::move(call_id)), images(std::move(image_parts)) {}
  ChatRole role = ChatRole::kUser;
  std::string content;
  std::optional<std::string> reasoning;  // assistant only; absent renders as empty
  std::vector<ChatToolCall> tool_calls;  // assistant only
  std::string tool_call_id;              // tool only
  std::vector<ChatImage> images;         // user and tool only; needs a model with a vision tower
};

// Renders messages into token ids. `tools` is the request's `tools` array as
// the client sent it (elements {"type":"function","function":{...}}); the
// prompt carries the array of the `function` objects. nullptr, null or [] mean
// no tools. Errors name the culprit as api.md's `param` would
// ("messages[3]: ...", "tools[1]: ...").
Result<std::vector<int>> RenderChat(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json* tools,
                                    bool add_generation_prompt);
// The same with images: each renders as <|image_start|>, ImageTokenCount
// placeholders, <|image_end|> (vision.hpp) and is listed in `images`, ready
// for GenerationRequest. `vision` null: messages with images are refused
// (RenderChat's behaviour), naming the message.
struct RenderedChat {
  std::vector<int> tokens;
  std::vector<ImageSpan> images;
};
Result<RenderedChat> RenderChatWithImages(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json* tools,
                                          bool add_generation_prompt, const VisionConfig* vision);

// The compact span body of one call: {"id":"..","name":"..","arguments":..}.
Result<std::string> RenderToolCallJson(const ChatToolCall& call);

// What the engine writes right after the model opens <|tool_call|>, so that the
// model continues with "name": `{"id":"call_...",`.
std::string ToolCallSpanIdPrefix(std::string_view id);

struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments_text;  // exactly as generated, whitespace around it trimmed
  bool arguments_valid_json = false;
  bool arguments_is_object = false;  // valid JSON and an object, as OpenAI clients expect
};

// Reads the text the model generated between <|tool_call|> and <|/tool_call|>.
// The expected shape is the rendered one, {"id":"..","name":"..","arguments":X},
// and X is returned as generated even when it is not valid JSON (api.md: such a
// call is still returned and counted as a parse error), or when the closing
// brace is missing because generation stopped. Keys in another order are read
// through a full JSON parse (X is then re-serialised). Arguments nested deeper
// than kChatJsonMaxDepth count as not valid JSON (returned as generated), so
// nothing generated is parsed or re-serialised past the limit. Refused only
// when no string "id" and "name" can be found.
Result<ParsedToolCall> ParseToolCallSpan(std::string_view text);

// "call_" + 24 characters from [A-Za-z0-9], drawn from rng.
template <class UniformRandomBitGenerator>
std::string NewToolCallId(UniformRandomBitGenerator& rng) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

// Same, from a thread-local generator seeded by std::random_device.
std::string NewToolCallId();

}  // namespace moeserve::engine
