// moe-operator stops cleanly on SIGTERM and SIGINT: the handler only writes a
// byte to a pipe (async-signal-safe) and a watcher thread asks the operator to
// stop, so the process drains its workers and exits 0 instead of hanging or
// dying on the signal.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>

#include "operator_test_util.hpp"

extern char** environ;

namespace moeserve::op::testing {
namespace {

// The wait status once the child exits, or nullopt (the child is then killed)
// if it is still running after `limit`.
std::optional<int> WaitExit(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(20ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return std::nullopt;
}

void StopsCleanlyOn(int sig, int times = 1) {
  ASSERT_TRUE(std::filesystem::exists(OperatorBinary())) << "build moe-operator first: " << OperatorBinary();
  FakeCluster cluster;
  auto& server = cluster.server;
  const std::string kubeconfig = (std::filesystem::temp_directory_path() /
                                  ("moe-sig-" + std::to_string(getpid()) + "-" + std::to_string(sig) + ".yaml"))
                                     .string();
  ASSERT_TRUE(server.WriteKubeconfig(kubeconfig, "team-a"));
  pid_t pid = Spawn({OperatorBinary(), "--kubeconfig", kubeconfig, "--namespace", "team-a", "--leader-elect",
                     "--identity", "op-sig", "--metrics-addr", "0", "--health-addr", "0", "--watch-timeout", "5",
                     "--webhook-addr", "0"});
  ASSERT_GT(pid, 0);
  // Reconciling proves the handler is installed and the workers are running.
  // The bound is generous: on a loaded 2-core machine the first reconcile
  // (informer sync, leader election) alone has taken over 15 s.
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "ultra", 1, 1)));
  if (!WaitFor([&] { return server.List("statefulsets.apps", "team-a").size() == 1; }, 60s)) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "the operator never reconciled";
  }
  for (int i = 0; i < times; ++i) ASSERT_EQ(kill(pid, sig), 0);
  auto status = WaitExit(pid, 30s);
  std::filesystem::remove(kubeconfig);
  ASSERT_TRUE(status.has_value()) << "still running 30 s after signal " << sig;
  ASSERT_FALSE(WIFSIGNALED(*status)) << "killed by signal " << WTERMSIG(*status);
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

TEST(SignalShutdown, SigtermStopsTheOperatorWithExitZero) { StopsCleanlyOn(SIGTERM); }

TEST(SignalShutdown, SigintStopsTheOperatorWithExitZero) { StopsCleanlyOn(SIGINT); }

// A burst, as from a supervisor that repeats its signal: every later one is
// a byte nobody reads, never a second stop racing the first.
TEST(SignalShutdown, RepeatedSigtermsStillExitZero) { StopsCleanlyOn(SIGTERM, 50); }

}  // namespace
}  // namespace moeserve::op::testing
