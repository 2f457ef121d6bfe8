// GPUs come only from parallelism.gpusPerNode. A tenant whose
// spec.resources names a device (nvidia.com/gpu, amd.com/gpu, a MIG slice)
// is refused by the CRD schema (kubectl apply through the API double), by
// the quota webhook (an API server still serving the schema from before the
// field was closed), and by the reconciler (an object stored before either),
// each naming the field. And what quota counts is what the rendered
// StatefulSets request, for every shape of spec.
#include "moeserve/operator/quota_policy.hpp"
#include "webhook_kubectl_fixture.hpp"

namespace moeserve::op::testing {
namespace {

const std::string& kVwc = kValidatingWebhookConfigurations;
const std::string kMd = "moedeployments.moeserve.io";
const std::string kCrd = "customresourcedefinitions.apiextensions.k8s.io";

// Device units every container (init containers too) of a rendered
// StatefulSet's pod requests, times its pods.
int64_t RenderedDeviceUnits(const json& sts) {
  const json& pod = sts["spec"]["template"]["spec"];
  int64_t per_pod = 0;
  for (const char* list : {"initContainers", "containers"})
    for (const auto& c : pod.value(list, json::array())) per_pod += desired::DeviceUnits(c.value("resources", json()));
  return per_pod * sts["spec"].value("replicas", 0);
}

TEST(QuotaDevices, DemandIsWhatTheRenderedStatefulSetsRequest) {
  int cases = 0;
  for (int gpus : {0, 1, 8})
    for (int nodes : {1, 2, 4})
      for (int replicas : {0, 1, 3})
        for (int own_resources : {0, 1, 2}) {
          json md = MoEDeploymentManifest("team-a", "m", replicas, nodes);
          md["metadata"]["uid"] = "uid-m";
          md["spec"]["parallelism"]["gpusPerNode"] = gpus;
          if (own_resources == 1)
            md["spec"]["resources"] = {{"requests", {{"cpu", "8"}, {"memory", "32Gi"}, {"ephemeral-storage", "20Gi"}}},
                                       {"limits", {{"memory", "64Gi"}}}};
          auto spec = ParseMoEDeploymentSpec(md["spec"]);
          ASSERT_TRUE(spec) << spec.error().ToString();
          // 2: devices smuggled past the parser (a spec built by other code):
          // the renderer must not carry them, or quota must count them.
          if (own_resources == 2)
            spec->resources = {{"limits", {{"nvidia.com/gpu", "8"}, {"amd.com/gpu", 2}}},
                               {"requests", {{"nvidia.com/mig-1g.10gb", "7"}}}};
          int64_t rendered = 0;
          for (int r = 0; r < spec->replicas; ++r) rendered += RenderedDeviceUnits(desired::StatefulSet(md, *spec, r, "h"));
          SCOPED_TRACE("gpusPerNode " + std::to_string(gpus) + " nodes " + std::to_string(nodes) + " replicas " +
                       std::to_string(replicas));
          EXPECT_EQ(DemandOf(*spec).gpus, rendered);
          EXPECT_EQ(rendered, int64_t{gpus} * nodes * replicas);  // and it is gpusPerNode's, nothing more
          cases++;
        }
  EXPECT_EQ(cases, 81);
}

TEST(QuotaDevices, TheParserRefusesEveryDeviceNameInResourcesNamingTheField) {
  const std::vector<std::pair<json, std::string>> refused = {
      {{{"limits", {{"nvidia.com/gpu", "8"}}}}, "spec.resources.limits[\"nvidia.com/gpu\"]: not allowed"},
      {{{"requests", {{"amd.com/gpu", 8}}}}, "spec.resources.requests[\"amd.com/gpu\"]: not allowed"},
      {{{"limits", {{"cpu", "4"}, {"nvidia.com/mig-1g.10gb", "7"}}}},
       "spec.resources.limits[\"nvidia.com/mig-1g.10gb\"]: not allowed"},
      {{{"requests", {{"hugepages-2Mi", "1Gi"}}}}, "spec.resources.requests[\"hugepages-2Mi\"]: not allowed"},
      {{{"claims", json::array({{{"name", "gpu"}}})}}, "spec.resources.claims: not allowed"},
      {{{"limits", {{"memory", json::array()}}}}, "spec.resources.limits[\"memory\"]: not a quantity"},
      {{{"limits", "8"}}, "spec.resources.limits: not an object"},
  };
  for (const auto& [resources, message] : refused) {
    json md = MoEDeploymentManifest("team-a", "m", 1, 1);
    md["spec"]["resources"] = resources;
    auto spec = ParseMoEDeploymentSpec(md["spec"]);
    ASSERT_FALSE(spec) << resources.dump();
    EXPECT_NE(spec.error().message().find(message), std::string::npos) << spec.error().message();
  }
  json ok = MoEDeploymentManifest("team-a", "m", 1, 1);
  ok["spec"]["resources"] = {{"requests", {{"cpu", "8"}, {"memory", "1Gi"}, {"ephemeral-storage", "1Gi"}}}};
  EXPECT_TRUE(ParseMoEDeploymentSpec(ok["spec"]));
}

// The attack: no GPUs as far as gpusPerNode says, eight per pod in resources.
std::string AttackYaml(const std::string& name, const std::string& device) {
  return "apiVersion: moeserve.io/v1alpha1\nkind: MoEDeployment\nmetadata:\n  name: " + name +
         "\n  namespace: team-a\nspec:\n  image: moeserve/moe-daemon:0.1.0\n  model: {uri: s3://models/m/}\n"
         "  parallelism: {nodesPerReplica: 1, gpusPerNode: 0}\n  replicas: 2\n  resources:\n    limits:\n"
         "      \"" + device + "\": \"8\"\n  quotaPolicyRef: {name: team-a}\n";
}

class QuotaDevicesKubectl : public WebhookKubectlTest {
 protected:
  void SetUp() override {
    if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
    (void)cluster_.server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                                      {"metadata", {{"name", "moeserve-system"}}}});  // FakeCluster may have made it
    StartOperator();
    if (HasFatalFailure()) return;
    InstallWebhook();
    auto policy = kubectl_->Apply("policy", PolicyYaml("team-a", 0, 4));
    ASSERT_EQ(policy.rc, 0) << policy.output;
    ASSERT_TRUE(WaitFor([&] {
      auto p = cluster_.server.Get("quotapolicies.moeserve.io", "team-a", "team-a");
      return p && p->value("status", json::object()).contains("conditions");
    }));
  }
  // The schema as it was before spec.resources was closed: any field kept.
  void ServeTheOldSchema() {
    ASSERT_TRUE(cluster_.server.Mutate(kCrd, "", "moedeployments.moeserve.io", [](json& crd) {
      json& resources = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["resources"];
      resources = {{"type", "object"}, {"description", "as before"}, {"x-kubernetes-preserve-unknown-fields", true}};
    }));
  }
  size_t DeviceRequests() {
    int64_t total = 0;
    for (const auto& sts : cluster_.server.List("statefulsets.apps", "team-a")) total += RenderedDeviceUnits(sts);
    return static_cast<size_t>(total);
  }

};

