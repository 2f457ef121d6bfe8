// daemon.responses_api: the Responses API over HTTP on the tiny model:
// tenant isolation (another tenant's response is a 404 exactly like a
// missing one, for GET, DELETE, cancel and previous_response_id), store:
// false, background runs cancelled only by their tenant, hostile bodies
// refused with a 400 naming the field while the daemon keeps serving, and
// two replicas: a response of the other replica is reached through
// forwarding (continue, read, delete).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAcme = {{"Authorization", "Bearer sk-acme-0123456789"}};
const std::map<std::string, std::string> kOther = {{"Authorization", "Bearer sk-other-0123456789"}};

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/moe_responses_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

// The body with every response id replaced, so that two refusals can be
// compared whole.
std::string WithoutIds(const std::string& body) {
  return std::regex_replace(body, std::regex("resp_[A-Za-z0-9_-]+"), "resp_ID");
}

// A schema that takes more tokens to fill than the run may make (3,900): a
// background run that is still running when the test cancels it (60 arrays
// of 32 six-digit integers). With arrays of 8 the schema filled in fewer
// tokens; once decode ran twice as fast, such a run could end before a
// cancel sent under load, and the cancel was a 400.
json LongFormat() {
  json ints = {{"type", "array"}, {"minItems", 32}, {"maxItems", 32},
               {"items", {{"type", "integer"}, {"minimum", 100000}, {"maximum", 999999}}}};
  json schema = {{"type", "object"}, {"additionalProperties", false}, {"required", {"n"}},
                 {"properties", {{"n", {{"type", "array"}, {"minItems", 60}, {"maxItems", 60}, {"items", ints}}}}}};
  return {{"format", {{"type", "json_schema"}, {"name", "numbers"}, {"strict", true}, {"schema", schema}}}};
}

class ResponsesApi : public SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    DaemonConfig c = TestConfig();
    c.api_keys_file = WriteFile("keys.yaml", R"(
keys:
  - {key: sk-acme-0123456789, tenant: acme}
  - {key: sk-other-0123456789, tenant: other}
)");
    c.sessions.replica = "r1";
    c.threads = 1;  // the background run's decode, slower: the cancels come well within it
    StartShared(c);
  }
  static HttpResponse Post(const json& body, const std::map<std::string, std::string>& key = kAcme) {
    return Http(port_, "POST", "/v1/responses", body.dump(), key);
  }
  static std::string Create(const json& body = {{"input", "hello"}, {"max_output_tokens", 8}}) {
    auto r = Post(body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.Json().value("id", "");
  }
};

TEST_F(ResponsesApi, AnotherTenantsResponseIsNotFoundExactlyLikeAMissingOne) {
  const std::string id = Create();
  ASSERT_TRUE(id.starts_with("resp_r1_")) << id;
  const std::string missing = "resp_r1_AAAAAAAAAAAAAAAAAAAAAAAA";
  for (const std::string method : {"GET", "DELETE"}) {
    auto theirs = Http(port_, method, "/v1/responses/" + id, "", kOther);
    auto none = Http(port_, method, "/v1/responses/" + missing, "", kOther);
    EXPECT_EQ(theirs.status, 404) << method << " " << theirs.body;
    EXPECT_EQ(WithoutIds(theirs.body), WithoutIds(none.body)) << method;
    EXPECT_EQ(theirs.Json()["error"]["code"], "response_not_found");
  }
  auto cancel = Http(port_, "POST", "/v1/responses/" + id + "/cancel", "", kOther);
  EXPECT_EQ(cancel.status, 404) << cancel.body;
  EXPECT_EQ(WithoutIds(cancel.body), WithoutIds(Http(port_, "POST", "/v1/responses/" + missing + "/cancel", "", kOther).body));
  auto cont = Post({{"input", "more"}, {"previous_response_id", id}, {"max_output_tokens", 8}}, kOther);
  auto cont_missing = Post({{"input", "more"}, {"previous_response_id", missing}, {"max_output_tokens", 8}}, kOther);
  EXPECT_EQ(cont.status, 404) << cont.body;
  EXPECT_EQ(cont.Json()["error"]["code"], "previous_response_not_found");
  EXPECT_EQ(cont.Json()["error"]["param"], "previous_response_id");
  EXPECT_EQ(WithoutIds(cont.body), WithoutIds(cont_missing.body));
  // The owner still has it: the other tenant's DELETE removed nothing.
  auto mine = Http(port_, "GET", "/v1/responses/" + id, "", kAcme);
  ASSERT_EQ(mine.status, 200) << mine.body;
  EXPECT_EQ(mine.Json()["id"], id);
  auto next = Post({{"input", "more"}, {"previous_response_id", id}, {"max_output_tokens", 8}});
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.Json()["previous_response_id"], id);
  EXPECT_GT(next.Json()["usage"]["input_tokens"].get<int>(), mine.Json()["usage"]["input_tokens"].get<int>());
}

TEST_F(ResponsesApi, StoreFalseKeepsNothing) {
  auto r = Post({{"input", "hello"}, {"max_output_tokens", 4}, {"store", false}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["store"], false);
  const std::string id = r.Json()["id"];
  EXPECT_EQ(Http(port_, "GET", "/v1/responses/" + id, "", kAcme).status, 404);
  EXPECT_EQ(Post({{"input", "x"}, {"previous_response_id", id}}).status, 404);
}

TEST_F(ResponsesApi, ABackgroundRunIsCancelledOnlyByItsTenant) {
  auto usage_before = Http(port_, "GET", "/v1/usage", "", kAcme).Json();
  auto r = Post({{"input", "count"}, {"text", LongFormat()}, {"max_output_tokens", 3900}, {"background", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["status"], "in_progress");
  const std::string id = r.Json()["id"];
  auto theirs = Http(port_, "POST", "/v1/responses/" + id + "/cancel", "", kOther);
  EXPECT_EQ(theirs.status, 404) << theirs.body;
  auto mine = Http(port_, "POST", "/v1/responses/" + id + "/cancel", "", kAcme);
  ASSERT_EQ(mine.status, 200) << mine.body;
  EXPECT_EQ(mine.Json()["status"], "cancelled");
  EXPECT_EQ(Http(port_, "GET", "/v1/responses/" + id, "", kAcme).Json()["status"], "cancelled");
  // The tokens made before the cancel are charged to acme.
  auto requests = [](const json& usage) {
    int n = 0;
    for (const auto& d : usage["data"])
      if (d["period"] == "day") n += d["requests"].get<int>();
    return n;
  };
  int after = requests(usage_before);
  for (int i = 0; i < 200 && after == requests(usage_before); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    after = requests(Http(port_, "GET", "/v1/usage", "", kAcme).Json());
  }
  EXPECT_EQ(after, requests(usage_before) + 1);
}

TEST_F(ResponsesApi, HostileBodiesAre400sNamingTheFieldAndTheDaemonGoesOn) {
  std::string many = R"({"input":[)";
  for (int i = 0; i < 5000; ++i) many += std::string(i ? "," : "") + R"({"role":"user","content":"x"})";
  many += "]}";
  const std::string deep = R"({"input":[{"role":"user","content":)" + std::string(50000, '[') + std::string(50000, ']') + "}]}";
  const std::pair<std::string, std::string> cases[] = {
      {many, "input"},
      {deep, "input[0].content"},
      {R"({"input":{"role":"user"}})", "input"},
      {R"({"input":[{"type":"function_call_output","call_id":["x"],"output":"1"}]})", "input[0].call_id"},
      {R"({"input":"x","tools":[{"type":"web_search_preview"}]})", "tools[0].type"},
      {R"({"input":"x","tools":{"type":"function"}})", "tools"},
      {R"({"input":"x","text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object","properties":{"a":{"type":"array","minItems":100000}}}}}})",
       "text.format.schema"},
  };
  for (const auto& [body, param] : cases) {
    auto r = Http(port_, "POST", "/v1/responses", body, kAcme);
    EXPECT_EQ(r.status, 400) << body.substr(0, 120) << " -> " << r.body.substr(0, 300);
    const std::string got = r.Json()["error"]["param"].is_string() ? r.Json()["error"]["param"].get<std::string>() : "";
    EXPECT_TRUE(got.starts_with(param)) << got << " for " << body.substr(0, 120);
  }
  EXPECT_EQ(Http(port_, "GET", "/healthz").status, 200);
  EXPECT_EQ(Post({{"input", "still here"}, {"max_output_tokens", 4}}).status, 200);
}

// Stored responses are bounded per tenant (session_tenant_quota_bytes) and,
// with the sessions, by the global cap (session_total_quota_bytes) that keeps
// room for the usage ledger on the volume.
class ResponsesQuota : public SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    DaemonConfig c = TestConfig();
    c.api_keys_file = WriteFile("quota_keys.yaml", R"(
keys:
  - {key: sk-acme-0123456789, tenant: acme}
  - {key: sk-other-0123456789, tenant: other}
)");
    c.sessions.tenant_quota_bytes = 8000;
    c.sessions.total_quota_bytes = 12000;
    StartShared(c);
  }
  // Stores responses for `key` until one is refused; that refusal.
  static HttpResponse FillUntilRefused(const std::map<std::string, std::string>& key, int& stored) {
    for (stored = 0; stored < 100; ++stored) {
      auto r = Http(port_, "POST", "/v1/responses", json{{"input", "hello"}, {"max_output_tokens", 4}}.dump(), key);
      if (r.status != 200) return r;
    }
    return {};
  }
};

TEST_F(ResponsesQuota, ATenantsQuotaThenTheGlobalCapRefuseStoring) {
  int acme = 0, other = 0;
  auto refused = FillUntilRefused(kAcme, acme);
  ASSERT_EQ(refused.status, 403) << refused.body;
  EXPECT_EQ(refused.Json()["error"]["code"], "response_quota_exceeded");
  EXPECT_EQ(refused.Json()["error"]["param"], "store");
  EXPECT_GT(acme, 0);
  // store: false still answers: nothing is kept.
  EXPECT_EQ(Http(port_, "POST", "/v1/responses", json{{"input", "x"}, {"max_output_tokens", 4}, {"store", false}}.dump(), kAcme).status,
            200);
  // Another tenant is under its own quota but reaches the global cap.
  refused = FillUntilRefused(kOther, other);
  ASSERT_EQ(refused.status, 507) << refused.body;
  EXPECT_EQ(refused.Json()["error"]["code"], "response_storage_full");
  EXPECT_LT(other, acme);
  // The sessions' cap counts the responses too: no room for a session either.
  auto session = Http(port_, "POST", "/v1/sessions", json{{"system", std::string(2000, 'x')}}.dump(), kOther);
  EXPECT_EQ(session.status, 507) << session.body;
}

class ResponsesForward : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const int pa = FreeLoopbackPort(), pb = FreeLoopbackPort();
    DaemonConfig a = TestConfig(), b = TestConfig();
    a.port = pa;
    b.port = pb;
    a.sessions.replica = "a";
    b.sessions.replica = "b";
    a.sessions.peers = {{"b", "http://127.0.0.1:" + std::to_string(pb)}};
    b.sessions.peers = {{"a", "http://127.0.0.1:" + std::to_string(pa)}};
    a_ = StartDaemon(a).release();
    b_ = StartDaemon(b).release();
  }
  static void TearDownTestSuite() {
    for (Daemon* d : {a_, b_}) {
      if (d) d->Shutdown(1);
      delete d;
    }
  }
  inline static Daemon* a_ = nullptr;
  inline static Daemon* b_ = nullptr;
};

TEST_F(ResponsesForward, AResponseOfTheOtherReplicaIsReachedThroughItsOwner) {
  const int A = PortOf(*a_), B = PortOf(*b_);
  auto first = Http(A, "POST", "/v1/responses", json{{"input", "hello"}, {"max_output_tokens", 6}}.dump());
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string id = first.Json()["id"];
  ASSERT_TRUE(id.starts_with("resp_a_")) << id;
  // Continued through b: it runs on a, where the conversation is.
  auto next = Http(B, "POST", "/v1/responses",
                   json{{"input", "more"}, {"previous_response_id", id}, {"max_output_tokens", 6}}.dump());
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_TRUE(next.Json()["id"].get<std::string>().starts_with("resp_a_")) << next.body;
  EXPECT_GT(next.Json()["usage"]["input_tokens"].get<int>(), first.Json()["usage"]["input_tokens"].get<int>());
  // Streamed through b too.
  auto streamed = Http(B, "POST", "/v1/responses",
                       json{{"input", "more"}, {"previous_response_id", id}, {"max_output_tokens", 6}, {"stream", true},
                            {"temperature", 0}}.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  // Six tokens cut the answer short: the stream ends with response.incomplete.
  // (Greedy: a sampled end-of-turn token within six would end it complete.)
  EXPECT_NE(streamed.body.find("event: response.incomplete"), std::string::npos) << streamed.body.substr(0, 400);
  // Read and deleted through b; gone on a.
  auto got = Http(B, "GET", "/v1/responses/" + id);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["id"], id);
  EXPECT_EQ(Http(B, "DELETE", "/v1/responses/" + id).status, 200);
  EXPECT_EQ(Http(A, "GET", "/v1/responses/" + id).status, 404);
  // An id naming a replica nobody knows is simply not found.
  EXPECT_EQ(Http(B, "GET", "/v1/responses/resp_zz_AAAAAAAAAAAAAAAAAAAAAAAA").status, 404);
}

}  // namespace
}  // namespace moeserve::daemon::testing
