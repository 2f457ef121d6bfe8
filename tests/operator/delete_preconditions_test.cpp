// Deletes carry preconditions (uid, resourceVersion), so a decision made on
// a cached or listed copy never removes an object that changed or was
// replaced since. Before: a rollout deleted every pod matching two labels
// (deletecollection, a bystander pod of the namespace included), and scaling
// down deleted whatever now had the group's name.
#include <gtest/gtest.h>

#include "moeserve/operator/moedeployment.hpp"
#include "moeserve/operator/reconciler.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

json Pod(const std::string& name, const json& labels, const json& owner_refs) {
  json meta = {{"name", name}, {"namespace", "team-a"}, {"labels", labels}};
  if (!owner_refs.empty()) meta["ownerReferences"] = owner_refs;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", meta},
          {"spec", {{"containers", json::array({{{"name", "c"}, {"image", "busybox"}}})}}}};
}

TEST(DeletePreconditions, RolloutDeletesOnlyTheGroupsOwnPodsAsListed) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "m", 1, 2)));
  RunningOperator running(*client, {});
  Kubelet kubelet(server, 0ms);
  ASSERT_TRUE(WaitFor([&] { return StatusOf(server, "team-a", "m").value("phase", "") == "Ready"; }));
  auto sts = *server.Get("statefulsets.apps", "team-a", "m-r0");
  const json group_labels = {{"app.kubernetes.io/instance", "m"}, {"app.kubernetes.io/component", "daemon"},
                             {kReplicaLabel, "0"}};
  const json owner = json::array({{{"apiVersion", "apps/v1"}, {"kind", "StatefulSet"}, {"name", "m-r0"},
                                   {"uid", sts["metadata"]["uid"]}, {"controller", true}}});
  std::map<std::string, std::string> uids;
  for (const char* name : {"m-r0-0", "m-r0-1"}) {
    auto pod = server.Create("pods", Pod(name, group_labels, owner));
    ASSERT_TRUE(pod);
    uids[name] = (*pod)["metadata"]["uid"];
  }
  // Same labels, another owner: not the group's to delete.
  ASSERT_TRUE(server.Create("pods", Pod("bystander", group_labels, json::array())));

  ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "m",
                            [](json& o) { o["spec"]["model"]["revision"] = "2026-12-01"; }));
  ASSERT_TRUE(WaitFor([&] {
    return !server.Get("pods", "team-a", "m-r0-0") && !server.Get("pods", "team-a", "m-r0-1");
  }));
  EXPECT_TRUE(server.Get("pods", "team-a", "bystander"));
  int pod_deletes = 0;
  for (const auto& w : server.Writes()) {
    if (w.method != "DELETE" || w.path.find("/pods") == std::string::npos) continue;
    pod_deletes++;
    EXPECT_NE(w.path.find("/pods/"), std::string::npos) << "a collection delete: " << w.path;
    json options = json::parse(w.body.empty() ? "{}" : w.body, nullptr, false);
    ASSERT_TRUE(options.is_object()) << w.body;
    const std::string name = w.path.substr(w.path.rfind('/') + 1);
    EXPECT_EQ(options["preconditions"].value("uid", ""), uids[name]) << w.path << " " << w.body;
    EXPECT_FALSE(options["preconditions"].value("resourceVersion", "").empty()) << w.path << " " << w.body;
  }
  EXPECT_GE(pod_deletes, 2);
}

TEST(DeletePreconditions, ScaleDownOnAStaleCacheDeletesNothingNew) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  auto md = server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "x", 1, 1));
  ASSERT_TRUE(md);
  (*md)["kind"] = "MoEDeployment";
  (*md)["apiVersion"] = "moeserve.io/v1alpha1";
  // Group r1 as it exists now: recreated since the cache saw it.
  json labels = {{"app.kubernetes.io/name", "moeserve"}, {"app.kubernetes.io/instance", "x"},
                 {"app.kubernetes.io/managed-by", kManagedBy}, {"app.kubernetes.io/component", "daemon"},
                 {kReplicaLabel, "1"}};
  json owner = json::array({{{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "MoEDeployment"}, {"name", "x"},
                             {"uid", (*md)["metadata"]["uid"]}, {"controller", true}}});
  json group = {{"apiVersion", "apps/v1"}, {"kind", "StatefulSet"},
                {"metadata", {{"name", "x-r1"}, {"namespace", "team-a"}, {"labels", labels}, {"ownerReferences", owner}}},
                {"spec", {{"replicas", 1}, {"serviceName", "x-r1"}, {"selector", {{"matchLabels", {{"g", "1"}}}}},
                          {"template", {{"metadata", {{"labels", {{"g", "1"}}}}},
                                        {"spec", {{"containers", json::array({{{"name", "c"}, {"image", "i"}}})}}}}}}}};
  auto current = server.Create("statefulsets.apps", group);
  ASSERT_TRUE(current);
  (*current)["kind"] = "StatefulSet";
  (*current)["apiVersion"] = "apps/v1";

  ObjectCache mds, statefulsets, services, configmaps, secrets, pdbs, claims, volumes;
  mds.Upsert(*md);
  json stale = *current;
  stale["metadata"]["uid"] = "uid-of-the-one-deleted-since";
  stale["metadata"]["resourceVersion"] = "1";
  statefulsets.Upsert(stale);
  ReconcilerCaches caches{&mds, &statefulsets, &services, &configmaps, &secrets, &pdbs, &claims, &volumes};
  MoEDeploymentReconciler reconciler(*client, caches, nullptr);

  auto first = reconciler.Reconcile("team-a/x");
  ASSERT_FALSE(first);
  EXPECT_EQ(first.error().code(), ErrorCode::kConflict) << first.error().ToString();
  EXPECT_TRUE(server.Get("statefulsets.apps", "team-a", "x-r1")) << "deleted on a stale decision";

  // With what the informer would deliver, the same decision is made on the real object.
  statefulsets.Upsert(*server.Get("statefulsets.apps", "team-a", "x-r1"));
  auto second = reconciler.Reconcile("team-a/x");
  EXPECT_TRUE(second) << second.error().ToString();
  EXPECT_FALSE(server.Get("statefulsets.apps", "team-a", "x-r1"));
  EXPECT_TRUE(server.Get("statefulsets.apps", "team-a", "x-r0"));
}

}  // namespace
}  // namespace moeserve::op::testing
