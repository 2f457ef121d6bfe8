// daemon.session_history: the tool-chain validator (tool_chain.hpp), the
// session history's entries, and the context policy's compression, including
// a property test over random agent histories.
#include "moeserve/daemon/sessions/session_history.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "moeserve/chat/chat_request.hpp"
#include "moeserve/chat/tool_chain.hpp"
#include "moeserve/daemon/chat_api.hpp"

namespace moeserve::daemon {
namespace {

using engine::ChatMessage;
using engine::ChatRole;
using Kind = ToolChainViolation::Kind;

ChatMessage User(std::string text) { return {ChatRole::kUser, std::move(text), std::nullopt, {}, ""}; }
ChatMessage System(std::string text) { return {ChatRole::kSystem, std::move(text), std::nullopt, {}, ""}; }
ChatMessage Tool(std::string id, std::string text) {
  return {ChatRole::kTool, std::move(text), std::nullopt, {}, std::move(id)};
}
ChatMessage Calls(std::vector<std::string> ids) {
  ChatMessage m{ChatRole::kAssistant, "", std::string("thinking"), {}, ""};
  for (auto& id : ids) m.tool_calls.push_back({id, "lookup", {{"q", id}}});
  return m;
}
ChatMessage Answer(std::string text) { return {ChatRole::kAssistant, std::move(text), std::nullopt, {}, ""}; }

TEST(ToolChain, WholeChainsPass) {
  EXPECT_FALSE(FindToolChainViolation(
      {System("s"), User("u"), Calls({"a", "b"}), Tool("b", "2"), Tool("a", "1"), Answer("x"), User("v")}));
  // Calls still unanswered at the end: the next request brings the results.
  EXPECT_FALSE(FindToolChainViolation({User("u"), Calls({"a"})}));
}

TEST(ToolChain, EachBrokenRuleIsNamed) {
  auto dup = FindToolChainViolation({User("u"), Calls({"a"}), Tool("a", "1"), Calls({"a"})});
  ASSERT_TRUE(dup);
  EXPECT_EQ(dup->kind, Kind::kDuplicateCallId);
  EXPECT_EQ(dup->message, 3u);

  auto unknown = FindToolChainViolation({User("u"), Tool("zz", "1")});
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->kind, Kind::kUnknownResult);
  EXPECT_EQ(unknown->message, 1u);

  auto twice = FindToolChainViolation({User("u"), Calls({"a"}), Tool("a", "1"), Tool("a", "1")});
  ASSERT_TRUE(twice);
  EXPECT_EQ(twice->kind, Kind::kAnsweredTwice);
  EXPECT_EQ(twice->message, 3u);

  auto unanswered = FindToolChainViolation({User("u"), Calls({"c", "b"}), Tool("c", "1"), User("v")});
  ASSERT_TRUE(unanswered);
  EXPECT_EQ(unanswered->kind, Kind::kUnanswered);
  EXPECT_EQ(unanswered->id, "b");
  EXPECT_EQ(unanswered->message, 1u);
  EXPECT_EQ(unanswered->call, 1u);
  EXPECT_EQ(unanswered->before, 3u);
}

TEST(ToolChain, StatelessEndpointReportsTheSameViolations) {
  auto r = ValidateToolHistory({User("u"), Calls({"c", "b"}), Tool("c", "1"), User("v")});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, "invalid_tool_history");
  EXPECT_EQ(r.error().param, "messages[1].tool_calls[1]");
  EXPECT_NE(r.error().message.find("messages[3]"), std::string::npos) << r.error().message;
}

