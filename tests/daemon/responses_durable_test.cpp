// daemon.responses_durable: moe-daemon (its own process, the tiny model) is
// killed with SIGKILL right after answering a stored response and while a
// background response runs, then started again on the same state
// directory: the acknowledged response is there as the client saw it and
// can be continued; the interrupted background response reads as failed
// (and cannot be cancelled), never as running forever.
#include <gtest/gtest.h>

#include <filesystem>

#include "daemon_harness.hpp"
#include "daemon_process.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(ResponsesDurable, AcknowledgedResponsesSurviveAKillAndInterruptedRunsReadAsFailed) {
  const std::string state = ::testing::TempDir() + "/moe_responses_durable_" + std::to_string(::getpid());
  std::filesystem::remove_all(state);
  std::string id, background, answered;
  {
    DaemonProcess d({"--state-dir", state});
    ASSERT_TRUE(d.WaitReady());
    auto r = Http(d.port(), "POST", "/v1/responses", json{{"input", "remember this"}, {"max_output_tokens", 6}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    id = r.Json()["id"];
    answered = r.Json()["output"].dump();
    // A run of thousands of tokens: still going when the process dies.
    json ints = {{"type", "array"}, {"minItems", 8}, {"maxItems", 8},
                 {"items", {{"type", "integer"}, {"minimum", 100000}, {"maximum", 999999}}}};
    json schema = {{"type", "object"}, {"additionalProperties", false}, {"required", {"n"}},
                   {"properties", {{"n", {{"type", "array"}, {"minItems", 60}, {"maxItems", 60}, {"items", ints}}}}}};
    auto b = Http(d.port(), "POST", "/v1/responses",
                  json{{"input", "count"}, {"max_output_tokens", 3900}, {"background", true},
                       {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}, {"strict", true}, {"schema", schema}}}}}}
                      .dump());
    ASSERT_EQ(b.status, 200) << b.body;
    background = b.Json()["id"];
    d.Kill();
  }
  DaemonProcess again({"--state-dir", state});
  ASSERT_TRUE(again.WaitReady());
  auto got = Http(again.port(), "GET", "/v1/responses/" + id);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["output"].dump(), answered);
  auto next = Http(again.port(), "POST", "/v1/responses",
                   json{{"input", "and now?"}, {"previous_response_id", id}, {"max_output_tokens", 4}}.dump());
  EXPECT_EQ(next.status, 200) << next.body;
  auto interrupted = Http(again.port(), "GET", "/v1/responses/" + background);
  ASSERT_EQ(interrupted.status, 200) << interrupted.body;
  EXPECT_EQ(interrupted.Json()["status"], "failed") << interrupted.body;
  EXPECT_FALSE(interrupted.Json()["error"].is_null());
  auto cancel = Http(again.port(), "POST", "/v1/responses/" + background + "/cancel");
  EXPECT_EQ(cancel.status, 400) << cancel.body;
  again.Kill();
  std::filesystem::remove_all(state);
}

}  // namespace
}  // namespace moeserve::daemon::testing
