// The serve tests every family served from a published chat template
// (Qwen3-Next's ChatML, DeepSeek-V3.2's encoding) shares: a real moe-daemon
// serving a tiny random checkpoint in the family's published layout
// (tools/reference/families/<family>.py, the family's real tokenizer files
// beside it). The model's output is noise, so these tests check what the
// daemon did with the request: the prompt it rendered (usage.prompt_tokens
// against the family's renderer), forced tool calls whose arguments satisfy
// the schema, the tool-result turn, a JSON-schema answer, streamed and
// non-streamed answers agreeing, a session, the Responses API, and the
// official `openai` client (tests/daemon/openai_template_family.mjs).
//
// A family's test file defines its traits (`Family`: the checkpoint writer,
// the served name, how its template renders a conversation) and
// instantiates the suite with them; how the family's reader routes
// well-formed output is tested on scripted token streams apart.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <unistd.h>

#include "daemon_harness.hpp"
#include "moeserve/engine/chat_pieces.hpp"
#include "moeserve/engine/json_grammar.hpp"

namespace moeserve::daemon::testing {

inline const char* kWeatherTools = R"([{"type":"function","function":{"name":"get_weather","description":"Current weather.",
  "parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Rome"]},
  "days":{"type":"integer","minimum":1,"maximum":9}},"required":["city","days"],"additionalProperties":false}}},
  {"type":"function","function":{"name":"now","parameters":{"type":"object","properties":{}}}}])";

inline engine::ChatMessage User(std::string text) {
  return {engine::ChatRole::kUser, std::move(text), std::nullopt, {}, ""};
}

// Family: static members kScript (under tools/reference/families/), kLayers,
// kServedName, kLabel (what the client script prints), and
// Render(messages, tools) -> Result<std::vector<engine::ChatPiece>> as the
// template renders a conversation with its generation prompt.
template <class Family>
class TemplateFamilyServe : public ::testing::Test {
 protected:
  static std::string Dir() {
    return ::testing::TempDir() + "/moe_daemon_" + Family::kLabel + "_ckpt_" + std::to_string(::getpid());
  }
  static void SetUpTestSuite() {
    std::filesystem::remove_all(Dir());
    const std::string cmd = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/families/" + Family::kScript +
                            " write --out " + Dir() + " --layers " + std::to_string(Family::kLayers) + " --seed 5 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    DaemonConfig c = TestConfig();
    c.model = Dir();
    c.served_model_name = Family::kServedName;
    c.max_context = 2048;
    c.cache_tokens = 8192;
    daemon_ = StartDaemon(c).release();
    port_ = daemon_ ? PortOf(*daemon_) : 0;
    auto t = engine::HfTokenizer::FromFile(Dir() + "/tokenizer.json");
    ASSERT_TRUE(t) << t.error().ToString();
    tok_ = new engine::HfTokenizer(std::move(*t));
  }
  static void TearDownTestSuite() {
    if (daemon_) daemon_->Shutdown(1);
    delete daemon_;
    daemon_ = nullptr;
    delete tok_;
    tok_ = nullptr;
    std::filesystem::remove_all(Dir());
  }
  void SetUp() override { ASSERT_NE(daemon_, nullptr); }

  static size_t RenderedTokens(const std::vector<engine::ChatMessage>& messages, const nlohmann::ordered_json* tools) {
    auto pieces = Family::Render(messages, tools);
    EXPECT_TRUE(pieces) << pieces.error().ToString();
    if (!pieces) return 0;
    auto ids = engine::EncodeChatPieces(*tok_, *pieces);
    EXPECT_TRUE(ids) << ids.error().ToString();
    return ids ? ids->size() : 0;
  }

  inline static Daemon* daemon_ = nullptr;
  inline static int port_ = 0;
  inline static engine::HfTokenizer* tok_ = nullptr;
};

TYPED_TEST_SUITE_P(TemplateFamilyServe);

