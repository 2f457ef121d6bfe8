// Optimistic concurrency: the API double answers 409 Conflict to every third
// write; reconciles requeue with backoff and still converge, and the watches
// being dropped and answered 410 Gone does not make the cache miss anything.
#include <gtest/gtest.h>

#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

TEST(Conflicts, EveryThirdWriteConflictsAndTheReconcileConverges) {
  FakeCluster cluster;
  auto& server = cluster.server;
  server.SetFaults({.conflict_every_nth_write = 3});
  auto client = cluster.Client();
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(server.Create("moedeployments.moeserve.io",
                              MoEDeploymentManifest("team-a", "m" + std::to_string(i), 2, 2)));
  RunningOperator running(*client, {});
  Kubelet kubelet(server, 0ms);
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int i = 0; i < 3; ++i)
          if (StatusOf(server, "team-a", "m" + std::to_string(i)).value("phase", "") != "Ready") return false;
        return true;
      },
      30s));
  int conflicts = 0;
  for (const auto& w : server.Writes()) conflicts += w.status == 409 ? 1 : 0;
  EXPECT_GT(conflicts, 0);
  EXPECT_GT(running.op.reconcile_errors(), 0u);
  // Converged to exactly one of each child.
  EXPECT_EQ(server.List("statefulsets.apps", "team-a").size(), 6u);
  EXPECT_EQ(server.List("configmaps", "team-a").size(), 3u);
}

TEST(Conflicts, DroppedWatchesAndGoneStillConvergeAfterRevisionChange) {
  FakeCluster cluster;
  auto& server = cluster.server;
  server.SetFaults({.conflict_every_nth_write = 3, .drop_watch_after_events = 3, .gone_every_nth_watch = 4});
  auto client = cluster.Client();
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "ultra", 3, 2)));
  RunningOperator running(*client, {});
  Kubelet kubelet(server, 20ms);
  ASSERT_TRUE(WaitFor([&] { return StatusOf(server, "team-a", "ultra").value("phase", "") == "Ready"; }, 30s));
  kubelet.reset_max();
  ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "ultra",
                            [](json& o) { o["spec"]["model"]["revision"] = "next"; }));
  ASSERT_TRUE(WaitFor(
      [&] {
        json st = StatusOf(server, "team-a", "ultra");
        return st.value("phase", "") == "Ready" && st.value("modelRevision", "") == "next";
      },
      40s))
      << StatusOf(server, "team-a", "ultra").dump(2);
  EXPECT_LE(kubelet.max_unready(), 1);
  EXPECT_GT(server.WatchRequests(), 10u);
}

}  // namespace
}  // namespace moeserve::op::testing
