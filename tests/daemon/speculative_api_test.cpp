// Speculative decoding through the daemon: the `speculative` setting and
// request field (chat completions and Responses), their refusals, the
// metrics per draft kind, and the same greedy tokens with drafts as without.
#include <gtest/gtest.h>

#include "moeserve/chat/chat_request.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/config.hpp"
#include "daemon_harness.hpp"
#include "metric_sample.hpp"

namespace moeserve::daemon {
namespace {

using testing::Chat;
using testing::Http;
using moeserve::testing::MetricSample;
using testing::StartDaemon;
using testing::TestConfig;
using json = nlohmann::json;

TEST(SpeculativeRequestField, ParsedAndRefusedClearly) {
  auto r = ParseChatRequest(R"({"messages":[{"role":"user","content":"a"}],"speculative":"lookup"})");
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->speculative.has_value());
  EXPECT_EQ(*r->speculative, engine::SpeculativeMode::kLookup);
  auto none = ParseChatRequest(R"({"messages":[{"role":"user","content":"a"}]})");
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->speculative.has_value());
  for (const char* body : {R"({"messages":[{"role":"user","content":"a"}],"speculative":"always"})",
                           R"({"messages":[{"role":"user","content":"a"}],"speculative":3})"}) {
    auto bad = ParseChatRequest(body);
    ASSERT_FALSE(bad.has_value()) << body;
    EXPECT_EQ(bad.error().status, 400);
    EXPECT_EQ(bad.error().param, "speculative") << body;
  }
}

// The trained tiny agent (models/tiny-agent/mxfp4, with its MTP layer) and
// one of its tasks: its calls and answers copy the question's numbers and
// the tools' names, so lookup drafts find what to copy, and its MTP layer
// was trained on the same data.
DaemonConfig AgentConfig() {
  DaemonConfig c = TestConfig();
  c.model = testing::SourceRoot() + "/models/tiny-agent/mxfp4";
  c.deterministic = true;  // drafted and plain passes give the same bits
  c.default_max_tokens = 96;
  c.thinking_budgets = engine::ThinkingBudgets{24, 48, 256};
  c.default_reasoning_effort = ReasoningEffort::kHigh;
  c.speculative = engine::SpeculativeMode::kAuto;  // loads the MTP layer; requests choose
  return c;
}

json AgentTask() {
  return {{"model", "tiny"},
          {"messages", json::array({{{"role", "user"}, {"content", "Could you figure out 182 + 265?"}}})},
          {"tools", json::parse(R"([
            {"type":"function","function":{"name":"calculator","parameters":{"type":"object","properties":{"expression":{"type":"string"}}}}},
            {"type":"function","function":{"name":"convert","parameters":{"type":"object","properties":{"value":{"type":"number"},"from":{"type":"string"},"to":{"type":"string"}}}}},
            {"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"key":{"type":"string"}}}}}])")},
          {"temperature", 0},
          {"seed", 7},  // the same call ids
          {"max_tokens", 96}};
}

std::string ContentOf(const testing::HttpResponse& r) {
  const json j = json::parse(r.body);
  return j["choices"][0]["message"].dump();
}

TEST(SpeculativeDaemon, SameGreedyOutputAndMetricsPerKind) {
  auto d = StartDaemon(AgentConfig());
  ASSERT_TRUE(d);
  const int port = testing::PortOf(*d);
  json body = AgentTask();
  body["speculative"] = "off";
  const auto plain = Chat(port, body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_NE(ContentOf(plain).find("calculator"), std::string::npos) << plain.body;
  for (const char* mode : {"lookup", "mtp", "auto"}) {
    body["speculative"] = mode;
    const auto drafted = Chat(port, body);
    ASSERT_EQ(drafted.status, 200) << drafted.body;
    EXPECT_EQ(ContentOf(drafted), ContentOf(plain)) << mode;
    EXPECT_EQ(json::parse(drafted.body)["usage"]["completion_tokens"], json::parse(plain.body)["usage"]["completion_tokens"])
        << mode;
  }
  // Responses forwards the field too.
  json resp = {{"model", "tiny"}, {"input", "Could you figure out 182 + 265?"}, {"speculative", "auto"},
               {"max_output_tokens", 40}, {"store", false}};
  const auto responses = Http(port, "POST", "/v1/responses", resp.dump());
  EXPECT_EQ(responses.status, 200) << responses.body;
  resp["speculative"] = "sometimes";
  EXPECT_EQ(Http(port, "POST", "/v1/responses", resp.dump()).status, 400);

  const std::string metrics = Http(port, "GET", "/metrics").body;
  const double proposed = MetricSample(metrics, "moe_speculative_draft_tokens_total{kind=\"lookup\",outcome=\"proposed\"}");
  const double accepted = MetricSample(metrics, "moe_speculative_draft_tokens_total{kind=\"lookup\",outcome=\"accepted\"}");
  const double drafts = MetricSample(metrics, "moe_speculative_drafts_total{kind=\"lookup\"}");
  EXPECT_GT(proposed, 0);
  EXPECT_LE(accepted, proposed);
  EXPECT_GT(drafts, 0);
  EXPECT_LE(drafts, proposed);
  const double mtp_proposed = MetricSample(metrics, "moe_speculative_draft_tokens_total{kind=\"mtp\",outcome=\"proposed\"}");
  const double mtp_accepted = MetricSample(metrics, "moe_speculative_draft_tokens_total{kind=\"mtp\",outcome=\"accepted\"}");
  EXPECT_GT(mtp_proposed, 0);
  EXPECT_GT(mtp_accepted, 0) << "the trained MTP layer agrees with the model now and then";
  EXPECT_LE(mtp_accepted, mtp_proposed);
  d->Shutdown(1);
}

// The generated test model has no MTP layers: a request asking for them is
// refused naming the field.
TEST(SpeculativeDaemon, MtpRequestOnAModelWithoutMtpIs400) {
  auto d = StartDaemon(TestConfig());
  ASSERT_TRUE(d);
  json body = {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"speculative", "mtp"}};
  const auto mtp = Chat(testing::PortOf(*d), body);
  EXPECT_EQ(mtp.status, 400) << mtp.body;
  EXPECT_EQ(json::parse(mtp.body)["error"]["param"], "speculative") << mtp.body;
  body["speculative"] = "lookup";
  EXPECT_EQ(Chat(testing::PortOf(*d), body).status, 200);
  d->Shutdown(1);
}

TEST(SpeculativeDaemon, MtpSettingOnAModelWithoutMtpFailsAtLoad) {
  DaemonConfig c = TestConfig();
  c.speculative = engine::SpeculativeMode::kMtp;
  auto d = Daemon::Create(c);
  ASSERT_TRUE(d) << d.error().ToString();
  ASSERT_TRUE((*d)->Start());
  auto st = (*d)->LoadModel();
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message().find("multi-token-prediction"), std::string::npos) << st.error().ToString();
  (*d)->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon
