// daemon.session_forward: two daemons behind one Service. A session lives on
// the replica that created it (its id says which); a request for it that
// lands on the other replica is forwarded to the owner, streaming included,
// and an owner that cannot be reached is a 503.
#include <gtest/gtest.h>

#include "daemon_harness.hpp"
#include "session_checks.hpp"

namespace moeserve::daemon::testing {
namespace {

class SessionForward : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const int pa = FreeLoopbackPort(), pb = FreeLoopbackPort(), dead = FreeLoopbackPort();
    DaemonConfig a = TestConfig(), b = TestConfig();
    a.port = pa;
    b.port = pb;
    a.sessions.replica = "a";
    b.sessions.replica = "b";
    a.sessions.peers = {{"b", "http://127.0.0.1:" + std::to_string(pb)},
                        {"c", "http://127.0.0.1:" + std::to_string(dead)}};
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
  static int A() { return PortOf(*a_); }
  static int B() { return PortOf(*b_); }
  inline static Daemon* a_ = nullptr;
  inline static Daemon* b_ = nullptr;
};

TEST_F(SessionForward, TurnsOnTheOtherReplicaReachTheOwner) {
  auto c = Http(A(), "POST", "/v1/sessions", json{{"system", "owned by a"}}.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  const std::string id = c.Json()["id"];
  ASSERT_TRUE(id.starts_with("sess_a_")) << id;

  auto plain = Http(B(), "POST", "/v1/sessions/" + id + "/chat/completions",
                    json{{"messages", UserTurn("via b")}, {"max_tokens", 6}}.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.Json()["object"], "chat.completion");

  auto streamed = Http(B(), "POST", "/v1/sessions/" + id + "/chat/completions",
                       json{{"messages", UserTurn("streamed via b")}, {"max_tokens", 6}, {"stream", true}}.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_NE(streamed.headers["content-type"].find("text/event-stream"), std::string::npos);
  auto events = streamed.Events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");

  // Both replicas show the one session the owner keeps.
  auto via_b = Http(B(), "GET", "/v1/sessions/" + id + "?full=1");
  auto via_a = Http(A(), "GET", "/v1/sessions/" + id + "?full=1");
  ASSERT_EQ(via_b.status, 200) << via_b.body;
  EXPECT_EQ(via_a.Json()["entries"], via_b.Json()["entries"]);
  std::vector<std::string> users;
  const json entries = via_a.Json()["entries"];
  for (const auto& e : entries)
    if (e["role"] == "user") users.push_back(e["content"]);
  EXPECT_EQ(users, (std::vector<std::string>{"via b", "streamed via b"}));

  EXPECT_EQ(Http(B(), "DELETE", "/v1/sessions/" + id).status, 200);
  EXPECT_EQ(Http(A(), "GET", "/v1/sessions/" + id).status, 404);
}

TEST_F(SessionForward, EitherWayRound) {
  auto c = Http(B(), "POST", "/v1/sessions", "{}");
  ASSERT_EQ(c.status, 200) << c.body;
  const std::string id = c.Json()["id"];
  ASSERT_TRUE(id.starts_with("sess_b_")) << id;
  auto t = Http(A(), "POST", "/v1/sessions/" + id + "/chat/completions",
                json{{"messages", UserTurn("via a")}, {"max_tokens", 4}}.dump());
  EXPECT_EQ(t.status, 200) << t.body;
  // A refusal by the owner comes back as the owner said it.
  auto bad = Http(A(), "POST", "/v1/sessions/" + id + "/chat/completions", "{}");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.Json()["error"]["param"], "messages");
}

TEST_F(SessionForward, AnUnreachableOwnerIs503AndAnUnknownReplica404) {
  auto r = Http(A(), "GET", "/v1/sessions/sess_c_AAAAAAAAAAAAAAAAAAAAAAAA");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "unavailable");
  // b does not know c: the id cannot be one of its sessions.
  auto unknown = Http(B(), "GET", "/v1/sessions/sess_c_AAAAAAAAAAAAAAAAAAAAAAAA");
  EXPECT_EQ(unknown.status, 404) << unknown.body;
}

}  // namespace
}  // namespace moeserve::daemon::testing
