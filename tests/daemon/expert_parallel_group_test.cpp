// moe-daemon as a two-rank expert-parallel group, real processes on
// loopback, configured only by the variables the operator writes
// (MOE_NODE_RANK, MOE_NUM_NODES, MOE_MASTER_ADDR, MOE_LOCAL_RANKS) plus the
// group's port, secret and address. Rank 0 is ready only once rank 1 joined
// and then answers exactly as a standalone daemon does; rank 1 serves only
// its probes. Killing rank 1 makes rank 0 answer 503 and report itself
// degraded; starting rank 1 again makes the group serve again, and so does
// replacing rank 0.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kSecret = "group-secret-for-the-daemon-test";

struct Rank {
  int http_port = 0;
  pid_t pid = -1;
};

pid_t SpawnDaemon(int http_port, const std::string& state, const std::vector<std::pair<std::string, std::string>>& env) {
  const char* bin = std::getenv("MOESERVE_BINARY_DIR");
  std::string exe = std::string(bin ? bin : MOESERVE_BINARY_DIR_DEFAULT) + "/daemon/moe-daemon";
  std::filesystem::create_directories(state);
  std::vector<std::string> args = {exe, "serve", "--model", TinyModelDir(), "--port", std::to_string(http_port),
                                   "--served-model-name", "tiny", "--max-context", "4096", "--threads", "1",
                                   "--ledger-path", state + "/usage.sqlite3"};
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    std::_Exit(127);
  }
  return pid;
}

std::vector<std::pair<std::string, std::string>> GroupEnv(int rank, int rendezvous_port) {
  return {{"MOE_NUM_NODES", "2"},          {"MOE_NODE_RANK", std::to_string(rank)},
          {"MOE_MASTER_ADDR", "127.0.0.1"}, {"MOE_LOCAL_RANKS", "1"},
          {"MOE_RENDEZVOUS_PORT", std::to_string(rendezvous_port)},
          {"MOE_GROUP_SECRET", kSecret},    {"MOE_POD_IP", "127.0.0.1"},
          {"MOE_GROUP_TIMEOUT_MS", "3000"}};
}

// Polls until /readyz answers `status`, the process exits, or 60 s pass.
bool WaitReadyz(int port, pid_t pid, int status) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    if (Http(port, "GET", "/readyz").status == status) return true;
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