TYPED_TEST_P(TemplateFamilyServe, ChatAnswersFromTheTemplatesPromptAndStreamsTheSame) {
  json body = {{"messages", UserTurn("What is 2+2?")}, {"max_tokens", 12}, {"seed", 4}};
  auto r = Chat(this->port_, body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["model"], TypeParam::kServedName);
  EXPECT_EQ(j["usage"]["prompt_tokens"], this->RenderedTokens({User("What is 2+2?")}, nullptr));
  const json& msg = j["choices"][0]["message"];
  // The low tier's budget (4) closes the think block: the rest is the answer.
  EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"], 4) << j;
  EXPECT_TRUE(msg["content"].is_string()) << j;

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto s = Chat(this->port_, body);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string content, reasoning;
  for (const auto& e : s.Events()) {
    if (e == "[DONE]") continue;
    json c = json::parse(e);
    if (c["choices"].empty()) continue;
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
      reasoning += d["reasoning_content"].get<std::string>();
  }
  EXPECT_EQ(content, msg["content"].get<std::string>());
  EXPECT_EQ(reasoning, msg["reasoning_content"].is_string() ? msg["reasoning_content"].get<std::string>() : "");
}

TYPED_TEST_P(TemplateFamilyServe, ForcedCallsHaveSchemaValidArgumentsAndTheResultTurnRenders) {
  const json tools = json::parse(kWeatherTools);
  for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    json body = {{"messages", UserTurn("Weather in Oslo?")}, {"tools", tools}, {"tool_choice", choice},
                 {"max_tokens", 120}, {"seed", 7}};
    auto r = Chat(this->port_, body);
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.Json();
    const json& msg = j["choices"][0]["message"];
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j;
    ASSERT_TRUE(msg.contains("tool_calls")) << j;
    ASSERT_EQ(msg["tool_calls"].size(), 1u) << j;
    const json& call = msg["tool_calls"][0];
    const std::string name = call["function"]["name"];
    const size_t which = name == "get_weather" ? 0 : 1;
    ASSERT_EQ(tools[which]["function"]["name"], name) << j;
    auto args = nlohmann::ordered_json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(args.is_object()) << call;
    auto valid = engine::CheckAgainstSchema(args, nlohmann::ordered_json::parse(tools[which]["function"]["parameters"].dump()));
    EXPECT_TRUE(valid) << valid.error().ToString() << " " << call;
    if (choice.is_object()) {
      EXPECT_EQ(name, "get_weather");
    }

    // The result goes back; the next turn renders the call and the result as the template does.
    json messages = UserTurn("Weather in Oslo?");
    messages.push_back(msg);
    messages.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "{\"temp\":-3}"}});
    auto next = Chat(this->port_, {{"messages", messages}, {"tools", tools}, {"max_tokens", 8}, {"seed", 1}});
    ASSERT_EQ(next.status, 200) << next.body;
    engine::ChatMessage assistant{engine::ChatRole::kAssistant,
                                  msg["content"].is_string() ? msg["content"].get<std::string>() : "",
                                  msg["reasoning_content"].is_string()
                                      ? std::optional<std::string>(msg["reasoning_content"].get<std::string>())
                                      : std::nullopt,
                                  {{call["id"], name, args}}, ""};
    engine::ChatMessage result{engine::ChatRole::kTool, "{\"temp\":-3}", std::nullopt, {}, call["id"]};
    // The tools as the request sent them (this json sorts keys).
    const nlohmann::ordered_json otools = nlohmann::ordered_json::parse(tools.dump());
    EXPECT_EQ(next.Json()["usage"]["prompt_tokens"],
              this->RenderedTokens({User("Weather in Oslo?"), assistant, result}, &otools));
  }
}

