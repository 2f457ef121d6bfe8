// Expert parallelism for a family as published, at world size 2 over Gloo
// on loopback, configured only by the operator's variables (MOE_NUM_NODES,
// MOE_NODE_RANK, MOE_MASTER_ADDR, MOE_MASTER_PORT, MOE_EP_SECRET): the test
// every family on the shared layer graph runs (a file per family gives its
// checkpoint writer, prompt and names):
//   - two moe-run ranks decode exactly the ids one process decodes;
//   - a moe-daemon follows a moe-run rank 0 (the daemon's follower path);
//   - two moe-daemon ranks answer a greedy chat completion exactly as one
//     moe-daemon does;
// and every rank holds exactly half of the routed experts' bytes (the
// figure moe-run prints on stderr, and the daemons' moe_ep_routed_expert_bytes).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "daemon_harness.hpp"
#include "group_children.hpp"

namespace moeserve::daemon::testing {

struct ExpertParallelFamily {
  std::string label;        // folder names
  std::string secret;       // MOE_EP_SECRET (at least 32 bytes)
  std::string prompt_ids;   // moe-run's --prompt-ids, valid in the checkpoint's vocabulary
  std::string write_args;   // tools/reference/families/<script> and its arguments after --out DIR
  std::string served_name;
};

inline std::vector<std::string> MoeRun(const ExpertParallelFamily& f, const std::string& model) {
  return {BinaryDir() + "/engine/moe-run", "--model", model, "--prompt-ids", f.prompt_ids, "--print-ids",
          "--max-tokens", "8", "--ignore-eos"};
}

inline std::vector<std::string> DaemonArgs(const ExpertParallelFamily& f, const std::string& model, int http,
                                       const std::string& state) {
  std::filesystem::create_directories(state);
  return {BinaryDir() + "/daemon/moe-daemon", "serve", "--model", model, "--port", std::to_string(http),
          "--served-model-name", f.served_name, "--threads", "1", "--max-context", "4096", "--ledger-path",
          state + "/usage.sqlite3"};
}

inline std::string Answer(const ExpertParallelFamily& f, int port) {
  json body = {{"model", f.served_name}, {"messages", UserTurn("Which rank holds expert 5?")}, {"max_tokens", 12},
               {"temperature", 0}};
  auto r = Chat(port, body);
  auto j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || j.is_discarded() || !j.contains("choices")) return "<" + std::to_string(r.status) + ": " + r.body + ">";
  const auto& msg = j["choices"][0]["message"];
  return msg.value("reasoning_content", std::string()) + "|" +
         (msg["content"].is_string() ? msg["content"].get<std::string>() : "") + "|" + msg.value("tool_calls", json()).dump();
}

