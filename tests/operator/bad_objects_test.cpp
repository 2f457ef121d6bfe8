// A worker never dies of one bad object. Attacked as a tenant would: a
// StatefulSet in the tenant's namespace carrying the operator's labels with
// a replica index that is not a number (or does not fit an int) made
// std::stoi throw in a worker, which ended the process: the operator
// crash-looped for every namespace of the cluster. Now such an object is
// logged and left alone, and anything a reconcile throws fails that
// reconcile only (requeued with backoff), as controller-runtime recovers panics.
#include <gtest/gtest.h>

#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

json LabelledAsOurs(const std::string& name, const std::string& replica_label) {
  json labels = {{"app.kubernetes.io/name", "moeserve"},
                 {"app.kubernetes.io/instance", "ultra"},
                 {"app.kubernetes.io/managed-by", kManagedBy},
                 {"app.kubernetes.io/component", "daemon"},
                 {kReplicaLabel, replica_label}};
  return {{"apiVersion", "apps/v1"},
          {"kind", "StatefulSet"},
          {"metadata", {{"name", name}, {"namespace", "team-a"}, {"labels", labels}}},
          {"spec",
           {{"replicas", 1},
            {"serviceName", name},
            {"selector", {{"matchLabels", {{"app", name}}}}},
            {"template",
             {{"metadata", {{"labels", {{"app", name}}}}},
              {"spec", {{"containers", json::array({{{"name", "c"}, {"image", "busybox"}}})}}}}}}}};
}

TEST(BadObjects, MislabelledStatefulSetsDoNotStopTheOperator) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "ultra", 1, 1)));
  RunningOperator running(*client, {});
  ASSERT_TRUE(WaitFor([&] { return server.Get("statefulsets.apps", "team-a", "ultra-r0").has_value(); }));

  // What a tenant can create in its own namespace.
  ASSERT_TRUE(server.Create("statefulsets.apps", LabelledAsOurs("not-a-number", "x1")));
  ASSERT_TRUE(server.Create("statefulsets.apps", LabelledAsOurs("too-large", "99999999999999999999")));
  ASSERT_TRUE(server.Create("statefulsets.apps", LabelledAsOurs("negative", "-3")));
  // Bring the owner's reconcile round (it lists the StatefulSets labelled as its own).
  ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "ultra",
                            [](json& o) { o["spec"]["replicas"] = 2; }));
  ASSERT_TRUE(WaitFor([&] { return server.Get("statefulsets.apps", "team-a", "ultra-r1").has_value(); }));

  // Still working, for everyone: a new deployment elsewhere is reconciled.
  ASSERT_TRUE(server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "team-b"}}}}));
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-b", "later", 1, 1)));
  ASSERT_TRUE(WaitFor([&] { return server.Get("statefulsets.apps", "team-b", "later-r0").has_value(); }));
  EXPECT_TRUE(running.op.Leading());
  // Not ours (no owner reference): left alone.
  for (const char* name : {"not-a-number", "too-large", "negative"})
    EXPECT_TRUE(server.Get("statefulsets.apps", "team-a", name)) << name;
  running.Stop();
  EXPECT_TRUE(running.status) << running.status.error().ToString();
}

TEST(BadObjects, AReconcileThatThrowsFailsAloneAndIsRetried) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  std::atomic<int> thrown{0};
  OperatorOptions options;
  options.workers = 1;
  options.rate_limits.item_base = std::chrono::milliseconds(5);
  options.reconciler.quota = [&](const json& md, const MoEDeploymentSpec&) {
    if (md["metadata"]["name"] == "boom") {
      thrown++;
      throw std::runtime_error("a bug somewhere in a reconcile");
    }
    return QuotaDecision{};
  };
  RunningOperator running(*client, options);
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "boom", 1, 1)));
  ASSERT_TRUE(WaitFor([&] { return thrown >= 2; })) << "retried with backoff, like any failed reconcile";
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "fine", 1, 1)));
  ASSERT_TRUE(WaitFor([&] { return server.Get("statefulsets.apps", "team-a", "fine-r0").has_value(); }));
  EXPECT_GE(running.op.reconcile_errors(), 2u);
  running.Stop();
  EXPECT_TRUE(running.status) << running.status.error().ToString();
}

}  // namespace
}  // namespace moeserve::op::testing