TEST_F(QuotaDevicesKubectl, TheCrdRefusesADeviceInResources) {
  for (const std::string device : {"nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-1g.10gb"}) {
    SCOPED_TRACE(device);
    auto applied = kubectl_->Apply("attack", AttackYaml("attack", device));
    EXPECT_NE(applied.rc, 0) << applied.output;
    EXPECT_NE(applied.output.find("unknown field \"spec.resources.limits." + device + "\""), std::string::npos)
        << applied.output;
    EXPECT_FALSE(cluster_.server.Get(kMd, "team-a", "attack"));
  }
  EXPECT_EQ(DeviceRequests(), 0u);
}

TEST_F(QuotaDevicesKubectl, TheWebhookRefusesItWhereTheSchemaStillAllowsIt) {
  ServeTheOldSchema();
  for (const std::string device : {"nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-1g.10gb"}) {
    SCOPED_TRACE(device);
    auto applied = kubectl_->Apply("attack", AttackYaml("attack", device));
    EXPECT_NE(applied.rc, 0) << applied.output;
    EXPECT_NE(applied.output.find("admission webhook \"quota.moeserve.io\" denied the request: spec: "
                                  "spec.resources.limits[\"" + device + "\"]: not allowed"),
              std::string::npos)
        << applied.output;
    EXPECT_FALSE(cluster_.server.Get(kMd, "team-a", "attack"));
  }
  // gpusPerNode itself is still counted: one GPU is past maxGPUs 0.
  std::string honest = AttackYaml("honest", "memory");
  honest.replace(honest.find("gpusPerNode: 0"), 14, "gpusPerNode: 1");
  auto refused = kubectl_->Apply("honest", honest);
  EXPECT_NE(refused.output.find("limits.maxGPUs is 0; this MoEDeployment would bring the namespace to 2"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(DeviceRequests(), 0u);
}

TEST_F(QuotaDevicesKubectl, TheReconcilerRefusesAnObjectStoredBeforeEither) {
  ServeTheOldSchema();
  ASSERT_TRUE(cluster_.server.Delete(kVwc, "", "moeserve-quota"));  // as if it got in while no webhook ran
  auto applied = kubectl_->Apply("attack", AttackYaml("attack", "nvidia.com/gpu"));
  ASSERT_EQ(applied.rc, 0) << applied.output;
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& c : StatusOf(cluster_.server, "team-a", "attack").value("conditions", json::array()))
      if (c.value("type", "") == "Ready") return c.value("reason", "") == "InvalidSpec";
    return false;
  })) << StatusOf(cluster_.server, "team-a", "attack").dump(2);
  const json ready = ConditionOf(cluster_.server, "team-a", "attack", "Ready");
  EXPECT_EQ(ready.value("status", ""), "False");
  EXPECT_NE(ready.value("message", "").find("spec.resources.limits[\"nvidia.com/gpu\"]: not allowed"), std::string::npos)
      << ready.dump();
  EXPECT_EQ(cluster_.server.List("statefulsets.apps", "team-a").size(), 0u);
  EXPECT_EQ(DeviceRequests(), 0u);
  // Deleting it still works: the finalizer comes off through the webhook.
  ASSERT_TRUE(cluster_.server.Create(kVwc, QuotaWebhookConfiguration("Fail")));
  ASSERT_TRUE(WaitFor([&] {
    auto vwc = cluster_.server.Get(kVwc, "", "moeserve-quota");
    return vwc && (*vwc)["webhooks"][0]["clientConfig"].contains("caBundle");
  }));
  auto deleted = (*kubectl_)("delete moedeployment attack -n team-a --wait=false");
  ASSERT_EQ(deleted.rc, 0) << deleted.output;
  EXPECT_TRUE(WaitFor([&] { return !cluster_.server.Get(kMd, "team-a", "attack"); }, 20s));
}

}  // namespace
}  // namespace moeserve::op::testing
