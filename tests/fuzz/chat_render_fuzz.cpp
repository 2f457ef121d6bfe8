// The chat renderer (RenderChat, RenderToolCallJson) and the reader of
// generated tool-call spans (ParseToolCallSpan). Conversations are built from
// the input with FuzzedDataProvider, fields in the wrong roles included, so
// the renderer's refusals are exercised as well as its output. Checked:
//   - a rendered prompt starts with <|bos|>, holds only byte and special ids,
//     and shows every message's (valid UTF-8) content when decoded;
//   - a rendered tool call reads back (ParseToolCallSpan) with its id, name
//     and arguments value;
//   - any span the model might generate is read or refused, and arguments
//     reported as valid JSON are valid JSON.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "moeserve/common/json_limits.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/tokenizer.hpp"

using namespace moeserve;
using namespace moeserve::engine;

namespace {

constexpr JsonLimits kLimits{.max_bytes = 1 << 16, .max_depth = kChatJsonMaxDepth};

ChatToolCall MakeCall(FuzzedDataProvider& in) {
  ChatToolCall call;
  call.id = in.ConsumeRandomLengthString(32);
  call.name = in.ConsumeRandomLengthString(32);
  auto args = ToolCallArgumentsFromText(in.ConsumeRandomLengthString(256), kLimits, "arguments");
  if (args) call.arguments = std::move(*args);
  return call;
}

void CheckToolCallRoundTrip(const ChatToolCall& call) {
  auto span = RenderToolCallJson(call);
  if (!span) return;  // e.g. an id that is not UTF-8
  auto parsed = ParseToolCallSpan(*span);
  FUZZ_CHECK(parsed.has_value(), "a rendered call does not read back: " + *span);
  FUZZ_CHECK(parsed->id == call.id && parsed->name == call.name, "id or name changed: " + *span);
  if (parsed->arguments_valid_json) {
    const auto back = nlohmann::ordered_json::parse(parsed->arguments_text, nullptr, false);
    FUZZ_CHECK(back == call.arguments, "arguments changed: " + *span);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool stray_fields = in.ConsumeBool();  // reasoning/tool fields on any role
  std::vector<ChatMessage> messages(in.ConsumeIntegralInRange<size_t>(0, 6));
  for (ChatMessage& m : messages) {
    m.role = static_cast<ChatRole>(in.ConsumeIntegralInRange<int>(0, 3));
    m.content = in.ConsumeRandomLengthString(128);
    const bool assistant = m.role == ChatRole::kAssistant;
    if ((assistant || stray_fields) && in.ConsumeBool()) m.reasoning = in.ConsumeRandomLengthString(64);
    if (assistant || stray_fields) {
      for (size_t k = in.ConsumeIntegralInRange<size_t>(0, 2); k > 0; --k) m.tool_calls.push_back(MakeCall(in));
    }
    if (m.role == ChatRole::kTool || stray_fields) m.tool_call_id = in.ConsumeRandomLengthString(32);
  }
  std::optional<nlohmann::ordered_json> tools;
  if (in.ConsumeBool()) {
    auto parsed = ParseJsonBounded(in.ConsumeRandomLengthString(512), kLimits, "tools");
    if (parsed) tools = std::move(*parsed);
  }
  const bool generation_prompt = in.ConsumeBool();
  const std::string generated_span = in.ConsumeRemainingBytesAsString();

  auto ids = RenderChat(messages, tools ? &*tools : nullptr, generation_prompt);
  if (ids) {
    FUZZ_CHECK(!ids->empty() && ids->front() == tok::kBos, "a prompt starts with <|bos|>");
    for (int id : *ids) FUZZ_CHECK(id >= 0 && id < tok::kFirstPadding, "rendered id " + std::to_string(id));
    const std::string text = Tokenizer::Builtin(tok::kFirstPadding).Decode(*ids, /*render_specials=*/true);
    for (const ChatMessage& m : messages) {
      if (!fuzz::IsValidUtf8(m.content)) continue;
      // A tool result is rendered inside JSON, so its content appears escaped.
      std::string shown = m.content;
      if (m.role == ChatRole::kTool) {
        shown = nlohmann::ordered_json(m.content).dump();
        shown = shown.substr(1, shown.size() - 2);
      }
      FUZZ_CHECK(text.find(shown) != std::string::npos, "content missing from the prompt: " + m.content);
    }
  } else {
    FUZZ_CHECK(!ids.error().message().empty(), "a refusal says why");
  }
  for (const ChatMessage& m : messages)
    for (const ChatToolCall& call : m.tool_calls) CheckToolCallRoundTrip(call);

  auto span = ParseToolCallSpan(generated_span);
  if (span && span->arguments_valid_json) {
    FUZZ_CHECK(!nlohmann::ordered_json::parse(span->arguments_text, nullptr, false).is_discarded(),
               "arguments called valid JSON do not parse: " + span->arguments_text);
  }
  return 0;
}
