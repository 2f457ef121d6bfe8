// What a tenant's pods may be, attacked as a tenant would.
//
// GPU-less pods: a MoEDeployment with gpusPerNode 0 could tolerate the GPU
// nodes' taint and land there, and its image's ENV (NVIDIA_VISIBLE_DEVICES=all)
// then opened every GPU of the node to it. Now such a pod runs with device
// visibility pinned to none for every vendor the platform knows, and its
// GPU-node tolerations are refused (webhook) or its groups removed
// (reconciler) unless its QuotaPolicy says limits.allowGPUTolerationsWithoutGPUs.
//
// Images: limits.allowedImages matched by plain string prefix, so
// "registry.internal/moeserve" let "registry.internal/moeserve-debug/..."
// (and "registry.internal.evil.example/...") through, a digest could not be
// named, and the reconciler kept running groups whose image a tightened
// policy no longer allowed. Now prefixes end at a boundary, digests pin, and
// groups of a forbidden image are removed.
#include "moeserve/operator/moedeployment.hpp"
#include "moeserve/operator/quota_policy.hpp"
#include "webhook_kubectl_fixture.hpp"

namespace moeserve::op::testing {
namespace {

const std::string& kVwc = kValidatingWebhookConfigurations;
const std::string kMd = "moedeployments.moeserve.io";
const std::string kDigest = "sha256:" + std::string(64, 'a');

std::string Yaml(const std::string& name, int gpus, const std::string& more,
                 const std::string& image = "moeserve/moe-daemon:0.1.0") {
  return "apiVersion: moeserve.io/v1alpha1\nkind: MoEDeployment\nmetadata:\n  name: " + name +
         "\n  namespace: team-a\nspec:\n  image: " + image + "\n  model: {uri: s3://models/m/}\n"
         "  parallelism: {nodesPerReplica: 1, gpusPerNode: " + std::to_string(gpus) + "}\n  replicas: 1\n" + more;
}

std::string PolicyYaml(const std::string& limits) {
  return "apiVersion: moeserve.io/v1alpha1\nkind: QuotaPolicy\nmetadata:\n  name: default\n  namespace: team-a\n"
         "spec:\n  limits:\n" + limits;
}

// name -> value of a container's plain env entries.
std::map<std::string, std::string> Env(const json& container) {
  std::map<std::string, std::string> out;
  for (const auto& e : container.value("env", json::array()))
    if (e.contains("value")) out[e["name"]] = e["value"];
  return out;
}

class TenantPods : public WebhookKubectlTest {
 protected:
  void SetUp() override {
    if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
    StartOperator();
    if (HasFatalFailure()) return;
    InstallWebhook();
  }
  void ExpectRefused(const std::string& name, const std::string& yaml, const std::string& message) {
    SCOPED_TRACE(yaml);
    auto applied = kubectl_->Apply(name, yaml);
    EXPECT_NE(applied.rc, 0) << applied.output;
    const size_t denied = applied.output.find("admission webhook \"quota.moeserve.io\" denied the request: ");
    EXPECT_NE(denied, std::string::npos) << applied.output;
    EXPECT_NE(applied.output.find(message, denied == std::string::npos ? 0 : denied), std::string::npos) << applied.output;
    EXPECT_FALSE(cluster_.server.Get(kMd, "team-a", name));
  }
  void ExpectRuns(const std::string& name, const std::string& yaml) {
    SCOPED_TRACE(yaml);
    auto applied = kubectl_->Apply(name, yaml);
    EXPECT_EQ(applied.rc, 0) << applied.output;
    EXPECT_TRUE(WaitFor([&] { return cluster_.server.Get("statefulsets.apps", "team-a", name + "-r0").has_value(); }));
  }
  // An object stored while the webhook was down is not run by the reconciler
  // (and the group it had is removed), with `message` in Ready.
  void ExpectReconcilerRemoves(const std::string& name, const std::string& yaml, const std::string& message) {
    ASSERT_TRUE(cluster_.server.Delete(kVwc, "", "moeserve-quota"));  // as if the webhook were down (Ignore)
    auto applied = kubectl_->Apply(name, yaml);
    ASSERT_EQ(applied.rc, 0) << applied.output;
    EXPECT_TRUE(WaitFor([&] {
      return ConditionOf(cluster_.server, "team-a", name, "Ready").value("message", "").find(message) != std::string::npos;
    })) << StatusOf(cluster_.server, "team-a", name).dump(2);
    EXPECT_TRUE(WaitFor([&] { return !cluster_.server.Get("statefulsets.apps", "team-a", name + "-r0").has_value(); }))
        << "a group of a forbidden spec still runs";
  }

};

TEST_F(TenantPods, GpuLessPodsSeeNoDeviceAndStayOffGpuNodes) {
  const std::string gpu_toleration = "  tolerations:\n  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n";
  // 1. No QuotaPolicy: nothing allows GPU nodes without GPUs.
  ExpectRefused("cpu", Yaml("cpu", 0, gpu_toleration),
                "spec.tolerations[0].key: nvidia.com/gpu tolerates GPU nodes, but this MoEDeployment requests no GPU");
  // 2. Without the toleration it runs, its devices pinned to none whatever its image says.
  ExpectRuns("cpu", Yaml("cpu", 0, ""));
  const json pod = (*cluster_.server.Get("statefulsets.apps", "team-a", "cpu-r0"))["spec"]["template"]["spec"];
  for (const json& c : {pod["containers"][0], pod["initContainers"][0]}) {
    const auto env = Env(c);
    EXPECT_EQ(env.count("NVIDIA_VISIBLE_DEVICES") ? env.at("NVIDIA_VISIBLE_DEVICES") : "<unset>", "void") << c["name"];
    EXPECT_EQ(env.count("AMD_VISIBLE_DEVICES") ? env.at("AMD_VISIBLE_DEVICES") : "<unset>", "") << c["name"];
  }
  // A GPU pod's devices are the device plugin's to set, not pinned here.
  ExpectRuns("gpu", Yaml("gpu", 1, gpu_toleration));
  const json gpu_pod = (*cluster_.server.Get("statefulsets.apps", "team-a", "gpu-r0"))["spec"]["template"]["spec"];
  EXPECT_EQ(Env(gpu_pod["containers"][0]).count("NVIDIA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(gpu_pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "1");

  // 3. A QuotaPolicy without the allowance refuses it too (AMD's taint as NVIDIA's)...
  ASSERT_EQ(kubectl_->Apply("policy", PolicyYaml("    maxGPUs: 64\n")).rc, 0);
  ExpectRefused("amd", Yaml("amd", 0, "  tolerations:\n  - {key: amd.com/gpu, operator: Exists}\n"),
                "QuotaPolicy default: spec.tolerations[0].key: amd.com/gpu tolerates GPU nodes");
  // ...one with it admits it.
  ASSERT_EQ(kubectl_->Apply("policy", PolicyYaml("    maxGPUs: 64\n    allowGPUTolerationsWithoutGPUs: true\n")).rc, 0);
  ASSERT_TRUE(WaitFor([&] {
    auto p = cluster_.server.Get("quotapolicies.moeserve.io", "team-a", "default");
    return p && (*p)["spec"]["limits"].value("allowGPUTolerationsWithoutGPUs", false);
  }));
  ExpectRuns("amd", Yaml("amd", 0, "  tolerations:\n  - {key: amd.com/gpu, operator: Exists}\n"));

  // 4. The allowance withdrawn, with the webhook down: the reconciler removes the group.
  ASSERT_EQ(kubectl_->Apply("policy", PolicyYaml("    maxGPUs: 64\n")).rc, 0);
  ExpectReconcilerRemoves("cpu", Yaml("cpu", 0, gpu_toleration), "spec.tolerations[0].key: nvidia.com/gpu tolerates GPU nodes");
}

TEST_F(TenantPods, OnlyTheImagesAPolicyNamesRun) {
  ASSERT_EQ(kubectl_->Apply("policy", PolicyYaml("    allowedImages: [registry.internal/moeserve, \"" + kDigest + "\"]\n")).rc, 0);
  ASSERT_TRUE(WaitFor([&] { return cluster_.server.Get("quotapolicies.moeserve.io", "team-a", "default").has_value(); }));
  // A prefix ends at a boundary: neither a longer repository nor another registry matches it.
  for (const std::string image : {"registry.internal/moeserve-debug/shell:1", "registry.internal/moeservex:1"})
    ExpectRefused("m", Yaml("m", 1, "", image), "QuotaPolicy default: limits.allowedImages is");
  // A digest pins: the image must carry it.
  ExpectRefused("m", Yaml("m", 1, "", "elsewhere.example/any:latest"), "spec.image is elsewhere.example/any:latest");
  ExpectRuns("pinned", Yaml("pinned", 1, "", "elsewhere.example/moe@" + kDigest));
  ExpectRuns("m", Yaml("m", 1, "", "registry.internal/moeserve/moe-daemon:0.1.0"));

  // The policy tightened to the digest alone, the webhook down: the group of
  // the image no longer allowed is removed, the pinned one stays.
  ASSERT_EQ(kubectl_->Apply("policy", PolicyYaml("    allowedImages: [\"" + kDigest + "\"]\n")).rc, 0);
  ExpectReconcilerRemoves("m", Yaml("m", 1, "", "registry.internal/moeserve/moe-daemon:0.1.0"),
                          "limits.allowedImages is [" + kDigest + "]");
  EXPECT_TRUE(cluster_.server.Get("statefulsets.apps", "team-a", "pinned-r0").has_value());
}

TEST(GpuTolerations, JudgedPerPodNotPerReplicaCount) {
  json md = MoEDeploymentManifest("team-a", "m", 0, 1);  // 8 GPUs a pod, scaled to zero
  md["spec"]["tolerations"] = json::array({{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}}});
  auto spec = ParseMoEDeploymentSpec(md["spec"]);
  ASSERT_TRUE(spec);
  EXPECT_TRUE(DecideQuota(md, *spec, {}, {}).decision.admitted);
  md["spec"]["parallelism"]["gpusPerNode"] = 0;
  spec = ParseMoEDeploymentSpec(md["spec"]);
  ASSERT_TRUE(spec);
  const QuotaEvaluation e = DecideQuota(md, *spec, {}, {});
  EXPECT_FALSE(e.decision.admitted);
  EXPECT_TRUE(e.decision.forbidden);
  EXPECT_EQ(e.decision.reason, "GPUTolerationsWithoutGPUs");
}

TEST(ImageAllowList, PrefixesEndAtABoundaryAndDigestsPin) {
  EXPECT_TRUE(ImageAllowed("registry.internal/moeserve/moe-daemon:1", "registry.internal/moeserve/"));
  EXPECT_TRUE(ImageAllowed("registry.internal/moeserve/moe-daemon:1", "registry.internal/moeserve"));
  EXPECT_TRUE(ImageAllowed("registry.internal/moeserve/moe-daemon:1", "registry.internal"));
  EXPECT_TRUE(ImageAllowed("registry.internal/x/moe-daemon:1", "registry.internal/x/moe-daemon"));
  EXPECT_FALSE(ImageAllowed("registry.internal.evil.example/x:1", "registry.internal"));
  EXPECT_FALSE(ImageAllowed("registry.internal/moeserve-debug/x:1", "registry.internal/moeserve"));
  EXPECT_FALSE(ImageAllowed("registry.internal/x/moe-daemon-debug:1", "registry.internal/x/moe-daemon"));
  EXPECT_FALSE(ImageAllowed("registry.internal/x:1.0-debug", "registry.internal/x:1.0"));
  EXPECT_TRUE(ImageAllowed("any.example/repo@" + kDigest, kDigest));
  EXPECT_FALSE(ImageAllowed("any.example/repo:" + kDigest, kDigest));
  EXPECT_FALSE(ImageAllowed(kDigest, kDigest));
  EXPECT_TRUE(ImageAllowed("r.example/repo@" + kDigest, "r.example/repo@" + kDigest));
  EXPECT_FALSE(ImageAllowed("r.example/other@" + kDigest, "r.example/repo@" + kDigest));
  EXPECT_FALSE(ImageAllowed("anything", ""));
}

}  // namespace
}  // namespace moeserve::op::testing
