// daemon.usage_ledger_crash: moe-daemon (its own process, the tiny model) is
// killed with SIGKILL at random points while clients keep requests running,
// and started again on the same ledger, over and over. Afterwards the ledger
// holds every acknowledged request (a 200 whose body arrived whole) and at
// most the requests whose answer never arrived on top: nothing acknowledged
// is lost and nothing is counted twice.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

#include "daemon_harness.hpp"
#include "moeserve/daemon/usage/usage_ledger.hpp"

namespace moeserve::daemon::testing {
namespace {

constexpr int kKills = 50;
constexpr int kClients = 4;
constexpr int kMaxTokens = 2;

pid_t SpawnDaemon(int port, const std::string& ledger) {
  const char* bin = std::getenv("MOESERVE_BINARY_DIR");
  std::string exe = std::string(bin ? bin : MOESERVE_BINARY_DIR_DEFAULT) + "/daemon/moe-daemon";
  std::vector<std::string> args = {exe, "serve", "--model", TinyModelDir(), "--port", std::to_string(port),
                                   "--served-model-name", "tiny", "--max-context", "4096", "--threads", "1",
                                   "--ledger-path", ledger};
  pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 2);  // fifty starts' worth of log lines say nothing here
    ::execv(exe.c_str(), argv.data());
    std::_Exit(127);
  }
  return pid;
}

bool WaitReady(int port, pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Http(port, "GET", "/readyz").status == 200) return true;
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

struct Tally {
  std::atomic<int64_t> acked_requests{0}, acked_prompt{0}, acked_completion{0};
  std::atomic<int64_t> unknown_requests{0};  // sent, no whole answer: may or may not be charged
  std::atomic<int64_t> max_prompt{0};
};

TEST(UsageLedgerCrash, KillNineUnderLoadLosesNoAcknowledgedUsageAndCountsNoneTwice) {
  const std::string dir = ::testing::TempDir() + "/moe_ledger_crash_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string ledger = dir + "/usage.sqlite3";
  std::mt19937 rng(12345);
  Tally t;
  for (int kill = 0; kill < kKills; ++kill) {
    const int port = FreeLoopbackPort();
    pid_t pid = SpawnDaemon(port, ledger);
    ASSERT_TRUE(WaitReady(port, pid)) << "moe-daemon did not become ready (start " << kill << ")";
    const int64_t acked_before = t.acked_requests.load();
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        for (int n = 0; !stop.load(); ++n) {
          json body = {{"messages", UserTurn("client " + std::to_string(c) + " request " + std::to_string(n % 7))},
                       {"max_tokens", kMaxTokens}, {"stream", (n % 3) == 0}, {"stream_options", {{"include_usage", true}}}};
          auto r = Chat(port, body);
          json usage;
          if (r.status == 200 && !body["stream"].get<bool>()) {
            json j = r.Json();
            if (!j.is_discarded()) usage = j["usage"];
          } else if (r.status == 200) {
            auto events = r.Events();
            // Acknowledged only with the usage chunk and [DONE].
            if (events.size() >= 2 && events.back() == "[DONE]") usage = json::parse(events[events.size() - 2], nullptr, false)["usage"];
          }
          if (usage.is_object()) {
            const int64_t prompt = usage["prompt_tokens"].get<int64_t>();
            t.acked_requests += 1;
            t.acked_prompt += prompt;
            t.acked_completion += usage["completion_tokens"].get<int64_t>();
            int64_t seen = t.max_prompt.load();
            while (prompt > seen && !t.max_prompt.compare_exchange_weak(seen, prompt)) {}
          } else if (r.error == "connect failed") {
            continue;  // never sent: the daemon was already gone
          } else if (r.status != 503) {
            t.unknown_requests += 1;  // connection cut, or half an answer: in doubt
          }
        }
      });
    }
    // Each start answers at least once before its kill, so every cycle puts an
    // acknowledged request at risk however slow the build is (a sanitized
    // daemon can take longer than a whole kill window for its first answer);
    // then the kill falls at a random point of the load that follows.
    const auto first_answer_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (t.acked_requests.load() <= acked_before && std::chrono::steady_clock::now() < first_answer_deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 230)(rng)));
    stop = true;  // no new requests; those in flight are cut by the kill
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    for (auto& th : clients) th.join();
  }
  auto opened = UsageLedger::Open({ledger});
  ASSERT_TRUE(opened) << opened.error().ToString();
  auto rows = (*opened)->Rows(std::nullopt);
  ASSERT_TRUE(rows);
  int64_t requests = 0, prompt = 0, completion = 0;
  for (const auto& r : *rows) {
    if (r.period != BudgetPeriod::kMonth) continue;  // each request is in one day row and one month row
    requests += r.requests;
    prompt += r.tokens.input + r.tokens.cached_input;
    completion += r.tokens.output + r.tokens.reasoning;
  }
  const int64_t unknown = t.unknown_requests.load();
  std::cout << "kills " << kKills << ", acknowledged " << t.acked_requests << ", in doubt " << unknown
            << ", charged " << requests << "\n";
  ASSERT_GT(t.acked_requests.load(), kKills) << "too little load to say anything";
  EXPECT_GE(requests, t.acked_requests.load());
  EXPECT_LE(requests, t.acked_requests.load() + unknown);
  EXPECT_GE(prompt, t.acked_prompt.load());
  EXPECT_LE(prompt, t.acked_prompt.load() + unknown * t.max_prompt.load());
  EXPECT_GE(completion, t.acked_completion.load());
  EXPECT_LE(completion, t.acked_completion.load() + unknown * kMaxTokens);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::daemon::testing
