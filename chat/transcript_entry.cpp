#include "moeserve/chat/transcript_entry.hpp"

#include <string>

namespace moeserve::chat {

using ojson = nlohmann::ordered_json;

std::string_view EntryKindName(EntryKind kind) {
  switch (kind) {
    case EntryKind::kText:
      return "text";
    case EntryKind::kReasoning:
      return "reasoning";
    case EntryKind::kToolCall:
      return "tool_call";
    case EntryKind::kToolResult:
      return "tool_result";
    case EntryKind::kSummary:
      return "summary";
  }
  return "text";
}

std::optional<EntryKind> ParseEntryKind(std::string_view name) {
  for (EntryKind k :
       {EntryKind::kText, EntryKind::kReasoning, EntryKind::kToolCall, EntryKind::kToolResult, EntryKind::kSummary})
    if (EntryKindName(k) == name) return k;
  return std::nullopt;
}

std::string_view SummaryHeader() { return "Summary of the earlier conversation:\n"; }

// Read back through ToolCallArgumentsFromText, either form gives the same
// value, so the prompt renders the same.
std::string ArgumentsText(const ojson& arguments) {
  if (arguments.is_string()) return arguments.get<std::string>();
  return arguments.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

int64_t ByteEntryTokens(const TranscriptEntry& e) {
  const auto n = [](std::string_view s) { return static_cast<int64_t>(s.size()); };
  static const ojson kNull;
  const ojson& arguments = e.arguments ? *e.arguments : kNull;
  switch (e.kind) {
    case EntryKind::kText:
      return n(e.content) + 2 + e.image_tokens;  // <|role|> ... <|end|>
    case EntryKind::kReasoning:
      return n(e.content) + 3;
    case EntryKind::kToolCall: {
      engine::ChatToolCall c{std::string(e.call_id), std::string(e.call_name), arguments};
      auto json = engine::RenderToolCallJson(c);
      return (json ? n(*json) : n(ArgumentsText(arguments)) + n(e.call_name) + n(e.call_id)) + 2;
    }
    case EntryKind::kToolResult: {
      // The tool message body as the chat format renders it.
      const std::string body = ojson{{"tool_call_id", e.call_id}, {"content", e.content}}.dump(
          -1, ' ', false, ojson::error_handler_t::replace);
      return n(body) + 2 + e.image_tokens;
    }
    case EntryKind::kSummary:
      return n(e.content) + 1;  // joined to the system block with "\n"
  }
  return 0;
}

}  // namespace moeserve::chat
