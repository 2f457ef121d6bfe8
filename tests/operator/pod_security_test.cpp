// Pods a tenant's MoEDeployment becomes meet the `restricted` Pod Security
// Standard, and a tenant cannot point the cache at a path on the node:
// `spec.cache.hostPath: /` is refused by the CRD schema (kubectl apply), and
// an object stored before the schema dropped the field is refused by the
// operator with a condition, never rendered into a pod.
#include <gtest/gtest.h>

#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"
#include "restricted_profile.hpp"
#include "yaml_json.hpp"

namespace moeserve::op::testing {
namespace {

json Usable(const std::string& name, const json& string_data) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", {{"name", name}, {"namespace", "team-a"}, {"labels", {{kUsableLabel, "true"}}}}},
          {"stringData", string_data}};
}

TEST(PodSecurity, EveryRenderedPodTemplateMeetsRestricted) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  ASSERT_TRUE(server.Create("secrets", Usable("creds", {{"AWS_ACCESS_KEY_ID", "a"}, {"AWS_SECRET_ACCESS_KEY", "b"}})));
  ASSERT_TRUE(server.Create("secrets", Usable("keys", {{"acme", "sk-acme"}})));
  ASSERT_TRUE(server.Create("secrets", Usable("tls", {{"tls.crt", "CERT"}, {"tls.key", "KEY"}})));

  // Every shape of spec the operator renders differently.
  json gpus = MoEDeploymentManifest("team-a", "gpus", 2, 2);
  json cpu = MoEDeploymentManifest("team-a", "cpu", 1, 1);
  cpu["spec"]["parallelism"]["gpusPerNode"] = 0;
  cpu["spec"]["resources"] = {{"limits", {{"memory", "64Gi"}}}};
  json everything = MoEDeploymentManifest("team-a", "everything", 1, 1);
  everything["spec"]["model"]["endpoint"] = "https://s3.internal:9000";
  everything["spec"]["model"]["credentials"] = {{"secretRef", {{"name", "creds"}}}};
  everything["spec"]["endpoint"]["apiKeys"] = {{"secretRef", {{"name", "keys"}}}};
  everything["spec"]["endpoint"]["tls"] = {{"secretName", "tls"}};
  everything["spec"]["cache"] = {{"sizeLimitGi", 100}};
  everything["spec"]["prefixDisk"] = {{"sizeGi", 20}, {"maxAgeSeconds", 3600}};  // a writable emptyDir
  everything["spec"]["resources"] = {{"requests", {{"cpu", "8"}, {"memory", "32Gi"}}}};
  everything["spec"]["nodeSelector"] = {{"pool", "gpu"}};
  for (const auto& m : {gpus, cpu, everything}) ASSERT_TRUE(server.Create("moedeployments.moeserve.io", m));

  OperatorOptions options;
  options.reconciler.platform.daemon_image = "registry.platform/moe-daemon:1.0";
  RunningOperator running(*client, options);
  ASSERT_TRUE(WaitFor([&] { return server.List("statefulsets.apps").size() == 4; }))
      << server.List("statefulsets.apps").size();

  for (const auto& sts : server.List("statefulsets.apps")) {
    const std::string name = sts["metadata"]["name"];
    SCOPED_TRACE(name);
    const json pod = sts["spec"]["template"]["spec"];
    for (const auto& v : RestrictedViolations(pod)) ADD_FAILURE() << v;
    // Beyond the profile: no service-account token, a read-only root
    // filesystem, requests and limits everywhere.
    EXPECT_EQ(pod.value("automountServiceAccountToken", true), false);
    std::map<std::string, std::string> volume_kind;
    for (const auto& v : pod["volumes"])
      for (const auto& [k, _] : v.items())
        if (k != "name") volume_kind[v["name"]] = k;
    ASSERT_EQ(pod["initContainers"].size(), 1u);
    ASSERT_EQ(pod["containers"].size(), 1u);
    for (const char* list : {"initContainers", "containers"}) {
      for (const auto& c : pod[list]) {
        SCOPED_TRACE(c.value("name", ""));
        EXPECT_EQ(c["securityContext"].value("readOnlyRootFilesystem", false), true);
        for (const char* side : {"requests", "limits"})
          for (const char* resource : {"cpu", "memory"})
            EXPECT_TRUE(c["resources"].contains(side) && c["resources"][side].contains(resource))
                << side << "." << resource << " missing: " << c["resources"].dump();
        // Writable: scratch space, and the cache for the platform's puller only.
        for (const auto& m : c["volumeMounts"]) {
          if (m.value("readOnly", false)) continue;
          const std::string kind = volume_kind[m["name"]];
          const bool puller_cache = std::string(list) == "initContainers" && kind == "persistentVolumeClaim";
          EXPECT_TRUE(kind == "emptyDir" || puller_cache) << m.dump() << " is writable (" << kind << ")";
        }
      }
    }
    EXPECT_EQ(pod["initContainers"][0]["image"], "registry.platform/moe-daemon:1.0");
  }
}

TEST(PodSecurity, HostPathIsRefusedBySchemaThroughKubectl) {
  if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
  FakeCluster cluster;
  Kubectl kubectl(cluster.server);
  auto refused = kubectl.Apply("root", R"(apiVersion: moeserve.io/v1alpha1
kind: MoEDeployment
metadata: {name: root, namespace: team-a}
spec:
  image: attacker/anything:latest
  model: {uri: s3://models/m/}
  cache: {hostPath: /, sizeLimitGi: 10}
)");
  EXPECT_NE(refused.rc, 0) << refused.output;
  EXPECT_NE(refused.output.find("unknown field \"spec.cache.hostPath\""), std::string::npos) << refused.output;
  EXPECT_FALSE(cluster.server.Get("moedeployments.moeserve.io", "team-a", "root"));

  auto sized = kubectl.Apply("sized", R"(apiVersion: moeserve.io/v1alpha1
kind: MoEDeployment
metadata: {name: sized, namespace: team-a}
spec:
  image: moeserve/moe-daemon:0.1.0
  model: {uri: s3://models/m/}
  cache: {sizeLimitGi: 10}
)");
  EXPECT_EQ(sized.rc, 0) << sized.output;
}

TEST(PodSecurity, StoredHostPathIsAConditionNeverAVolume) {
  // The world before the schema dropped the field: an object that sets it is stored.
  fakes::FakeApiServer server;
  const json ready = ReconcileUnknownSpecField(server, "cache", "hostPath", {{"hostPath", "/"}});
  EXPECT_EQ(ready["reason"], "InvalidSpec");
  EXPECT_NE(ready.value("message", "").find("spec.cache.hostPath"), std::string::npos) << ready.dump();
  EXPECT_TRUE(server.List("statefulsets.apps").empty());
  EXPECT_TRUE(server.List("persistentvolumes").empty());
}

}  // namespace
}  // namespace moeserve::op::testing
