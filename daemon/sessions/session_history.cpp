#include "moeserve/daemon/sessions/session_history.hpp"

#include <algorithm>
#include <deque>
#include <map>

#include "moeserve/daemon/chat_api.hpp"

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;

chat::TranscriptEntry TranscriptOf(const SessionEntry& e) {
  int64_t image_tokens = 0;
  for (const auto& image : e.images) image_tokens += image.span_tokens;
  return {e.role, e.kind, e.content, e.call_id, e.call_name, &e.arguments, image_tokens};
}

int64_t ByteEntryTokens(const SessionEntry& e) { return chat::ByteEntryTokens(TranscriptOf(e)); }

namespace {

// The first line of `text`, at most `max_bytes` bytes, cut on a UTF-8 boundary.
std::string FirstLine(std::string_view text, size_t max_bytes) {
  size_t end = std::min(text.find('\n'), text.size());
  bool cut = end > max_bytes || end < text.size();
  if (end > max_bytes) {
    end = max_bytes;
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  }
  std::string out(text.substr(0, end));
  if (cut) out += "...";
  return out;
}


}  // namespace

int64_t SessionEntry::StoredBytes() const {
  return static_cast<int64_t>(content.size() + call_id.size() + call_name.size() +
                              (kind == EntryKind::kToolCall ? ArgumentsText(arguments).size() : 0)) +
         64 +                                       // the row's fixed columns
         static_cast<int64_t>(images.size()) * 128;  // each image's reference (the file is counted once, apart)
}

ojson SessionEntry::ToJson() const {
  ojson j = {{"seq", seq},
             {"role", kind == EntryKind::kSummary ? "system" : std::string(engine::ChatRoleName(role))},
             {"kind", EntryKindName(kind)},
             {"created_at", created_at},
             {"tokens", tokens}};
  switch (kind) {
    case EntryKind::kText:
    case EntryKind::kReasoning:
      j["content"] = content;
      break;
    case EntryKind::kToolCall:
      j["tool_call"] = {{"id", call_id},
                        {"type", "function"},
                        {"function", {{"name", call_name}, {"arguments", ArgumentsText(arguments)}}}};
      break;
    case EntryKind::kToolResult:
      j["tool_call_id"] = call_id;
      j["content"] = content;
      break;
    case EntryKind::kSummary:
      j["content"] = content;
      j["replaces"] = ojson::array({replaces ? replaces->first : 0, replaces ? replaces->second : 0});
      j["author"] = summary_author;
      break;
  }
  if (replaced_by) j["replaced_by"] = *replaced_by;
  if (!images.empty()) {
    ojson list = ojson::array();
    for (const auto& image : images)
      list.push_back({{"at", image.at},
                      {"sha256", image.hash},
                      {"width", image.width},
                      {"height", image.height},
                      {"tokens", image.span_tokens}});
    j["images"] = std::move(list);
  }
  return j;
}

