// Scaling down removes a replica group's StatefulSet at once (its pods get
// SIGTERM and drain) but keeps the group's headless Service, its
// PodDisruptionBudget and NetworkPolicy while any of its pods is left, so a
// session kept by a draining pod stays reachable by forwarding through the
// Service's name; once the last pod is gone they are removed.
#include <gtest/gtest.h>

#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

TEST(ScaleDownDrain, AGroupsServiceOutlivesItsDrainingPods) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "ultra", 2, 2)));
  OperatorOptions options;
  options.workers = 2;
  options.reconciler.secret_resync = 200ms;  // the pods are not watched: a resync looks again
  RunningOperator running(*client, options);
  ASSERT_TRUE(WaitFor([&] { return static_cast<bool>(server.Get("statefulsets.apps", "team-a", "ultra-r1")); }));
  ASSERT_TRUE(WaitFor([&] { return static_cast<bool>(server.Get("services", "team-a", "ultra-r1")); }));

  // A pod of group 1 still terminating (no owner left to collect it with: the kubelet has it).
  auto sts = server.Get("statefulsets.apps", "team-a", "ultra-r1");
  json labels = (*sts)["spec"]["template"]["metadata"]["labels"];
  ASSERT_TRUE(server.Create("pods", {{"apiVersion", "v1"},
                                     {"kind", "Pod"},
                                     {"metadata", {{"name", "ultra-r1-0"}, {"namespace", "team-a"}, {"labels", labels}}},
                                     {"spec", {{"containers", json::array({{{"name", "moe-daemon"}, {"image", "x"}}})}}}}));

  ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "ultra", [](json& o) { o["spec"]["replicas"] = 1; }));
  ASSERT_TRUE(WaitFor([&] { return !server.Get("statefulsets.apps", "team-a", "ultra-r1"); }));
  // Several reconciles later the draining group is still reachable by name.
  const uint64_t seen = running.op.reconciles();
  ASSERT_TRUE(WaitFor([&] { return running.op.reconciles() >= seen + 3; }));
  EXPECT_TRUE(server.Get("services", "team-a", "ultra-r1"));
  EXPECT_TRUE(server.Get("poddisruptionbudgets.policy", "team-a", "ultra-r1"));
  EXPECT_TRUE(server.Get("services", "team-a", "ultra-r0"));

  // The last pod goes: so do the group's Service and budget.
  ASSERT_TRUE(server.Delete("pods", "team-a", "ultra-r1-0"));
  EXPECT_TRUE(WaitFor([&] { return !server.Get("services", "team-a", "ultra-r1"); }));
  EXPECT_TRUE(WaitFor([&] { return !server.Get("poddisruptionbudgets.policy", "team-a", "ultra-r1"); }));
  EXPECT_TRUE(WaitFor([&] { return !server.Get("networkpolicies.networking.k8s.io", "team-a", "ultra-r1"); }));
  EXPECT_TRUE(server.Get("services", "team-a", "ultra-r0"));
  EXPECT_TRUE(server.Get("statefulsets.apps", "team-a", "ultra-r0"));
}

}  // namespace
}  // namespace moeserve::op::testing
