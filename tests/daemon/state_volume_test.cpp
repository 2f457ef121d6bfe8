// daemon.state_volume: the state directory holds every tenant's sessions and
// the usage ledger.
//  - A global cap on sessions (session_total_quota_bytes), reached across
//    tenants each within its own quota, refuses further session growth with
//    507 session_storage_full while the ledger still commits.
//  - When the ledger cannot commit (here: the ledger's file may not grow,
//    RLIMIT_FSIZE with SIGXFSZ ignored, so its write fails with EFBIG as on
//    a full volume), the client gets the error and neither the end of the
//    answer nor [DONE]: no complete answer goes out uncharged.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "daemon_harness.hpp"
#include "moeserve/daemon/config.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kKeys[] = {
    {{"Authorization", "Bearer sk-t1-0123456789"}},
    {{"Authorization", "Bearer sk-t2-0123456789"}},
    {{"Authorization", "Bearer sk-t3-0123456789"}},
};
const std::map<std::string, std::string> kAdmin = {{"Authorization", "Bearer sk-admin-0123456789"}};

std::string TempDir(const std::string& name) {
  std::string d = ::testing::TempDir() + "/moe_state_volume_" + std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::string KeysFile(const std::string& dir) {
  std::string path = dir + "/keys.yaml";
  std::ofstream(path) << R"(
keys:
  - {key: sk-t1-0123456789, tenant: t1}
  - {key: sk-t2-0123456789, tenant: t2}
  - {key: sk-t3-0123456789, tenant: t3}
  - {key: sk-admin-0123456789, tenant: ops, role: admin}
)";
  return path;
}

int64_t Requests(int port, const std::string& tenant) {
  const json usage = Http(port, "GET", "/v1/usage", "", kAdmin).Json();
  int64_t n = 0;
  for (const auto& row : usage["data"])
    if (row["tenant"] == tenant && row["period"] == "month") n += row["requests"].get<int64_t>();
  return n;
}

TEST(StateVolume, AGlobalSessionCapReachedAcrossTenantsRefusesGrowthWhileTheLedgerCommits) {
  const std::string dir = TempDir("cap");
  DaemonConfig c = TestConfig();
  c.state_dir = dir;
  c.api_keys_file = KeysFile(dir);
  c.sessions.tenant_quota_bytes = 64 << 10;  // each tenant stays well within its own quota
  c.sessions.total_quota_bytes = 8000;       // two turns of 3000 bytes fit, a third does not
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  const int port = PortOf(*d);
  std::vector<HttpResponse> turns;
  for (int t = 0; t < 3; ++t) {
    auto created = Http(port, "POST", "/v1/sessions", json{{"system", "s"}}.dump(), kKeys[t]);
    ASSERT_EQ(created.status, 200) << created.body;
    const std::string id = created.Json()["id"];
    const json body = {{"messages", UserTurn(std::string(3000, static_cast<char>('a' + t)))}, {"max_tokens", 2}};
    turns.push_back(Http(port, "POST", "/v1/sessions/" + id + "/chat/completions", body.dump(), kKeys[t]));
  }
  EXPECT_EQ(turns[0].status, 200) << turns[0].body;
  EXPECT_EQ(turns[1].status, 200) << turns[1].body;
  ASSERT_EQ(turns[2].status, 507) << turns[2].body;
  EXPECT_EQ(turns[2].Json()["error"]["code"], "session_storage_full");
  EXPECT_NE(turns[2].Json()["error"]["message"].get<std::string>().find("session_total_quota_bytes"), std::string::npos);
  // The ledger beside the sessions still commits: a request without a session is served and charged.
  const int64_t before = Requests(port, "t3");
  auto plain = Chat(port, {{"messages", UserTurn("hello")}, {"max_tokens", 2}}, kKeys[2]);
  EXPECT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(Requests(port, "t3"), before + 1);
  d->Shutdown(1);
}

// The text a stream carried (reasoning and content), and whether it ended with [DONE].
struct StreamText {
  std::string text;
  bool done = false;
  std::string error;
};
StreamText ReadStream(const HttpResponse& r) {
  StreamText out;
  for (const auto& ev : r.Events()) {
    if (ev == "[DONE]") {
      out.done = true;
      continue;
    }
    const json j = json::parse(ev);
    if (j.contains("error")) out.error = j["error"]["message"];
    if (!j.contains("choices") || j["choices"].empty()) continue;
    const json& delta = j["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) out.text += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content") && delta["content"].is_string()) out.text += delta["content"].get<std::string>();
  }
  return out;
}

TEST(StateVolume, AnAnswerTheLedgerCouldNotChargeEndsWithoutItsLastDeltaOrDone) {
  const std::string dir = TempDir("ledger");
  DaemonConfig c = TestConfig();
  c.state_dir = dir;
  c.api_keys_file = KeysFile(dir);
  c.prefix_cache = false;  // both runs compute the same tokens the same way
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  const int port = PortOf(*d);
  const json body = {{"messages", UserTurn("count to ten")}, {"max_tokens", 12}, {"seed", 11}, {"stream", true},
                     {"reasoning_effort", "high"}};
  auto ok = Chat(port, body, kKeys[0]);
  ASSERT_EQ(ok.status, 200) << ok.body;
  const StreamText charged = ReadStream(ok);
  ASSERT_TRUE(charged.done) << ok.body;
  ASSERT_FALSE(charged.text.empty());
  ASSERT_EQ(Requests(port, "t1"), 1);

  // From here the ledger's files may not grow: its next commit fails.
  const std::string wal = dir + "/usage.sqlite3-wal";
  ASSERT_TRUE(std::filesystem::exists(wal));
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = static_cast<rlim_t>(std::filesystem::file_size(wal));
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto failed = Chat(port, body, kKeys[0]);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ::signal(SIGXFSZ, old_handler);

  const StreamText uncharged = ReadStream(failed);
  EXPECT_NE(uncharged.error.find("could not be recorded"), std::string::npos) << failed.body;
  EXPECT_FALSE(uncharged.done) << "no [DONE] after an answer that was not charged: " << failed.body;
  EXPECT_LT(uncharged.text.size(), charged.text.size()) << "the end of the answer was sent uncharged";
  EXPECT_EQ(charged.text.compare(0, uncharged.text.size(), uncharged.text), 0) << "the same answer, cut short";
  EXPECT_EQ(Requests(port, "t1"), 1) << "the failed request is not in the ledger";
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon::testing