TEST(SessionHistory, EntriesRenderAsTheMessagesDid) {
  std::vector<ChatMessage> m = {System("be brief"), User("what is 2+2"), Calls({"a", "b"}), Tool("a", "4"),
                                Tool("b", "four"),  Answer("4"),         User("thanks")};
  auto entries = EntriesFromMessages(m, 1, 0);
  // system, user, reasoning + 2 calls, 2 results, answer, user
  ASSERT_EQ(entries.size(), 9u);
  EXPECT_EQ(entries[2].kind, EntryKind::kReasoning);
  EXPECT_EQ(entries[3].message_seq, entries[2].seq);
  EXPECT_EQ(entries[4].kind, EntryKind::kToolCall);
  EXPECT_EQ(entries[5].kind, EntryKind::kToolResult);
  auto back = MessagesFromEntries(ActiveInRenderOrder(entries));
  auto a = engine::RenderChat(m, nullptr, true);
  auto b = engine::RenderChat(back, nullptr, true);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, *b);
  int64_t tokens = 1 + 2;  // <|bos|>, and <|assistant|><|think|> of the generation prompt
  for (const auto& e : entries) tokens += e.tokens;
  // Entry counts carry each marker once; an assistant message with calls has
  // no separate <|end|> accounting beyond one per message.
  EXPECT_NEAR(static_cast<double>(tokens), static_cast<double>(a->size()), 4.0);
}

TEST(SessionHistory, ExtractiveSummaryStaysWithinItsBound) {
  std::vector<ChatMessage> m;
  for (int i = 0; i < 50; ++i) {
    m.push_back(User("question number " + std::to_string(i) + " with a long tail " + std::string(300, 'x')));
    m.push_back(Answer("answer " + std::to_string(i)));
  }
  auto text = ExtractiveSummary(EntriesFromMessages(m, 1, 0), 500);
  EXPECT_LE(text.size(), 500u);
  EXPECT_NE(text.find("answer 49"), std::string::npos) << "the newest lines are kept";
  EXPECT_EQ(text.find("answer 0\n"), std::string::npos) << "the oldest go first";
}

// A random agent history, turn by turn, as a session sees it: each turn's
// new messages, with the assistant's answer appended after it.
struct RandomSession {
  std::mt19937 rng;
  int next_call = 0;
  std::vector<std::string> pending;  // calls the last answer made, not yet answered

  explicit RandomSession(unsigned seed) : rng(seed) {}
  int Pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  std::string Text(int max) {
    return std::string(static_cast<size_t>(Pick(1, max)), static_cast<char>('a' + Pick(0, 25)));
  }

  // The turn's messages (what the client posts).
  std::vector<ChatMessage> Turn() {
    std::vector<ChatMessage> out;
    std::shuffle(pending.begin(), pending.end(), rng);
    for (auto& id : pending) out.push_back(Tool(id, Text(120)));
    pending.clear();
    if (out.empty() || Pick(0, 3) == 0) out.push_back(User(Text(150)));
    return out;
  }
  // The model's answer: reasoning, maybe text, 0-3 parallel calls.
  ChatMessage Reply() {
    ChatMessage m{ChatRole::kAssistant, Pick(0, 1) ? Text(100) : "", std::nullopt, {}, ""};
    if (Pick(0, 1)) m.reasoning = Text(80);
    const int calls = Pick(0, 2) == 0 ? 0 : Pick(1, 3);
    for (int i = 0; i < calls; ++i) {
      std::string id = "call_" + std::to_string(next_call++);
      m.tool_calls.push_back({id, "tool" + std::to_string(Pick(0, 4)), {{"arg", Text(40)}}});
      pending.push_back(id);
    }
    return m;
  }
};

int64_t Render(const std::vector<ChatMessage>& m) {
  auto p = engine::RenderChat(m, nullptr, true);
  return p ? static_cast<int64_t>(p->size()) : INT64_MAX;
}

