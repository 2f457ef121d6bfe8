// Applying a MoEDeployment: every child appears with owner references and
// labels; StatefulSets marked ready make the status Ready with the endpoint;
// a reconcile with nothing changed writes nothing; deletion runs the finalizer.
#include <gtest/gtest.h>

#include "moeserve/common/sha256.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

bool OwnedBy(const json& child, const json& md) {
  for (const auto& ref : child["metadata"].value("ownerReferences", json::array()))
    if (ref.value("uid", "") == md["metadata"]["uid"] && ref.value("kind", "") == "MoEDeployment" &&
        ref.value("controller", false))
      return true;
  return false;
}

std::string Env(const json& sts, const std::string& name) {
  for (const auto& e : sts["spec"]["template"]["spec"]["containers"][0]["env"])
    if (e["name"] == name) return e.contains("value") ? e["value"].get<std::string>() : e["valueFrom"].dump();
  return "";
}

// Stands in for the Vault lease revocation that will run under the finalizer.
class CountingCleanup : public CleanupHook {
 public:
  Status Cleanup(const json& md) override {
    std::lock_guard lock(mu);
    cleaned.push_back(md["metadata"]["name"]);
    return Ok();
  }
  std::mutex mu;
  std::vector<std::string> cleaned;
};

TEST(Reconcile, ChildrenStatusIdempotenceAndDeletion) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  // The object store secret the MoEDeployment references (labelled usable, as the platform allows).
  const json usable = {{"moeserve.io/usable", "true"}};
  ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                        {"metadata", {{"name", "object-store"}, {"namespace", "team-a"}, {"labels", usable}}},
                                        {"stringData", {{"AWS_ACCESS_KEY_ID", "AKIA"}, {"AWS_SECRET_ACCESS_KEY", "s3cr3t"}}}}));
  ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                        {"metadata", {{"name", "ultra-api-keys"}, {"namespace", "team-a"}, {"labels", usable}}},
                                        {"stringData", {{"acme", "sk-acme-1"}}}}));
  json manifest = MoEDeploymentManifest("team-a", "ultra", 2, 2);
  manifest["spec"]["model"]["credentials"] = {{"secretRef", {{"name", "object-store"}}}};
  manifest["spec"]["endpoint"]["apiKeys"] = {{"secretRef", {{"name", "ultra-api-keys"}}}};
  auto md = server.Create("moedeployments.moeserve.io", manifest);
  ASSERT_TRUE(md) << md.error().ToString();

  OperatorOptions options;
  options.workers = 2;
  CountingCleanup cleanup;
  options.reconciler.cleanup = &cleanup;
  RunningOperator running(*client, options);

  // Every child, owned and labelled.
  ASSERT_TRUE(WaitFor([&] { return server.List("statefulsets.apps", "team-a").size() == 2; }));
  ASSERT_TRUE(WaitFor([&] { return server.List("poddisruptionbudgets.policy", "team-a").size() == 2; }));
  md = server.Get("moedeployments.moeserve.io", "team-a", "ultra");
  ASSERT_TRUE(md);
  auto check_child = [&](const std::string& resource, const std::string& name, const std::string& component) {
    auto child = server.Get(resource, "team-a", name);
    ASSERT_TRUE(child) << resource << " " << name;
    EXPECT_TRUE(OwnedBy(*child, *md)) << name;
    const json labels = (*child)["metadata"]["labels"];
    EXPECT_EQ(labels.value("app.kubernetes.io/name", ""), "moeserve");
    EXPECT_EQ(labels.value("app.kubernetes.io/instance", ""), "ultra");
    EXPECT_EQ(labels.value("app.kubernetes.io/managed-by", ""), "moe-operator");
    EXPECT_EQ(labels.value("app.kubernetes.io/component", ""), component) << name;
  };
  check_child("configmaps", "ultra-config", "config");
  check_child("secrets", "ultra-secrets", "secrets");
  check_child("services", "ultra", "endpoint");
  for (int r = 0; r < 2; ++r) {
    const std::string group = "ultra-r" + std::to_string(r);
    check_child("services", group, "discovery");
    check_child("statefulsets.apps", group, "daemon");
    check_child("poddisruptionbudgets.policy", group, "disruption-budget");
    auto sts = *server.Get("statefulsets.apps", "team-a", group);
    EXPECT_EQ(sts["spec"]["replicas"], 2);
    EXPECT_EQ(sts["spec"]["podManagementPolicy"], "Parallel");
    EXPECT_EQ(sts["spec"]["serviceName"], group);
    EXPECT_EQ(Env(sts, "MOE_NUM_NODES"), "2");
    EXPECT_EQ(Env(sts, "MOE_LOCAL_RANKS"), "8");
    EXPECT_EQ(Env(sts, "MOE_MASTER_ADDR"), group + "-0." + group);
    EXPECT_NE(Env(sts, "MOE_NODE_RANK").find("apps.kubernetes.io/pod-index"), std::string::npos);
    EXPECT_FALSE(sts["spec"]["template"]["metadata"]["annotations"].value(kConfigHashAnnotation, "").empty());
    EXPECT_EQ(sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "8");
    auto svc = *server.Get("services", "team-a", group);
    EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  }
  auto endpoint = *server.Get("services", "team-a", "ultra");
  EXPECT_EQ(endpoint["spec"]["selector"]["apps.kubernetes.io/pod-index"], "0");
  auto secret = *server.Get("secrets", "team-a", "ultra-secrets");
  EXPECT_EQ(Base64Decode(secret["data"]["object-store.AWS_SECRET_ACCESS_KEY"].get<std::string>()), "s3cr3t");
  // API keys in moe-daemon's file format (hashes; the operator's admin key
  // first), and a serve config that points at them.
  json keys = json::parse(Base64Decode(secret["data"]["api-keys.yaml"].get<std::string>()));
  ASSERT_EQ(keys["keys"].size(), 2u) << keys.dump();
  EXPECT_EQ(keys["keys"][0]["tenant"], "moeserve-admin");
  EXPECT_EQ(keys["keys"][0]["role"], "admin");
  EXPECT_EQ(keys["keys"][1]["tenant"], "acme");
  EXPECT_EQ(keys["keys"][1]["role"], "user");
  EXPECT_EQ(keys["keys"][1]["sha256"], Sha256Hex("sk-acme-1"));
  json serve = json::parse((*server.Get("configmaps", "team-a", "ultra-config"))["data"]["config.yaml"].get<std::string>());
  EXPECT_EQ(serve["host"], "0.0.0.0");
  EXPECT_EQ(serve["port"], 8000);
  EXPECT_EQ(serve["api_keys_file"], "/etc/moeserve/secrets/api-keys.yaml");
  EXPECT_EQ(serve["default_reasoning_effort"], "medium");
  EXPECT_NE(server.Get("moedeployments.moeserve.io", "team-a", "ultra")->dump().find(kFinalizer), std::string::npos);

  // Not ready yet: Pulling, with conditions per the API conventions.
  ASSERT_TRUE(WaitFor([&] { return StatusOf(server, "team-a", "ultra").value("phase", "") == "Pulling"; }))
      << StatusOf(server, "team-a", "ultra").dump(2);

  {
    Kubelet kubelet(server, 0ms);
    ASSERT_TRUE(WaitFor([&] { return StatusOf(server, "team-a", "ultra").value("phase", "") == "Ready"; }))
        << StatusOf(server, "team-a", "ultra").dump(2);
  }
  json status = StatusOf(server, "team-a", "ultra");
  EXPECT_EQ(status["ready"], "2/2");
  EXPECT_EQ(status["readyReplicas"], 2);
  EXPECT_EQ(status["endpoint"], "http://ultra.team-a.svc:8000/v1");
  EXPECT_EQ(status["modelRevision"], "2026-11-01");
  EXPECT_EQ(status["observedGeneration"], 1);
  std::map<std::string, std::string> conditions;
  for (const auto& c : status["conditions"]) {
    conditions[c["type"]] = c["status"];
    EXPECT_FALSE(c.value("reason", "").empty());
    EXPECT_FALSE(c.value("lastTransitionTime", "").empty());
    EXPECT_EQ(c.value("observedGeneration", 0), 1);
  }
  EXPECT_EQ(conditions["Ready"], "True");
  EXPECT_EQ(conditions["WeightsReady"], "True");
  EXPECT_EQ(conditions["SecretsSynced"], "True");
  EXPECT_EQ(conditions["QuotaAdmitted"], "True");
  EXPECT_EQ(conditions["Progressing"], "False");
  // Status went through the status subresource only.
  bool status_written = false;
  for (const auto& w : server.Writes())
    if (w.path.find("/moedeployments/ultra/status") != std::string::npos && w.method == "PUT") status_written = true;
  EXPECT_TRUE(status_written);
  // Events were recorded for the object.
  // (recorded just after the status write that it describes)
  EXPECT_TRUE(WaitFor([&] {
    for (const auto& e : server.List("events", "team-a"))
      if (e["involvedObject"]["name"] == "ultra" && e["reason"] == "PhaseReady") return true;
    return false;
  }));

  // Idempotent: touching the object (a label, so a reconcile runs) writes nothing but that label.
  // Quiet first: nothing written for half a second.
  ASSERT_TRUE(WaitFor([&] {
    const size_t n = server.Writes().size();
    std::this_thread::sleep_for(500ms);
    return server.Writes().size() == n;
  }));
  const size_t writes_before = server.Writes().size();
  const uint64_t reconciles_before = running.op.reconciles();
  ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "ultra",
                            [](json& o) { o["metadata"]["labels"]["touched"] = "yes"; }));
  ASSERT_TRUE(WaitFor([&] { return running.op.reconciles() > reconciles_before; }));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(server.Writes().size(), writes_before) << "a reconcile with nothing changed wrote something";

  // Delete: the finalizer runs, the object goes, and garbage collection takes the children.
  ASSERT_TRUE(client->Delete(resources::kMoEDeployment, "team-a", "ultra"));
  ASSERT_TRUE(WaitFor([&] { return !server.Get("moedeployments.moeserve.io", "team-a", "ultra"); }));
  EXPECT_TRUE(server.List("statefulsets.apps", "team-a").empty());
  EXPECT_TRUE(server.List("configmaps", "team-a").empty());
  EXPECT_EQ(cleanup.cleaned, std::vector<std::string>{"ultra"});
  running.Stop();
  EXPECT_TRUE(running.status) << running.status.error().ToString();
}

}  // namespace
}  // namespace moeserve::op::testing