// Writes the family's checkpoint into a fresh folder and runs the three
// groups against one process.
inline void ExpectGroupsMatchOneProcess(const ExpertParallelFamily& f) {
  const std::string work = ::testing::TempDir() + "/moe_ep_" + f.label + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  const std::string model = work + "/model";
  const std::string write = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/families/" + f.write_args +
                            " --out " + model;
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  // World 1: the reference ids and the whole model's routed-expert bytes.
  Child solo = Child::Spawn(MoeRun(f, model), {}, work + "/solo");
  ASSERT_EQ(solo.Wait(std::chrono::seconds(120)), 0) << solo.Err();
  const std::string want = solo.Out();
  ASSERT_EQ(std::count(want.begin(), want.end(), ','), 7) << "expected 8 ids: " << want;
  const uint64_t all = RoutedBytes(solo.Err());
  ASSERT_GT(all, 0u) << solo.Err();

  // moe-run as both ranks.
  {
    const int rdv = FreeLoopbackPort();
    Child r1 = Child::Spawn(MoeRun(f, model), GroupEnv(1, rdv, f.secret), work + "/run_r1");
    Child r0 = Child::Spawn(MoeRun(f, model), GroupEnv(0, rdv, f.secret), work + "/run_r0");
    const int rc0 = r0.Wait(std::chrono::seconds(180));
    const int rc1 = r1.Wait(std::chrono::seconds(60));
    ASSERT_EQ(rc0, 0) << r0.Err();
    ASSERT_EQ(rc1, 0) << r1.Err();
    EXPECT_EQ(r0.Out(), want) << "two moe-run ranks decoded differently from one process";
    EXPECT_EQ(r1.Out(), "") << "a follower prints no ids";
    EXPECT_NE(r0.Err().find("expert-parallel rank 0 of 2"), std::string::npos) << r0.Err();
    EXPECT_NE(r1.Err().find("expert-parallel rank 1 of 2"), std::string::npos) << r1.Err();
    EXPECT_EQ(RoutedBytes(r0.Err()) * 2, all) << r0.Err();
    EXPECT_EQ(RoutedBytes(r1.Err()) * 2, all) << r1.Err();
  }

  // moe-daemon follows as rank 1 (the daemon's follower path), moe-run leads.
  {
    const int rdv = FreeLoopbackPort(), http = FreeLoopbackPort();
    std::filesystem::create_directories(work + "/daemon");
    // The follower's cache pool has moe-run's geometry (32768 tokens in blocks of 16).
    Child d1 = Child::Spawn({BinaryDir() + "/daemon/moe-daemon", "serve", "--model", model, "--port", std::to_string(http),
                             "--served-model-name", f.served_name, "--threads", "1", "--cache-tokens", "32768", "--block-tokens",
                             "16", "--ledger-path", work + "/daemon/usage.sqlite3"},
                            GroupEnv(1, rdv, f.secret), work + "/daemon_r1");
    Child r0 = Child::Spawn(MoeRun(f, model), GroupEnv(0, rdv, f.secret), work + "/lead_r0");
    const int rc0 = r0.Wait(std::chrono::seconds(180));
    EXPECT_EQ(rc0, 0) << r0.Err() << "\nfollower daemon:\n" << d1.Err();
    EXPECT_EQ(r0.Out(), want) << "moe-run with a moe-daemon follower decoded differently from one process";
    EXPECT_EQ(Metric(http, "moe_ep_world_size"), 2);
    EXPECT_EQ(Metric(http, "moe_ep_routed_expert_bytes") * 2, static_cast<double>(all)) << d1.Err();
    EXPECT_GE(Metric(http, "moe_ep_group_formations_total"), 1);
    d1.Kill();
  }

  // Two daemons: rank 0 serves the chat API, rank 1 follows.
  std::string one;
  {
    const int http = FreeLoopbackPort();
    Child solo_daemon = Child::Spawn(DaemonArgs(f, model, http, work + "/solo_daemon"), {}, work + "/solo_daemon");
    ASSERT_TRUE(WaitReady(http, solo_daemon)) << solo_daemon.Err();
    one = Answer(f, http);
    solo_daemon.Kill();
    ASSERT_EQ(one.find('<'), std::string::npos) << one;
  }
  {
    const int rdv = FreeLoopbackPort(), h0 = FreeLoopbackPort(), h1 = FreeLoopbackPort();
    Child d0 = Child::Spawn(DaemonArgs(f, model, h0, work + "/d0"), GroupEnv(0, rdv, f.secret), work + "/d0");
    Child d1 = Child::Spawn(DaemonArgs(f, model, h1, work + "/d1"), GroupEnv(1, rdv, f.secret), work + "/d1");
    ASSERT_TRUE(WaitReady(h0, d0)) << d0.Err() << "\nrank 1:\n" << d1.Err();
    EXPECT_EQ(Answer(f, h0), one) << "two daemon ranks answered differently from one daemon";
    EXPECT_EQ(Metric(h0, "moe_ep_routed_expert_bytes") * 2, static_cast<double>(all));
    EXPECT_EQ(Metric(h1, "moe_ep_routed_expert_bytes") * 2, static_cast<double>(all));
    d0.Kill();
    d1.Kill();
  }
  std::filesystem::remove_all(work);
}

}  // namespace moeserve::daemon::testing
