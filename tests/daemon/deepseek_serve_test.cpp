// daemon.deepseek_serve: a real moe-daemon serving a tiny random DeepSeek-V3.2
// checkpoint in the published layout (tools/reference/families/deepseek_v32.py:
// FP8 block-scaled shards with an index, and DeepSeek's tokenizer files
// beside it: npm's DeepSeek-V3 tokenizer.json with <think> and </think> where
// V3.2's has them). The model's output is noise, so these tests check what
// the daemon did with the request: the prompt it rendered (usage.prompt_tokens
// against the published-encoding renderer), forced DSML tool calls whose
// arguments satisfy the schema, the tool-result turn, streamed and
// non-streamed answers agreeing, a session, and the official `openai` client
// (tests/daemon/openai_deepseek.mjs). How the reader routes well-formed
// output is in daemon.deepseek_output, on scripted token streams.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <unistd.h>

#include "daemon_harness.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/engine/deepseek_chat.hpp"

namespace moeserve::daemon::testing {
namespace {

const char* kWeatherTools = R"([{"type":"function","function":{"name":"get_weather","description":"Current weather.",
  "parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Rome"]},
  "days":{"type":"integer","minimum":1,"maximum":9}},"required":["city","days"],"additionalProperties":false}}},
  {"type":"function","function":{"name":"now","parameters":{"type":"object","properties":{}}}}])";

class DeepseekServe : public ::testing::Test {
 protected:
  static std::string Dir() { return ::testing::TempDir() + "/moe_daemon_deepseek_ckpt_" + std::to_string(::getpid()); }
  static void SetUpTestSuite() {
    std::filesystem::remove_all(Dir());
    const std::string cmd = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/families/deepseek_v32.py write --out " +
                            Dir() + " --layers 2 --seed 5 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    DaemonConfig c = TestConfig();
    c.model = Dir();
    c.served_model_name = "deepseek-v32-tiny";
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
    engine::DeepseekChatOptions options;
    options.tools = tools;
    auto pieces = engine::RenderDeepseekChat(messages, options);
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

engine::ChatMessage User(std::string text) { return {engine::ChatRole::kUser, std::move(text), std::nullopt, {}, ""}; }

TEST_F(DeepseekServe, ChatAnswersFromThePublishedEncodingAndStreamsTheSame) {
  json body = {{"messages", UserTurn("What is 2+2?")}, {"max_tokens", 12}, {"seed", 4}};
  auto r = Chat(port_, body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["model"], "deepseek-v32-tiny");
  EXPECT_EQ(j["usage"]["prompt_tokens"], RenderedTokens({User("What is 2+2?")}, nullptr));
  const json& msg = j["choices"][0]["message"];
  // The low tier's budget (4) closes the think block: the rest is the answer.
  EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"], 4) << j;
  EXPECT_TRUE(msg["content"].is_string()) << j;

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto s = Chat(port_, body);
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

TEST_F(DeepseekServe, ForcedCallsHaveSchemaValidArgumentsAndTheResultTurnRenders) {
  const json tools = json::parse(kWeatherTools);
  for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    json body = {{"messages", UserTurn("Weather in Oslo?")}, {"tools", tools}, {"tool_choice", choice},
                 {"max_tokens", 120}, {"seed", 7}};
    auto r = Chat(port_, body);
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

    // The result goes back; the next turn renders the call and the result as the encoding does.
    json messages = UserTurn("Weather in Oslo?");
    messages.push_back(msg);
    messages.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "{\"temp\":-3}"}});
    auto next = Chat(port_, {{"messages", messages}, {"tools", tools}, {"max_tokens", 8}, {"seed", 1}});
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
              RenderedTokens({User("Weather in Oslo?"), assistant, result}, &otools));
  }
}

TEST_F(DeepseekServe, AJsonSchemaAnswerFollowsTheSchema) {
  json body = {{"messages", UserTurn("A city?")}, {"max_tokens", 80}, {"seed", 2},
               {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "city"}, {"strict", true},
                 {"schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}, {"enum", {"Oslo", "Rome"}}}}}},
                             {"required", {"city"}}, {"additionalProperties", false}}}}}}}};
  auto r = Chat(port_, body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << j;
  json answer = json::parse(j["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(answer.is_object()) << j;
  EXPECT_TRUE(answer["city"] == "Oslo" || answer["city"] == "Rome") << j;
}

TEST_F(DeepseekServe, BadRequestsAreRefusedNamingTheField) {
  json tools = json::parse(kWeatherTools);
  tools[0]["function"]["parameters"] = {{"type", "object"}, {"properties", {{"x", {{"type", "string"}, {"minLength", 5},
                                                                                   {"maxLength", 2}}}}}};
  auto r = Chat(port_, {{"messages", UserTurn("x")}, {"tools", tools}, {"tool_choice", "required"}});
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "tools[0].function.parameters") << r.body;
  EXPECT_EQ(Chat(port_, {{"messages", UserTurn("hi")}, {"max_tokens", 2}}).status, 200);
}

TEST_F(DeepseekServe, ASessionRendersItsHistoryInTheEncoding) {
  auto c = Http(port_, "POST", "/v1/sessions", json{{"system", "Be brief."}}.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  const std::string id = c.Json().value("id", "");
  auto turn = [&](const std::string& text) {
    return Http(port_, "POST", "/v1/sessions/" + id + "/chat/completions",
                json{{"messages", UserTurn(text)}, {"max_tokens", 6}, {"seed", 3}}.dump());
  };
  auto first = turn("Hi");
  ASSERT_EQ(first.status, 200) << first.body;
  const engine::ChatMessage system{engine::ChatRole::kSystem, "Be brief.", std::nullopt, {}, ""};
  EXPECT_EQ(first.Json()["usage"]["prompt_tokens"], RenderedTokens({system, User("Hi")}, nullptr));
  const json m = first.Json()["choices"][0]["message"];
  auto second = turn("Again");
  ASSERT_EQ(second.status, 200) << second.body;
  // The stored answer is in the next prompt; its reasoning is dropped (before the last user message).
  const engine::ChatMessage answer{engine::ChatRole::kAssistant, m["content"].is_string() ? m["content"].get<std::string>() : "",
                                   std::nullopt, {}, ""};
  EXPECT_EQ(second.Json()["usage"]["prompt_tokens"], RenderedTokens({system, User("Hi"), answer, User("Again")}, nullptr));
}

TEST_F(DeepseekServe, TheResponsesApiRendersTheSamePrompt) {
  auto r = Http(port_, "POST", "/v1/responses", json{{"input", "What is 2+2?"}, {"max_output_tokens", 6}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["usage"]["input_tokens"], RenderedTokens({User("What is 2+2?")}, nullptr)) << r.body;
}

TEST_F(DeepseekServe, OfficialOpenAiClient) {
  if (!OpenAiClientInstalled()) GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  auto run = RunOpenAiClientScript("tests/daemon/openai_deepseek.mjs", daemon_->url() + "/v1");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace moeserve::daemon::testing
