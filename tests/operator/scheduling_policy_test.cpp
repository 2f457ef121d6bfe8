// Where a tenant's pods may run. nodeSelector, tolerations and affinity
// used to be copied into the pod template as written, so a tenant could
// tolerate the control plane's taint and land there. Now they pass the
// platform's allow-list (moe-operator --allowed-toleration-keys,
// --allowed-node-selector-keys, --allow-affinity): kubectl apply through the
// API double is refused by the quota webhook with a message naming the
// field, and an object that got in without the webhook is held by the
// reconciler (Ready=False, InvalidSpec) with its groups removed.
#include "moeserve/operator/scheduling_policy.hpp"
#include "webhook_kubectl_fixture.hpp"

namespace moeserve::op::testing {
namespace {

const std::string& kVwc = kValidatingWebhookConfigurations;
const std::string kMd = "moedeployments.moeserve.io";

std::string Yaml(const std::string& name, const std::string& scheduling) {
  return "apiVersion: moeserve.io/v1alpha1\nkind: MoEDeployment\nmetadata:\n  name: " + name +
         "\n  namespace: team-a\nspec:\n  image: moeserve/moe-daemon:0.1.0\n  model: {uri: s3://models/m/}\n"
         "  parallelism: {nodesPerReplica: 1, gpusPerNode: 1}\n  replicas: 1\n" + scheduling;
}

class Scheduling : public WebhookKubectlTest {
 protected:
  void Start(SchedulingPolicy policy) {
    if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
    (void)cluster_.server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                                      {"metadata", {{"name", "moeserve-system"}}}});  // FakeCluster may have made it
    OperatorOptions options;
    options.reconciler.platform.scheduling = std::move(policy);
    StartOperator(options);
    if (HasFatalFailure()) return;
    InstallWebhook();
  }
  // kubectl apply is refused by the webhook with `message`, and nothing is stored.
  void ExpectRefused(const std::string& scheduling, const std::string& message) {
    SCOPED_TRACE(scheduling);
    auto applied = kubectl_->Apply("m", Yaml("m", scheduling));
    EXPECT_NE(applied.rc, 0) << applied.output;
    EXPECT_NE(applied.output.find("admission webhook \"quota.moeserve.io\" denied the request: spec: " + message),
              std::string::npos)
        << applied.output;
    EXPECT_FALSE(cluster_.server.Get(kMd, "team-a", "m"));
  }
  void ExpectAdmitted(const std::string& name, const std::string& scheduling) {
    SCOPED_TRACE(scheduling);
    auto applied = kubectl_->Apply(name, Yaml(name, scheduling));
    EXPECT_EQ(applied.rc, 0) << applied.output;
    EXPECT_TRUE(WaitFor([&] { return cluster_.server.Get("statefulsets.apps", "team-a", name + "-r0").has_value(); }));
  }

};

TEST_F(Scheduling, ControlPlaneTolerationsAndAffinityAreRefusedByDefault) {
  Start({});
  ExpectRefused("  tolerations:\n  - {key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}\n",
                "spec.tolerations[0].key: \"node-role.kubernetes.io/control-plane\" would let the pods onto "
                "control-plane nodes; is not among the toleration keys the platform allows [nvidia.com/gpu, amd.com/gpu]");
  ExpectRefused("  tolerations:\n  - {key: nvidia.com/gpu, operator: Exists}\n"
                "  - {key: node-role.kubernetes.io/master, operator: Exists}\n",
                "spec.tolerations[1].key: \"node-role.kubernetes.io/master\" would let the pods onto control-plane nodes");
  ExpectRefused("  tolerations:\n  - {operator: Exists}\n",
                "spec.tolerations[0]: an empty key with operator Exists tolerates every taint");
  ExpectRefused("  tolerations:\n  - {key: dedicated, operator: Equal, value: infra, effect: NoSchedule}\n",
                "spec.tolerations[0].key: \"dedicated\" is not among the toleration keys the platform allows");
  ExpectRefused("  nodeSelector: {node-role.kubernetes.io/control-plane: \"\"}\n",
                "spec.nodeSelector[\"node-role.kubernetes.io/control-plane\"]: selects control-plane nodes");
  ExpectRefused("  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n"
                "        nodeSelectorTerms:\n        - matchExpressions:\n"
                "          - {key: node-role.kubernetes.io/control-plane, operator: Exists}\n",
                "spec.affinity: not allowed; the platform does not let MoEDeployments set affinity");
  // What a GPU tenant needs still passes, and reaches the pods.
  ExpectAdmitted("gpu", "  nodeSelector: {nvidia.com/gpu.product: NVIDIA-H200}\n"
                        "  tolerations:\n  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n");
  const json pod = (*cluster_.server.Get("statefulsets.apps", "team-a", "gpu-r0"))["spec"]["template"]["spec"];
  EXPECT_EQ(pod["tolerations"][0]["key"], "nvidia.com/gpu");
  EXPECT_EQ(pod["nodeSelector"]["nvidia.com/gpu.product"], "NVIDIA-H200");
  // An UPDATE that adds a control-plane toleration is refused too.
  auto added = kubectl_->Apply("gpu", Yaml("gpu", "  tolerations:\n  - {key: node-role.kubernetes.io/control-plane, operator: Exists}\n"));
  EXPECT_NE(added.rc, 0) << added.output;
  EXPECT_NE(added.output.find("spec.tolerations[0].key: \"node-role.kubernetes.io/control-plane\""), std::string::npos)
      << added.output;
}

