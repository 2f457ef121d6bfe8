// One stored piece of a kept conversation (a session's entry, api.md
// "Sessions") as a family's dialect counts it: the text, reasoning, call,
// result or summary it renders, without the store's bookkeeping.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "moeserve/engine/chat_format.hpp"

namespace moeserve::chat {

enum class EntryKind { kText, kReasoning, kToolCall, kToolResult, kSummary };
std::string_view EntryKindName(EntryKind kind);
std::optional<EntryKind> ParseEntryKind(std::string_view name);

// A view: the strings and arguments belong to the entry it was made from.
struct TranscriptEntry {
  engine::ChatRole role = engine::ChatRole::kUser;  // a summary's role is system
  EntryKind kind = EntryKind::kText;
  std::string_view content;    // text, reasoning, tool result or summary text
  std::string_view call_id;    // tool_call: its id; tool_result: the id it answers
  std::string_view call_name;  // tool_call
  const nlohmann::ordered_json* arguments = nullptr;  // tool_call (null reads as JSON null)
  int64_t image_tokens = 0;    // the placeholder tokens of its images
};

// The header a summary's text follows in the system message the model sees.
std::string_view SummaryHeader();

// The arguments as the client sent them (or the model wrote them): a JSON
// string value stands for text that was not JSON (chat_format.hpp), so it is
// given back as that text; anything else as compact JSON.
std::string ArgumentsText(const nlohmann::ordered_json& arguments);

// The count of a format whose tokens are UTF-8 bytes plus one per marker
// (moe-dsa-v1, chat_format.hpp): exact up to the markers an assistant
// message shares between its entries.
int64_t ByteEntryTokens(const TranscriptEntry& entry);

}  // namespace moeserve::chat
