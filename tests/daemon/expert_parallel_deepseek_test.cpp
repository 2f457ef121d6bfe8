// Expert parallelism for DeepSeek-V3.2 as published (a tiny random
// checkpoint in the exact Hugging Face layout: FP8 block-scaled shards with
// their index, sigmoid group-limited routing, shared experts, DSA), at world
// size 2 over Gloo on loopback, configured only by the operator's variables:
//   - moe-run at world 1 gives the reference greedy ids;
//   - moe-run rank 0 with moe-run rank 1 gives the same ids;
//   - moe-run rank 0 with moe-daemon as rank 1 (the daemon's follower path,
//     loading its slice through the family) gives the same ids again;
//   - two moe-daemon ranks answer a greedy chat completion exactly as one
//     moe-daemon does;
// and every rank holds exactly half of the routed experts' bytes (the
// figure moe-run prints on stderr, and the follower daemon's
// moe_ep_routed_expert_bytes).
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
namespace {

const std::string kSecret = "deepseek-expert-parallel-secret!";
// Ids below 1024: valid whether the checkpoint got the npm tokenizer's vocabulary or the writer's 1024.
const std::string kPrompt = "0,17,400,99,1000,7,7,23,500,61,8,900";

Env GroupEnv(int rank, int rendezvous_port) { return testing::GroupEnv(rank, rendezvous_port, kSecret); }

std::vector<std::string> MoeRun(const std::string& model) {
  return {BinaryDir() + "/engine/moe-run", "--model", model, "--prompt-ids", kPrompt, "--print-ids",
          "--max-tokens", "8", "--ignore-eos"};
}

std::vector<std::string> Daemon(const std::string& model, int http, const std::string& state) {
  std::filesystem::create_directories(state);
  return {BinaryDir() + "/daemon/moe-daemon", "serve", "--model", model, "--port", std::to_string(http),
          "--served-model-name", "ds32", "--threads", "1", "--max-context", "4096", "--ledger-path",
          state + "/usage.sqlite3"};
}

std::string Answer(int port) {
  json body = {{"model", "ds32"}, {"messages", UserTurn("Which rank holds expert 5?")}, {"max_tokens", 12},
               {"temperature", 0}};
  auto r = Chat(port, body);
  auto j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || j.is_discarded() || !j.contains("choices")) return "<" + std::to_string(r.status) + ": " + r.body + ">";
  const auto& msg = j["choices"][0]["message"];
  return msg.value("reasoning_content", std::string()) + "|" +
         (msg["content"].is_string() ? msg["content"].get<std::string>() : "") + "|" + msg.value("tool_calls", json()).dump();
}

class ExpertParallelDeepseek : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = ::testing::TempDir() + "/moe_ep_ds32_" + std::to_string(::getpid());
    std::filesystem::remove_all(work_);
    std::filesystem::create_directories(work_);
    model_ = work_ + "/model";
    const std::string write = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/families/deepseek_v32.py write --out " +
                              model_ + " --layers 3 --index-topk 8 --seed 4";
    ASSERT_EQ(std::system(write.c_str()), 0) << write;
  }
  void TearDown() override { std::filesystem::remove_all(work_); }

  std::string work_, model_;
};

TEST_F(ExpertParallelDeepseek, MoeRunAndTheDaemonMatchOneProcessWithHalfTheExperts) {
  // World 1: the reference ids and the whole model's routed-expert bytes.
  Child solo = Child::Spawn(MoeRun(model_), {}, work_ + "/solo");
  ASSERT_EQ(solo.Wait(std::chrono::seconds(120)), 0) << solo.Err();
  const std::string want = solo.Out();
  ASSERT_EQ(std::count(want.begin(), want.end(), ','), 7) << "expected 8 ids: " << want;
  const uint64_t all = RoutedBytes(solo.Err());
  ASSERT_GT(all, 0u) << solo.Err();

  // moe-run as both ranks.
  {
    const int rdv = FreeLoopbackPort();
    Child r1 = Child::Spawn(MoeRun(model_), GroupEnv(1, rdv), work_ + "/run_r1");
    Child r0 = Child::Spawn(MoeRun(model_), GroupEnv(0, rdv), work_ + "/run_r0");
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
    std::filesystem::create_directories(work_ + "/daemon");
    // The follower's cache pool has moe-run's geometry (32768 tokens in blocks of 16).
    Child d1 = Child::Spawn({BinaryDir() + "/daemon/moe-daemon", "serve", "--model", model_, "--port", std::to_string(http),
                             "--served-model-name", "ds32", "--threads", "1", "--cache-tokens", "32768", "--block-tokens",
                             "16", "--ledger-path", work_ + "/daemon/usage.sqlite3"},
                            GroupEnv(1, rdv), work_ + "/daemon_r1");
    Child r0 = Child::Spawn(MoeRun(model_), GroupEnv(0, rdv), work_ + "/lead_r0");
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
    Child solo_daemon = Child::Spawn(Daemon(model_, http, work_ + "/solo_daemon"), {}, work_ + "/solo_daemon");
    ASSERT_TRUE(WaitReady(http, solo_daemon)) << solo_daemon.Err();
    one = Answer(http);
    solo_daemon.Kill();
    ASSERT_EQ(one.find('<'), std::string::npos) << one;
  }
  {
    const int rdv = FreeLoopbackPort(), h0 = FreeLoopbackPort(), h1 = FreeLoopbackPort();
    Child d0 = Child::Spawn(Daemon(model_, h0, work_ + "/d0"), GroupEnv(0, rdv), work_ + "/d0");
    Child d1 = Child::Spawn(Daemon(model_, h1, work_ + "/d1"), GroupEnv(1, rdv), work_ + "/d1");
    ASSERT_TRUE(WaitReady(h0, d0)) << d0.Err() << "\nrank 1:\n" << d1.Err();
    EXPECT_EQ(Answer(h0), one) << "two daemon ranks answered differently from one daemon";
    EXPECT_EQ(Metric(h0, "moe_ep_routed_expert_bytes") * 2, static_cast<double>(all));
    EXPECT_EQ(Metric(h1, "moe_ep_routed_expert_bytes") * 2, static_cast<double>(all));
    d0.Kill();
    d1.Kill();
  }
}

}  // namespace
}  // namespace moeserve::daemon::testing