TEST_F(Scheduling, ThePlatformsAllowListDecides) {
  SchedulingPolicy policy;
  policy.toleration_keys = {"dedicated", "node-role.kubernetes.io/control-plane"};
  policy.node_selector_keys = {"pool"};
  policy.allow_affinity = true;
  Start(policy);
  ExpectRefused("  nodeSelector: {topology.kubernetes.io/zone: a}\n",
                "spec.nodeSelector[\"topology.kubernetes.io/zone\"]: the platform allows nodeSelector keys [pool] only");
  ExpectRefused("  tolerations:\n  - {key: nvidia.com/gpu, operator: Exists}\n",
                "spec.tolerations[0].key: \"nvidia.com/gpu\" is not among the toleration keys the platform allows "
                "[dedicated, node-role.kubernetes.io/control-plane]");
  ExpectRefused("  tolerations:\n  - {operator: Exists}\n", "spec.tolerations[0]: an empty key with operator Exists");
  ExpectAdmitted("allowed", "  nodeSelector: {pool: gpu}\n"
                            "  tolerations:\n  - {key: dedicated, operator: Equal, value: moe, effect: NoSchedule}\n"
                            "  - {key: node-role.kubernetes.io/control-plane, operator: Exists}\n"
                            "  affinity:\n    podAntiAffinity:\n      preferredDuringSchedulingIgnoredDuringExecution:\n"
                            "      - weight: 10\n        podAffinityTerm:\n          topologyKey: kubernetes.io/hostname\n"
                            "          labelSelector: {matchLabels: {app: x}}\n");
  const json pod = (*cluster_.server.Get("statefulsets.apps", "team-a", "allowed-r0"))["spec"]["template"]["spec"];
  EXPECT_TRUE(pod.contains("affinity"));
  EXPECT_EQ(pod["tolerations"].size(), 2u);
}

TEST_F(Scheduling, TheReconcilerHoldsOneThatGotInWithoutTheWebhookAndRemovesItsGroups) {
  Start({});
  ExpectAdmitted("m", "");
  ASSERT_TRUE(cluster_.server.Delete(kVwc, "", "moeserve-quota"));  // as if the webhook were down (Ignore)
  auto applied = kubectl_->Apply("m", Yaml("m", "  tolerations:\n  - {operator: Exists}\n"));
  ASSERT_EQ(applied.rc, 0) << applied.output;
  ASSERT_TRUE(WaitFor([&] { return ConditionOf(cluster_.server, "team-a", "m", "Ready").value("reason", "") == "InvalidSpec"; }))
      << StatusOf(cluster_.server, "team-a", "m").dump(2);
  EXPECT_NE(ConditionOf(cluster_.server, "team-a", "m", "Ready").value("message", "").find(
                "spec.tolerations[0]: an empty key with operator Exists tolerates every taint"),
            std::string::npos);
  EXPECT_TRUE(WaitFor([&] { return !cluster_.server.Get("statefulsets.apps", "team-a", "m-r0").has_value(); }))
      << "the group made before the refusal still runs";
  for (const auto& sts : cluster_.server.List("statefulsets.apps", "team-a"))
    EXPECT_FALSE(sts["spec"]["template"]["spec"].contains("tolerations")) << sts.dump();
}

TEST(SchedulingPolicy, KeyListsFromFlags) {
  EXPECT_EQ(ParseKeyList(""), std::vector<std::string>{});
  EXPECT_EQ(ParseKeyList("nvidia.com/gpu, amd.com/gpu,"), (std::vector<std::string>{"nvidia.com/gpu", "amd.com/gpu"}));
  EXPECT_EQ(ParseKeyList("*"), std::vector<std::string>{"*"});
  // "*" never covers the control plane's keys.
  SchedulingPolicy any;
  any.toleration_keys = {"*"};
  EXPECT_TRUE(CheckScheduling(json(), json::array({{{"key", "dedicated"}, {"operator", "Exists"}}}), json(), any));
  EXPECT_FALSE(CheckScheduling(json(), json::array({{{"key", "node-role.kubernetes.io/master"}, {"operator", "Exists"}}}),
                               json(), any));
  EXPECT_FALSE(CheckScheduling(json(), json::array({{{"operator", "Exists"}}}), json(), any));
  EXPECT_FALSE(CheckScheduling(json(), json::array({{{"key", 7}}}), json(), any));
  EXPECT_FALSE(CheckScheduling(json{{"a", 1}}, json(), json(), any));
}

}  // namespace
}  // namespace moeserve::op::testing
