// Changing the model revision replaces replica groups one at a time: never
// more than maxUnavailableReplicas unready, the next only when the last is Ready.
#include <gtest/gtest.h>

#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

std::set<std::string> Hashes(fakes::FakeApiServer& server) {
  std::set<std::string> hashes;
  for (const auto& sts : server.List("statefulsets.apps", "team-a"))
    hashes.insert(sts["spec"]["template"]["metadata"]["annotations"].value(kConfigHashAnnotation, ""));
  return hashes;
}

void RollRevision(int max_unavailable) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io",
                            MoEDeploymentManifest("team-a", "ultra", 4, 2, "2026-11-01", max_unavailable)));
  OperatorOptions options;
  options.workers = 2;
  RunningOperator running(*client, options);
  Kubelet kubelet(server, 60ms);
  ASSERT_TRUE(WaitFor([&] { return StatusOf(server, "team-a", "ultra").value("phase", "") == "Ready"; }));
  const auto old_hashes = Hashes(server);
  ASSERT_EQ(old_hashes.size(), 1u);
  kubelet.reset_max();

  ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "ultra",
                            [](json& o) { o["spec"]["model"]["revision"] = "2026-12-01"; }));
  // Mid-rollout the status says so.
  ASSERT_TRUE(WaitFor([&] { return StatusOf(server, "team-a", "ultra").value("phase", "") != "Ready"; }, 5s))
      << StatusOf(server, "team-a", "ultra").dump(2) << "\nreconciles " << running.op.reconciles() << " errors "
      << running.op.reconcile_errors();
  ASSERT_TRUE(WaitFor(
      [&] {
        json st = StatusOf(server, "team-a", "ultra");
        return st.value("phase", "") == "Ready" && st.value("modelRevision", "") == "2026-12-01";
      },
      30s))
      << StatusOf(server, "team-a", "ultra").dump(2);
  const auto new_hashes = Hashes(server);
  ASSERT_EQ(new_hashes.size(), 1u);
  EXPECT_NE(*new_hashes.begin(), *old_hashes.begin());
  EXPECT_GE(kubelet.max_unready(), 1);
  EXPECT_LE(kubelet.max_unready(), max_unavailable) << "more groups than maxUnavailableReplicas were down at once";
  EXPECT_EQ(StatusOf(server, "team-a", "ultra")["updatedReplicas"], 4);
  // The pod template carries the new revision.
  for (const auto& sts : server.List("statefulsets.apps", "team-a"))
    EXPECT_EQ(sts["spec"]["template"]["metadata"]["annotations"]["moeserve.io/model-revision"], "2026-12-01");
}

TEST(Rollout, OneGroupAtATime) { RollRevision(1); }
TEST(Rollout, TwoGroupsAtATime) { RollRevision(2); }

TEST(Rollout, ScaleDownRemovesSurplusGroups) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "ultra", 3, 1)));
  RunningOperator running(*client, {});
  Kubelet kubelet(server, 0ms);
  ASSERT_TRUE(WaitFor([&] { return StatusOf(server, "team-a", "ultra").value("phase", "") == "Ready"; }));
  ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "ultra", [](json& o) { o["spec"]["replicas"] = 1; }));
  ASSERT_TRUE(WaitFor([&] { return server.List("statefulsets.apps", "team-a").size() == 1; }));
  ASSERT_TRUE(WaitFor([&] { return StatusOf(server, "team-a", "ultra").value("ready", "") == "1/1"; }));
  EXPECT_TRUE(server.Get("statefulsets.apps", "team-a", "ultra-r0"));
  EXPECT_EQ(server.List("poddisruptionbudgets.policy", "team-a").size(), 1u);
}

}  // namespace
}  // namespace moeserve::op::testing