TEST(SessionHistory, CompressionAlwaysLeavesAValidHistoryWithTheNewestExchanges) {
  int plans = 0, checked_turns = 0;
  for (unsigned seed = 1; seed <= 40; ++seed) {
    RandomSession s(seed);
    std::vector<SessionEntry> all = EntriesFromMessages({System("system prompt")}, 1, 0);
    int64_t next_seq = 2;
    CompressionLimits limits;
    limits.budget_tokens = s.Pick(700, 2000);
    limits.keep_recent = s.Pick(1, 3);
    limits.summary_max_bytes = 300;
    for (int turn = 0; turn < 40; ++turn) {
      auto turn_messages = s.Turn();
      auto history = ActiveInRenderOrder(all);
      auto incoming = EntriesFromMessages(turn_messages, next_seq + 1, 0);
      auto plan = PlanCompression(history, incoming, limits, Render);
      ++checked_turns;
      if (plan) {
        ++plans;
        // 1. The one validator accepts the compressed history with the turn.
        auto h = plan->history;
        h.insert(h.end(), incoming.begin(), incoming.end());
        EXPECT_FALSE(FindToolChainViolation(MessagesFromEntries(h))) << "seed " << seed << " turn " << turn;
        // 2. Independently: a kept call keeps every result that answers it.
        std::set<std::string> kept_calls, kept_results;
        std::set<int64_t> kept;
        for (const auto& e : plan->history) {
          kept.insert(e.seq);
          if (e.kind == EntryKind::kToolCall) kept_calls.insert(e.call_id);
          if (e.kind == EntryKind::kToolResult) kept_results.insert(e.call_id);
        }
        for (const auto& e : history) {
          if (e.kind == EntryKind::kToolResult && kept_calls.contains(e.call_id)) {
            EXPECT_TRUE(kept_results.contains(e.call_id)) << "result of " << e.call_id << " dropped, its call kept";
          }
        }
        // 3. The newest exchanges (the turn's counts when it opens one) are whole.
        auto exchanges = SplitExchanges(history);
        const bool opens = incoming.front().role == ChatRole::kUser;
        const int keep_old = limits.keep_recent - (opens ? 1 : 0);
        for (int k = 0; k < keep_old && k < static_cast<int>(exchanges.size()); ++k) {
          auto [b, e] = exchanges[exchanges.size() - 1 - static_cast<size_t>(k)];
          for (size_t i = b; i < e; ++i) EXPECT_TRUE(kept.contains(history[i].seq)) << "newest exchange lost an entry";
        }
        // 4. System entries stay; the range covers exactly what is replaced.
        EXPECT_TRUE(kept.contains(1));
        for (const auto& e : history) {
          const bool replaced = std::find(plan->replaced.begin(), plan->replaced.end(), e.seq) != plan->replaced.end();
          const bool in_range = e.seq >= plan->range.first && e.seq <= plan->range.second;
          if (e.kind != EntryKind::kSummary) EXPECT_EQ(replaced, in_range) << "seq " << e.seq;
          EXPECT_NE(replaced, kept.contains(e.seq));
        }
        // Apply it, as the store does.
        SessionEntry summary;
        for (const auto& e : plan->history)
          if (e.kind == EntryKind::kSummary && e.seq == 0) summary = e;
        summary.seq = next_seq;
        for (auto& e : all)
          if (std::find(plan->replaced.begin(), plan->replaced.end(), e.seq) != plan->replaced.end())
            e.replaced_by = summary.seq;
        all.push_back(summary);
      }
      incoming = EntriesFromMessages(turn_messages, next_seq + 1, 0);
      all.insert(all.end(), incoming.begin(), incoming.end());
      next_seq += 1 + static_cast<int64_t>(incoming.size());
      auto answer = EntriesFromMessages({s.Reply()}, next_seq, 0);
      all.insert(all.end(), answer.begin(), answer.end());
      next_seq += static_cast<int64_t>(answer.size());
      // The whole stored history, originals included, is always a valid conversation too.
      std::vector<SessionEntry> originals;
      for (const auto& e : all)
        if (e.kind != EntryKind::kSummary) originals.push_back(e);
      EXPECT_FALSE(FindToolChainViolation(MessagesFromEntries(originals)));
    }
  }
  EXPECT_EQ(checked_turns, 40 * 40);
  EXPECT_GT(plans, 100) << "the budgets were meant to force many compressions";
}

TEST(SessionHistory, NothingToCompressWhenItFitsOrOnlyRecentExchangesExist) {
  auto entries = EntriesFromMessages({System("s"), User("hello"), Answer("hi")}, 1, 0);
  auto incoming = EntriesFromMessages({User("again")}, 10, 0);
  CompressionLimits limits;
  limits.budget_tokens = 10000;
  EXPECT_FALSE(PlanCompression(entries, incoming, limits, Render));
  limits.budget_tokens = 10;  // too small, but both exchanges are among the newest two
  limits.keep_recent = 2;
  EXPECT_FALSE(PlanCompression(entries, incoming, limits, Render));
  limits.keep_recent = 1;
  auto plan = PlanCompression(entries, incoming, limits, Render);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->range, (std::pair<int64_t, int64_t>(2, 3)));
}

}  // namespace
}  // namespace moeserve::daemon
