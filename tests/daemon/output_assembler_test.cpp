#include <gtest/gtest.h>

#include <random>
#include <variant>

#include "moeserve/chat/moe_dsa_v1/output_assembler.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/engine/chat_format.hpp"

namespace moeserve::daemon {
namespace {

namespace tok = engine::tok;

std::vector<std::pair<int, bool>> Tokens(std::initializer_list<std::variant<int, std::string>> parts, bool* reasoning_state = nullptr) {
  std::vector<std::pair<int, bool>> out;
  bool reasoning = true;
  for (const auto& p : parts) {
    if (std::holds_alternative<int>(p)) {
      int t = std::get<int>(p);
      if (t == tok::kEndThink) reasoning = false;
      out.push_back({t, t != tok::kEndThink && reasoning});
    } else {
      for (unsigned char c : std::get<std::string>(p)) out.push_back({c, reasoning});
    }
  }
  return out;
}

struct Collected {
  std::string reasoning, content;
  std::vector<AssembledToolCall> calls;
};

Collected Stream(OutputAssembler& a, const std::vector<std::pair<int, bool>>& tokens) {
  Collected c;
  auto add = [&](const OutputDelta& d) {
    c.reasoning += d.reasoning;
    c.content += d.content;
    for (const auto& t : d.tool_calls) {
      if (t.index >= static_cast<int>(c.calls.size())) c.calls.resize(t.index + 1);
      if (t.id) c.calls[t.index].id = *t.id;
      if (t.name) c.calls[t.index].name = *t.name;
      c.calls[t.index].arguments += t.arguments;
    }
  };
  for (auto [t, r] : tokens) add(a.OnToken(t, r));
  add(a.Finish());
  return c;
}

TEST(OutputAssembler, RoutesReasoningContentAndCalls) {
  auto tokens = Tokens({std::string("let me think"), tok::kEndThink, std::string("Hi "), tok::kToolCall,
                        std::string("{\"id\":\"call_1\",\"name\":\"f\",\"arguments\":{\"a\":{\"b\":1}}}"),
                        tok::kEndToolCall, tok::kEnd});
  OutputAssembler a;
  auto c = Stream(a, tokens);
  EXPECT_EQ(a.reasoning(), "let me think");
  EXPECT_EQ(a.content(), "Hi ");
  ASSERT_EQ(a.tool_calls().size(), 1u);
  EXPECT_EQ(a.tool_calls()[0].id, "call_1");
  EXPECT_EQ(a.tool_calls()[0].name, "f");
  EXPECT_EQ(a.tool_calls()[0].arguments, "{\"a\":{\"b\":1}}");
  EXPECT_TRUE(a.tool_calls()[0].arguments_valid);
  // streamed pieces add up to the same message
  EXPECT_EQ(c.reasoning, a.reasoning());
  EXPECT_EQ(c.content, a.content());
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].arguments, a.tool_calls()[0].arguments);
  EXPECT_EQ(c.calls[0].id, "call_1");
  EXPECT_TRUE(a.Ended());
}

TEST(OutputAssembler, CallInsideReasoningIsStillACall) {
  auto tokens = Tokens({std::string("hmm"), tok::kToolCall, std::string("{\"id\":\"call_2\",\"name\":\"g\",\"arguments\":{}}"),
                        tok::kEndToolCall, tok::kEnd});
  OutputAssembler a;
  Stream(a, tokens);
  EXPECT_EQ(a.reasoning(), "hmm");
  ASSERT_EQ(a.tool_calls().size(), 1u);
  EXPECT_EQ(a.tool_calls()[0].arguments, "{}");
}

TEST(OutputAssembler, InvalidArgumentsAreKeptAndCounted) {
  auto tokens = Tokens({tok::kEndThink, tok::kToolCall, std::string("{\"id\":\"call_3\",\"name\":\"g\",\"arguments\":{\"a\":"),
                        tok::kEnd});
  OutputAssembler a;
  auto c = Stream(a, tokens);
  ASSERT_EQ(a.tool_calls().size(), 1u);
  EXPECT_EQ(a.tool_calls()[0].arguments, "{\"a\":");
  EXPECT_EQ(a.tool_call_parse_errors(), 1);
  EXPECT_EQ(c.calls[0].arguments, a.tool_calls()[0].arguments);
}