TYPED_TEST_P(TemplateFamilyServe, AJsonSchemaAnswerFollowsTheSchema) {
  json body = {{"messages", UserTurn("A city?")}, {"max_tokens", 80}, {"seed", 2},
               {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "city"}, {"strict", true},
                 {"schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}, {"enum", {"Oslo", "Rome"}}}}}},
                             {"required", {"city"}}, {"additionalProperties", false}}}}}}}};
  auto r = Chat(this->port_, body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << j;
  json answer = json::parse(j["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(answer.is_object()) << j;
  EXPECT_TRUE(answer["city"] == "Oslo" || answer["city"] == "Rome") << j;
}

TYPED_TEST_P(TemplateFamilyServe, BadRequestsAreRefusedNamingTheField) {
  json tools = json::parse(kWeatherTools);
  tools[0]["function"]["parameters"] = {{"type", "object"}, {"properties", {{"x", {{"type", "string"}, {"minLength", 5},
                                                                                   {"maxLength", 2}}}}}};
  auto r = Chat(this->port_, {{"messages", UserTurn("x")}, {"tools", tools}, {"tool_choice", "required"}});
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "tools[0].function.parameters") << r.body;
  EXPECT_EQ(Chat(this->port_, {{"messages", UserTurn("hi")}, {"max_tokens", 2}}).status, 200);
}

TYPED_TEST_P(TemplateFamilyServe, ASessionRendersItsHistoryInTheTemplate) {
  auto c = Http(this->port_, "POST", "/v1/sessions", json{{"system", "Be brief."}}.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  const std::string id = c.Json().value("id", "");
  auto turn = [&](const std::string& text) {
    return Http(this->port_, "POST", "/v1/sessions/" + id + "/chat/completions",
                json{{"messages", UserTurn(text)}, {"max_tokens", 6}, {"seed", 3}}.dump());
  };
  auto first = turn("Hi");
  ASSERT_EQ(first.status, 200) << first.body;
  const engine::ChatMessage system{engine::ChatRole::kSystem, "Be brief.", std::nullopt, {}, ""};
  EXPECT_EQ(first.Json()["usage"]["prompt_tokens"], this->RenderedTokens({system, User("Hi")}, nullptr));
  const json m = first.Json()["choices"][0]["message"];
  auto second = turn("Again");
  ASSERT_EQ(second.status, 200) << second.body;
  // The stored answer is in the next prompt; its reasoning is dropped (the template drops it before the last user turn).
  const engine::ChatMessage answer{engine::ChatRole::kAssistant, m["content"].is_string() ? m["content"].get<std::string>() : "",
                                   std::nullopt, {}, ""};
  EXPECT_EQ(second.Json()["usage"]["prompt_tokens"], this->RenderedTokens({system, User("Hi"), answer, User("Again")}, nullptr));
}

TYPED_TEST_P(TemplateFamilyServe, TheResponsesApiRendersTheSamePrompt) {
  auto r = Http(this->port_, "POST", "/v1/responses", json{{"input", "What is 2+2?"}, {"max_output_tokens", 6}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["usage"]["input_tokens"], this->RenderedTokens({User("What is 2+2?")}, nullptr)) << r.body;
}

TYPED_TEST_P(TemplateFamilyServe, OfficialOpenAiClient) {
  if (!OpenAiClientInstalled()) GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  auto run = RunOpenAiClientScript("tests/daemon/openai_template_family.mjs",
                                   this->daemon_->url() + "/v1 " + TypeParam::kLabel);
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
}

REGISTER_TYPED_TEST_SUITE_P(TemplateFamilyServe, ChatAnswersFromTheTemplatesPromptAndStreamsTheSame,
                            ForcedCallsHaveSchemaValidArgumentsAndTheResultTurnRenders, AJsonSchemaAnswerFollowsTheSchema,
                            BadRequestsAreRefusedNamingTheField, ASessionRendersItsHistoryInTheTemplate,
                            TheResponsesApiRendersTheSamePrompt, OfficialOpenAiClient);

}  // namespace moeserve::daemon::testing