namespace moeserve::op::testing {
namespace {

TEST(Reconcile, UnreachableSecretSourceIsReportedNotFatal) {
  // Without a Vault address the operator cannot read a vault path. The
  // children are still made, and SecretsSynced=False says why (the path,
  // never a value).
  FakeCluster cluster;
  auto client = cluster.Client();
  json manifest = MoEDeploymentManifest("team-a", "v", 1, 1);
  manifest["spec"]["model"]["credentials"] = {{"vault", {{"path", "kv/data/team-a/object-store"}}}};
  ASSERT_TRUE(cluster.server.Create("moedeployments.moeserve.io", manifest));
  RunningOperator running(*client, {});
  auto condition = [&](const std::string& type) {
    for (const auto& c : StatusOf(cluster.server, "team-a", "v").value("conditions", json::array()))
      if (c["type"] == type) return c;
    return json();
  };
  ASSERT_TRUE(WaitFor([&] { return !condition("SecretsSynced").is_null(); }));
  json synced = condition("SecretsSynced");
  EXPECT_EQ(synced["status"], "False");
  EXPECT_EQ(synced["reason"], "VaultUnavailable");
  EXPECT_NE(synced["message"].get<std::string>().find("kv/data/team-a/object-store"), std::string::npos);
  EXPECT_TRUE(cluster.server.Get("statefulsets.apps", "team-a", "v-r0"));
  EXPECT_TRUE(cluster.server.Get("secrets", "team-a", "v-secrets"));
}

}  // namespace
}  // namespace moeserve::op::testing