json Request(int max_tokens) {
  return {{"model", "tiny"}, {"messages", UserTurn("expert parallel")}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

std::string Content(const HttpResponse& r) {
  auto j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("choices")) return "<no completion: " + r.body.substr(0, 200) + ">";
  const auto& msg = j["choices"][0]["message"];
  return msg.value("reasoning_content", std::string()) + "|" + (msg["content"].is_string() ? msg["content"].get<std::string>() : "");
}

void Terminate(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  while (Clock::now() < deadline) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

double Metric(int port, const std::string& name) {
  auto r = Http(port, "GET", "/metrics");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

TEST(ExpertParallelGroup, TwoRanksServeFailAndRecover) {
  const std::string dir = ::testing::TempDir() + "/moe_ep_group_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const int rdv = FreeLoopbackPort();
  Rank r0{FreeLoopbackPort()}, r1{FreeLoopbackPort()}, solo{FreeLoopbackPort()};

  // The reference: one process holding every expert.
  solo.pid = SpawnDaemon(solo.http_port, dir + "/solo", {});
  ASSERT_TRUE(WaitReadyz(solo.http_port, solo.pid, 200));
  auto want = Chat(solo.http_port, Request(24));
  ASSERT_EQ(want.status, 200) << want.body;
  Terminate(solo.pid);

  // Rank 0 alone: up (healthz), not ready, and refusing chat with 503.
  r0.pid = SpawnDaemon(r0.http_port, dir + "/r0", GroupEnv(0, rdv));
  ASSERT_TRUE(WaitReadyz(r0.http_port, r0.pid, 503));
  EXPECT_EQ(Http(r0.http_port, "GET", "/healthz").status, 200);
  auto early = Chat(r0.http_port, Request(4));
  EXPECT_EQ(early.status, 503) << early.body;

  r1.pid = SpawnDaemon(r1.http_port, dir + "/r1", GroupEnv(1, rdv));
  ASSERT_TRUE(WaitReadyz(r0.http_port, r0.pid, 200)) << "rank 0 never saw the whole group";
  ASSERT_TRUE(WaitReadyz(r1.http_port, r1.pid, 200));
  EXPECT_EQ(Metric(r0.http_port, "moe_ep_group_connected"), 1);
  EXPECT_EQ(Metric(r0.http_port, "moe_ep_world_size"), 2);

  auto got = Chat(r0.http_port, Request(24));
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(Content(got), Content(want)) << "two ranks answered differently from one process";
  auto follower = Chat(r1.http_port, Request(4));
  EXPECT_EQ(follower.status, 503);
  EXPECT_NE(follower.body.find("rank 0"), std::string::npos) << follower.body;
  // Routing of every token is counted per rank on rank 0.
  EXPECT_GT(Metric(r0.http_port, "moe_expert_rank_load_imbalance"), 0.99);

  // Requests back to back while rank 1 dies: the first one that fails is a
  // 503 naming the lost rank, and rank 0 says it is degraded.
  auto client = std::async(std::launch::async, [&] {
    for (int i = 0; i < 400; ++i) {
      auto r = Chat(r0.http_port, Request(64));
      if (r.status != 200) return r;
    }
    return HttpResponse{0, {}, "", "every request succeeded"};
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ::kill(r1.pid, SIGKILL);
  ::waitpid(r1.pid, nullptr, 0);
  ASSERT_EQ(client.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "rank 0 hung after losing rank 1";
  auto failed = client.get();
  EXPECT_EQ(failed.status, 503) << failed.error << failed.body;
  EXPECT_TRUE(failed.body.find("rank") != std::string::npos || failed.body.find("group") != std::string::npos)
      << failed.body;
  ASSERT_TRUE(WaitReadyz(r0.http_port, r0.pid, 503));
  auto readyz = Http(r0.http_port, "GET", "/readyz");
  EXPECT_NE(readyz.body.find("degraded"), std::string::npos) << readyz.body;
  EXPECT_EQ(Metric(r0.http_port, "moe_ep_group_degraded"), 1);
  EXPECT_EQ(Chat(r0.http_port, Request(4)).status, 503);

  // Rank 1 comes back: the group serves again, with the same answer.
  r1.pid = SpawnDaemon(r1.http_port, dir + "/r1", GroupEnv(1, rdv));
  ASSERT_TRUE(WaitReadyz(r0.http_port, r0.pid, 200)) << "the group did not re-form";
  auto again = Chat(r0.http_port, Request(24));
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(Content(again), Content(want));
  EXPECT_EQ(Metric(r0.http_port, "moe_ep_group_degraded"), 0);
  EXPECT_EQ(Metric(r0.http_port, "moe_ep_group_failures_total"), 1);

  // Rank 0 itself is replaced: the surviving follower joins the new one.
  ::kill(r0.pid, SIGKILL);
  ::waitpid(r0.pid, nullptr, 0);
  r0.pid = SpawnDaemon(r0.http_port, dir + "/r0", GroupEnv(0, rdv));
  ASSERT_TRUE(WaitReadyz(r0.http_port, r0.pid, 200)) << "the follower never joined the new rank 0";
  auto after = Chat(r0.http_port, Request(24));
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(Content(after), Content(want));

  Terminate(r0.pid);
  Terminate(r1.pid);
}

TEST(ExpertParallelGroup, FollowerWithTheWrongSecretNeverJoins) {
  const std::string dir = ::testing::TempDir() + "/moe_ep_secret_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const int rdv = FreeLoopbackPort();
  Rank r0{FreeLoopbackPort()}, r1{FreeLoopbackPort()};
  r0.pid = SpawnDaemon(r0.http_port, dir + "/r0", GroupEnv(0, rdv));
  auto env = GroupEnv(1, rdv);
  for (auto& [k, v] : env)
    if (k == "MOE_GROUP_SECRET") v = "an-impostor-with-another-secret";
  r1.pid = SpawnDaemon(r1.http_port, dir + "/r1", env);
  ASSERT_TRUE(WaitReadyz(r0.http_port, r0.pid, 503));
  ASSERT_TRUE(WaitReadyz(r1.http_port, r1.pid, 503));
  // Several join attempts' worth of time: still not admitted.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_EQ(Http(r0.http_port, "GET", "/readyz").status, 503);
  auto readyz = Http(r1.http_port, "GET", "/readyz");
  EXPECT_EQ(readyz.status, 503);
  EXPECT_NE(readyz.body.find("joining"), std::string::npos) << readyz.body;
  Terminate(r1.pid);
  Terminate(r0.pid);
}

}  // namespace
}  // namespace moeserve::daemon::testing
