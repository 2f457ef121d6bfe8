// Two moe-operator processes with leader election against the API double:
// only the leader writes; kill it (SIGKILL, no release) and the other takes
// over once the lease runs out, and carries on reconciling.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>

#include "operator_test_util.hpp"

extern char** environ;

namespace moeserve::op::testing {
namespace {

std::string Holder(fakes::FakeApiServer& server) {
  auto lease = server.Get("leases.coordination.k8s.io", "team-a", "moe-operator-leader");
  return lease ? (*lease)["spec"].value("holderIdentity", "") : "";
}

// Identities (from User-Agent) that wrote anything but the Lease since index `from`.
std::set<std::string> Writers(fakes::FakeApiServer& server, size_t from = 0) {
  std::set<std::string> who;
  auto writes = server.Writes();
  for (size_t i = from; i < writes.size(); ++i) {
    if (writes[i].path.find("/leases/") != std::string::npos || writes[i].path.find("/leases") != std::string::npos)
      continue;
    who.insert(writes[i].user_agent);
  }
  return who;
}

TEST(LeaderElection, OnlyTheLeaderWritesAndTheOtherTakesOver) {
  if (!std::filesystem::exists(OperatorBinary())) GTEST_SKIP() << "no " << OperatorBinary();
  FakeCluster cluster;
  auto& server = cluster.server;
  const std::string kubeconfig =
      (std::filesystem::temp_directory_path() / ("moe-le-" + std::to_string(getpid()) + ".yaml")).string();
  ASSERT_TRUE(server.WriteKubeconfig(kubeconfig, "team-a"));
  auto start = [&](const std::string& identity) {
    return Spawn({OperatorBinary(), "--kubeconfig", kubeconfig, "--namespace", "team-a", "--leader-elect",
                  "--identity", identity, "--lease-duration", "2", "--renew-deadline", "1.5", "--retry-period",
                  "0.2", "--metrics-addr", "0", "--health-addr", "0", "--watch-timeout", "5",
                  "--webhook-addr", "0"});  // two replicas on one host cannot both bind :9443 (quota_replicas tests the webhook)
  };
  pid_t a = start("op-a");
  ASSERT_GT(a, 0);
  ASSERT_TRUE(WaitFor([&] { return Holder(server) == "op-a"; }, 10s)) << "op-a never led";
  pid_t b = start("op-b");
  ASSERT_GT(b, 0);

  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "ultra", 1, 1)));
  ASSERT_TRUE(WaitFor([&] { return server.List("statefulsets.apps", "team-a").size() == 1; }, 10s));
  ASSERT_TRUE(WaitFor([&] { return StatusOf(server, "team-a", "ultra").value("phase", "") == "Pulling"; }, 10s));
  std::this_thread::sleep_for(500ms);  // op-b has had time to act, were it to
  EXPECT_EQ(Writers(server), std::set<std::string>{"moe-operator/op-a"});
  EXPECT_EQ(Holder(server), "op-a");

  // Kill the leader without letting it release the lease.
  const size_t writes_at_kill = server.Writes().size();
  kill(a, SIGKILL);
  waitpid(a, nullptr, 0);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return Holder(server) == "op-b"; }, 10s)) << "op-b never took over";
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  // It waited for the lease to run out: not sooner than (most of) the lease.
  EXPECT_GT(took_s, 1.0);
  auto lease = server.Get("leases.coordination.k8s.io", "team-a", "moe-operator-leader");
  EXPECT_EQ((*lease)["spec"]["leaseTransitions"], 1);

  // The new leader reconciles: scale up and see the new group.
  ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "ultra", [](json& o) { o["spec"]["replicas"] = 2; }));
  ASSERT_TRUE(WaitFor([&] { return server.List("statefulsets.apps", "team-a").size() == 2; }, 10s));
  EXPECT_EQ(Writers(server, writes_at_kill), std::set<std::string>{"moe-operator/op-b"});

  // A graceful stop releases the lease.
  kill(b, SIGTERM);
  int status = 0;
  waitpid(b, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(Holder(server), "");
  std::filesystem::remove(kubeconfig);
}

}  // namespace
}  // namespace moeserve::op::testing

namespace moeserve::op::testing {
namespace {

TEST(LeaderElection, StepsDownWhenItCannotRenewWithinTheDeadline) {
  FakeCluster cluster;
  auto client = cluster.Client("moe-operator/in-process");
  LeaderElectionOptions options;
  options.lease_namespace = "team-a";
  options.identity = "me";
  options.lease_duration = 1000ms;
  options.renew_deadline = 600ms;
  options.retry_period = 100ms;
  LeaderElector elector(*client, options);
  std::atomic<bool> stop{false}, started{false}, stopped{false};
  std::thread t([&] {
    elector.Run(stop, [&] { started = true; }, [&] { stopped = true; });
  });
  ASSERT_TRUE(WaitFor([&] { return started.load(); }, 5s));
  EXPECT_TRUE(elector.IsLeader());
  // Someone else takes the Lease and keeps renewing it: our renewals fail.
  std::atomic<bool> intruding{true};
  std::thread intruder([&] {
    while (intruding) {
      (void)cluster.server.Mutate("leases.coordination.k8s.io", "team-a", "moe-operator-leader", [](json& o) {
        o["spec"]["holderIdentity"] = "intruder";
        o["spec"]["renewTime"] = std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
      });
      std::this_thread::sleep_for(50ms);
    }
  });
  EXPECT_TRUE(WaitFor([&] { return stopped.load(); }, 5s)) << "never stepped down";
  EXPECT_FALSE(elector.IsLeader());
  intruding = false;
  intruder.join();
  stop = true;
  t.join();
}

}  // namespace
}  // namespace moeserve::op::testing