TEST(OutputAssembler, StopStringsCutContentAndHoldBackPartialMatches) {
  OutputAssembler a({"STOP"});
  std::string streamed;
  for (auto [t, r] : Tokens({tok::kEndThink, std::string("abcST")})) streamed += a.OnToken(t, r).content;
  EXPECT_EQ(streamed, "abc");  // "ST" held back
  for (auto [t, r] : Tokens({std::string("Xy")})) streamed += a.OnToken(t, false).content;
  EXPECT_EQ(streamed, "abcSTXy");
  for (auto [t, r] : Tokens({std::string("zSTOPtail")})) streamed += a.OnToken(t, false).content;
  EXPECT_EQ(streamed, "abcSTXyz");
  EXPECT_TRUE(a.StopMatched());
  EXPECT_EQ(a.content(), "abcSTXyz");
}

// Content held back for a stop string when <|end|> comes is released with
// that token's delta, and so are its tokens' logprobs: the stream carries
// every entry the JSON answer has.
TEST(OutputAssembler, HeldBackContentsLogprobsGoOutAtTheEnd) {
  OutputAssembler a({"STOP"});
  std::string streamed;
  std::vector<int> streamed_tokens;
  for (auto [t, r] : Tokens({tok::kEndThink, std::string("ab ST"), tok::kEnd})) {
    const ContentLogprob lp{t, -0.5f, {}};
    OutputDelta d = a.OnToken(t, r, &lp);
    streamed += d.content;
    for (const auto& l : d.logprobs) streamed_tokens.push_back(l.token);
  }
  EXPECT_EQ(streamed, "ab ST");
  EXPECT_EQ(streamed_tokens, (std::vector<int>{'a', 'b', ' ', 'S', 'T'}));
  ASSERT_EQ(a.content_logprobs().size(), 5u);
  EXPECT_TRUE(a.Finish().logprobs.empty());
}

TEST(OutputAssembler, SplitsNoUtf8Character) {
  OutputAssembler a;
  a.OnToken(tok::kEndThink, false);
  auto d1 = a.OnToken(0xC3, false);
  EXPECT_EQ(d1.content, "");
  auto d2 = a.OnToken(0xA9, false);
  EXPECT_EQ(d2.content, "\xC3\xA9");
  auto d3 = a.OnToken(0xFF, false);
  EXPECT_EQ(d3.content, "\xEF\xBF\xBD");
}

// max_tokens cut a constrained call short inside its head: the call keeps the
// id the decode policy was writing (replayed from the same seed) and the name
// that the written part leaves, streamed in the call's first delta.
TEST(OutputAssembler, CallCutInsideItsNameKeepsTheNamedFunction) {
  std::mt19937_64 rng(42);
  const std::string id = engine::NewToolCallId(rng);
  const std::string head = engine::ToolCallSpanIdPrefix(id) + "\"name\":\"calcu";
  for (size_t cut : {size_t{0}, size_t{9}, head.size() - 3, head.size()}) {
    OutputAssembler a(AssemblerOptions{{}, 42, {"calculator"}});
    auto c = Stream(a, Tokens({tok::kEndThink, tok::kToolCall, head.substr(0, cut)}));
    ASSERT_EQ(a.tool_calls().size(), 1u) << cut;
    EXPECT_EQ(a.tool_calls()[0].name, "calculator") << cut;
    EXPECT_EQ(a.tool_calls()[0].id, id) << cut;
    EXPECT_EQ(a.tool_calls()[0].arguments, "");
    ASSERT_EQ(c.calls.size(), 1u);
    EXPECT_EQ(c.calls[0].name, "calculator");
    EXPECT_EQ(c.calls[0].id, id);
  }
  // Without the constraint the name is what was written (nothing here).
  OutputAssembler free_call;
  Stream(free_call, Tokens({tok::kEndThink, tok::kToolCall, head}));
  ASSERT_EQ(free_call.tool_calls().size(), 1u);
  EXPECT_EQ(free_call.tool_calls()[0].name, "");
}

TEST(OutputAssembler, CutCallOfSeveralToolsTakesTheNameItsPrefixLeaves) {
  const std::string head = engine::ToolCallSpanIdPrefix("call_x") + "\"name\":\"get_";
  OutputAssembler decided(AssemblerOptions{{}, 1, {"calculator", "get_weather"}});
  Stream(decided, Tokens({tok::kEndThink, tok::kToolCall, head}));
  ASSERT_EQ(decided.tool_calls().size(), 1u);
  EXPECT_EQ(decided.tool_calls()[0].name, "get_weather");
  EXPECT_EQ(decided.tool_calls()[0].id, "call_x");
  // Not decided yet: no call rather than one without a name.
  OutputAssembler undecided(AssemblerOptions{{}, 1, {"get_time", "get_weather"}});
  auto c = Stream(undecided, Tokens({tok::kEndThink, tok::kToolCall, head}));
  EXPECT_TRUE(undecided.tool_calls().empty());
  EXPECT_TRUE(c.calls.empty());
}

}  // namespace
}  // namespace moeserve::daemon
