// A server-kept session's history as entries (api.md "Sessions"), and the
// context policy that compresses it.
//
// Each message of a conversation becomes one or more entries: a user or
// system message one `text` entry; an assistant message a `reasoning`, a
// `text` and one `tool_call` entry per call (those present), which share the
// message's `message_seq`; a tool message one `tool_result`. A `summary`
// entry stands for the entries whose seq lies in its `replaces` range; it is
// rendered as a system message right after the session's system prompt, in
// place of what it replaces. The originals are kept (`replaced_by` names the
// summary), so nothing is ever lost, only no longer shown to the model.
//
// An exchange is a user entry with everything up to the next user entry.
// Compression (PlanCompression) folds the oldest complete exchanges, and the
// summary before them if any, into one new summary, never the system entry
// nor the newest `keep_recent` exchanges. Because an exchange runs from one
// user message to the next and every call is answered before the next user
// message, a complete exchange holds each of its calls with all its results;
// the plan is checked anyway with the one tool-chain validator
// (tool_chain.hpp) and an exchange that would break a chain is not compressed.
//
// Thread safety: free functions over values.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/engine/chat_format.hpp"

namespace moeserve::daemon {


// An image of a user message or tool result, kept once by content hash
// (stored_images.hpp): where it sits in the entry's text and what it costs.
struct EntryImage {
  int64_t at = 0;  // byte offset in `content`
  std::string hash;
  uint32_t width = 0, height = 0;
  int64_t span_tokens = 0;  // engine::ImageSpanTokens
};

struct SessionEntry {
  int64_t seq = 0;
  engine::ChatRole role = engine::ChatRole::kUser;  // a summary's role is system
  EntryKind kind = EntryKind::kText;
  double created_at = 0;                                // unix seconds
  int64_t tokens = 0;                                   // what the entry adds to the rendered prompt
  int64_t message_seq = 0;                              // the seq of its message's first entry
  std::string content;                                  // text, reasoning, tool result or summary text
  std::string call_id;                                  // tool_call: its id; tool_result: the id it answers
  std::string call_name;                                // tool_call
  nlohmann::ordered_json arguments;                     // tool_call
  std::optional<std::pair<int64_t, int64_t>> replaces;  // summary: [first_seq, last_seq]
  std::string summary_author;                           // summary: "extractive" or "model"
  std::optional<int64_t> replaced_by;                   // the summary standing for it, if any
  std::vector<EntryImage> images;                       // user text and tool_result: their images, in order

  bool active() const { return !replaced_by; }
  // Bytes the entry takes in storage (the tenant's quota counts these).
  int64_t StoredBytes() const;
  // The api.md JSON form (GET /v1/sessions/{id}).
  nlohmann::ordered_json ToJson() const;
};

// Tokens one entry adds to the rendered prompt (SessionEntry::tokens); the
// family's count (ChatDialect::EntryTokens over TranscriptOf).
using EntryTokenCounter = std::function<int64_t(const SessionEntry&)>;
// The byte-level count (chat::ByteEntryTokens): the default where no
// dialect counts (tests, and a format whose tokens are bytes).
int64_t ByteEntryTokens(const SessionEntry& entry);
// The entry as a dialect counts it (ChatDialect::EntryTokens); a view of `entry`.
chat::TranscriptEntry TranscriptOf(const SessionEntry& entry);

// The entries of `messages`, numbered from `first_seq`, each with its token
// count by `count`. System messages become system text entries. A user or
// tool message's images become its entry's `images`, counted by `vision`
// (needed when there are images).
std::vector<SessionEntry> EntriesFromMessages(const std::vector<engine::ChatMessage>& messages, int64_t first_seq,
                                              double now, const EntryTokenCounter& count = ByteEntryTokens,
                                              const engine::VisionConfig* vision = nullptr);
// The messages the model sees for entries in render order
// (ActiveInRenderOrder). An entry's images come back as ChatImages whose
// ImageInput carries the size and hash but no pixels (the store holds those).
std::vector<engine::ChatMessage> MessagesFromEntries(const std::vector<SessionEntry>& entries);
// The active entries of a session (all of them, any order) in the order
// they are rendered: system first, then summaries at the place of what they
// replace, then the rest by seq.
std::vector<SessionEntry> ActiveInRenderOrder(const std::vector<SessionEntry>& all);

// [begin, end) index ranges of the exchanges among render-ordered entries;
// system entries and summaries belong to none. Entries before the first user
// entry form an exchange of their own.
std::vector<std::pair<size_t, size_t>> SplitExchanges(const std::vector<SessionEntry>& entries);

// The extractive summary of entries: the first line of each (shortened), the
// tools called with their arguments and what they returned; an earlier
// summary's text is kept at the top. At most `max_bytes` bytes (oldest lines
// dropped first).
std::string ExtractiveSummary(const std::vector<SessionEntry>& entries, size_t max_bytes);

struct CompressionPlan {
  std::vector<int64_t> replaced;            // seqs of the active entries the summary
                                            // replaces (an earlier summary included)
  std::pair<int64_t, int64_t> range{0, 0};  // the summary's `replaces`
  std::string extractive;                   // its text until the model writes a better one
  std::vector<SessionEntry> history;        // the history afterwards, render order; the summary has seq 0
  int64_t tokens_after = 0;                 // `count` of that history plus the new entries
};

struct CompressionLimits {
  int64_t budget_tokens = 0;  // the rendered history plus the new turn must stay within this
  int keep_recent = 2;        // newest exchanges never compressed (the new turn's included)
  size_t summary_max_bytes = 2048;
};

// Tokens a history renders to (the daemon renders the prompt; tests may count
// otherwise).
using TokenCounter = std::function<int64_t(const std::vector<engine::ChatMessage>&)>;

// Nothing when `history` (render order) plus `incoming` (the new turn's
// entries) fits the budget, or when nothing may be compressed. Otherwise the
// fewest oldest exchanges whose compression fits the budget, or all that may
// be compressed when none does (the turn then fails on the context window).
// The summary entry's own `tokens` come from `entry_tokens`.
std::optional<CompressionPlan> PlanCompression(const std::vector<SessionEntry>& history,
                                               const std::vector<SessionEntry>& incoming,
                                               const CompressionLimits& limits, const TokenCounter& count,
                                               const EntryTokenCounter& entry_tokens = ByteEntryTokens);

// The fixed instruction the model gets to write a summary (low tier).
std::string_view SummarizationPrompt();
// The transcript of entries the model summarises.
std::string SummarizationTranscript(const std::vector<SessionEntry>& entries);

}  // namespace moeserve::daemon