namespace {

std::vector<EntryImage> EntryImages(const engine::ChatMessage& m, const engine::VisionConfig* vision) {
  std::vector<EntryImage> out;
  for (const auto& image : m.images) {
    EntryImage e;
    e.at = static_cast<int64_t>(image.at);
    e.hash = image.image.content_hash;
    e.width = image.image.width;
    e.height = image.image.height;
    if (vision) e.span_tokens = engine::ImageSpanTokens(*vision, e.width, e.height).value_or(0);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

std::vector<SessionEntry> EntriesFromMessages(const std::vector<engine::ChatMessage>& messages, int64_t first_seq,
                                              double now, const EntryTokenCounter& count,
                                              const engine::VisionConfig* vision) {
  std::vector<SessionEntry> out;
  int64_t seq = first_seq;
  for (const auto& m : messages) {
    const int64_t message_seq = seq;
    auto add = [&](EntryKind kind) -> SessionEntry& {
      SessionEntry e;
      e.seq = seq++;
      e.role = m.role;
      e.kind = kind;
      e.created_at = now;
      e.message_seq = message_seq;
      out.push_back(std::move(e));
      return out.back();
    };
    switch (m.role) {
      case engine::ChatRole::kSystem:
      case engine::ChatRole::kUser: {
        auto& e = add(EntryKind::kText);
        e.content = m.content;
        e.images = EntryImages(m, vision);
        break;
      }
      case engine::ChatRole::kTool: {
        auto& e = add(EntryKind::kToolResult);
        e.content = m.content;
        e.call_id = m.tool_call_id;
        e.images = EntryImages(m, vision);
        break;
      }
      case engine::ChatRole::kAssistant:
        if (m.reasoning && !m.reasoning->empty()) add(EntryKind::kReasoning).content = *m.reasoning;
        // An answer with neither text nor calls still leaves an (empty) text
        // entry: the turn happened.
        if (!m.content.empty() || m.tool_calls.empty()) add(EntryKind::kText).content = m.content;
        for (const auto& c : m.tool_calls) {
          auto& e = add(EntryKind::kToolCall);
          e.call_id = c.id;
          e.call_name = c.name;
          e.arguments = c.arguments;
        }
        break;
    }
  }
  for (auto& e : out) e.tokens = count(e);
  return out;
}

std::vector<engine::ChatMessage> MessagesFromEntries(const std::vector<SessionEntry>& entries) {
  std::vector<engine::ChatMessage> out;
  std::optional<int64_t> open_assistant;  // message_seq of the assistant message being rebuilt
  for (const auto& e : entries) {
    if (e.kind == EntryKind::kSummary) {
      open_assistant.reset();
      out.push_back({engine::ChatRole::kSystem, std::string(SummaryHeader()) + e.content, std::nullopt, {}, ""});
      continue;
    }
    if (e.role == engine::ChatRole::kAssistant) {
      if (!open_assistant || *open_assistant != e.message_seq) {
        out.push_back({engine::ChatRole::kAssistant, "", std::nullopt, {}, ""});
        open_assistant = e.message_seq;
      }
      auto& m = out.back();
      if (e.kind == EntryKind::kReasoning)
        m.reasoning = e.content;
      else if (e.kind == EntryKind::kText)
        m.content = e.content;
      else if (e.kind == EntryKind::kToolCall)
        m.tool_calls.push_back({e.call_id, e.call_name, e.arguments});
      continue;
    }
    open_assistant.reset();
    engine::ChatMessage m;
    m.role = e.role;
    m.content = e.content;
    if (e.kind == EntryKind::kToolResult) m.tool_call_id = e.call_id;
    for (const auto& image : e.images) {
      engine::ImageInput input;
      input.width = image.width;
      input.height = image.height;
      input.content_hash = image.hash;
      m.images.push_back({static_cast<size_t>(image.at), std::move(input)});
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<SessionEntry> ActiveInRenderOrder(const std::vector<SessionEntry>& all) {
  std::vector<SessionEntry> out;
  for (const auto& e : all)
    if (e.active()) out.push_back(e);
  auto rank = [](const SessionEntry& e) {
    const bool system = e.role == engine::ChatRole::kSystem && e.kind == EntryKind::kText;
    const int64_t position = e.kind == EntryKind::kSummary && e.replaces ? e.replaces->first : e.seq;
    return std::pair<int, int64_t>(system ? 0 : 1, position);
  };
  std::stable_sort(out.begin(), out.end(),
                   [&](const SessionEntry& a, const SessionEntry& b) { return rank(a) < rank(b); });
  return out;
}

std::vector<std::pair<size_t, size_t>> SplitExchanges(const std::vector<SessionEntry>& entries) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (e.kind == EntryKind::kSummary || (e.role == engine::ChatRole::kSystem && e.kind == EntryKind::kText)) continue;
    if (out.empty() || e.role == engine::ChatRole::kUser)
      out.push_back({i, i + 1});
    else
      out.back().second = i + 1;
  }
  return out;
}

std::string ExtractiveSummary(const std::vector<SessionEntry>& entries, size_t max_bytes) {
  std::map<std::string, std::string> names;  // call id -> tool name
  for (const auto& e : entries)
    if (e.kind == EntryKind::kToolCall) names[e.call_id] = e.call_name;
  std::deque<std::string> lines;
  for (const auto& e : entries) {
    switch (e.kind) {
      case EntryKind::kSummary:
        lines.push_back(e.content);
        break;
      case EntryKind::kText:
        lines.push_back(std::string(engine::ChatRoleName(e.role)) + ": " + FirstLine(e.content, 100));
        break;
      case EntryKind::kReasoning:
        lines.push_back("assistant thought: " + FirstLine(e.content, 60));
        break;
      case EntryKind::kToolCall:
        lines.push_back("assistant called " + e.call_name + "(" + FirstLine(ArgumentsText(e.arguments), 80) + ")");
        break;
      case EntryKind::kToolResult: {
        auto it = names.find(e.call_id);
        lines.push_back((it == names.end() ? std::string("tool") : it->second) +
                        " returned: " + FirstLine(e.content, 100));
        break;
      }
    }
  }
  size_t total = 0;
  for (const auto& l : lines) total += l.size() + 1;
  while (total > max_bytes && !lines.empty()) {  // the oldest go first
    total -= lines.front().size() + 1;
    lines.pop_front();
  }
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : "\n") + l;
  if (out.size() > max_bytes) out = FirstLine(out, max_bytes);  // one line longer than the bound
  return out;
}

std::optional<CompressionPlan> PlanCompression(const std::vector<SessionEntry>& history,
                                               const std::vector<SessionEntry>& incoming,
                                               const CompressionLimits& limits, const TokenCounter& count,
                                               const EntryTokenCounter& entry_tokens) {
  auto with_incoming = [&](std::vector<SessionEntry> h) {
    h.insert(h.end(), incoming.begin(), incoming.end());
    return h;
  };
  if (count(MessagesFromEntries(with_incoming(history))) <= limits.budget_tokens) return std::nullopt;
  const auto exchanges = SplitExchanges(history);
  const bool new_exchange = !incoming.empty() && incoming.front().role == engine::ChatRole::kUser;
  const int64_t total = static_cast<int64_t>(exchanges.size()) + (new_exchange ? 1 : 0);
  const int64_t eligible =
      std::min<int64_t>(static_cast<int64_t>(exchanges.size()), total - std::max(limits.keep_recent, 0));
  if (eligible <= 0) return std::nullopt;

  // The head: system entries and earlier summaries, all before the first
  // exchange.
  std::vector<SessionEntry> system, summaries;
  for (size_t i = 0; i < exchanges.front().first; ++i) {
    (history[i].kind == EntryKind::kSummary ? summaries : system).push_back(history[i]);
  }
  std::optional<CompressionPlan> best;
  for (int64_t k = 1; k <= eligible; ++k) {
    const size_t end = exchanges[static_cast<size_t>(k - 1)].second;
    std::vector<SessionEntry> replaced = summaries;
    replaced.insert(replaced.end(), history.begin() + static_cast<long>(exchanges.front().first),
                    history.begin() + static_cast<long>(end));
    SessionEntry s;
    s.role = engine::ChatRole::kSystem;
    s.kind = EntryKind::kSummary;
    s.summary_author = "extractive";
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (const auto& e : replaced) {
      first = std::min(first, e.kind == EntryKind::kSummary && e.replaces ? e.replaces->first : e.seq);
      last = std::max(last, e.kind == EntryKind::kSummary && e.replaces ? e.replaces->second : e.seq);
    }
    s.replaces = {first, last};
    s.content = ExtractiveSummary(replaced, limits.summary_max_bytes);
    s.tokens = entry_tokens(s);
    std::vector<SessionEntry> after = system;
    after.push_back(s);
    after.insert(after.end(), history.begin() + static_cast<long>(end), history.end());
    // Whatever the exchange boundaries say, the one validator decides: a
    // plan that would leave a result without its call is not taken.
    if (FindToolChainViolation(MessagesFromEntries(with_incoming(after)))) continue;
    CompressionPlan plan;
    for (const auto& e : replaced) plan.replaced.push_back(e.seq);
    plan.range = *s.replaces;
    plan.extractive = s.content;
    plan.tokens_after = count(MessagesFromEntries(with_incoming(after)));
    plan.history = std::move(after);
    const bool fits = plan.tokens_after <= limits.budget_tokens;
    best = std::move(plan);
    if (fits) break;
  }
  return best;
}

std::string_view SummarizationPrompt() {
  return "You compress a conversation for your own later use. Write a short "
         "summary of the transcript: the user's "
         "goals, what was decided, the facts learned, each tool called with "
         "the result that matters, and what is "
         "still open. Plain sentences, no more than a few lines; do not invent "
         "anything.";
}


std::string SummarizationTranscript(const std::vector<SessionEntry>& entries) {
  std::string out;
  for (const auto& e : entries) {
    switch (e.kind) {
      case EntryKind::kSummary:
        out += "Earlier summary: " + e.content;
        break;
      case EntryKind::kText:
        out += std::string(engine::ChatRoleName(e.role)) + ": " + e.content;
        break;
      case EntryKind::kReasoning:
        out += "assistant (thinking): " + e.content;
        break;
      case EntryKind::kToolCall:
        out += "assistant calls " + e.call_name + " " + ArgumentsText(e.arguments);
        break;
      case EntryKind::kToolResult:
        out += "tool result for " + e.call_id + ": " + e.content;
        break;
    }
    out += "\n";
  }
  return out;
}

}  // namespace moeserve::daemon
