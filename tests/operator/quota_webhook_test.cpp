// The quota webhook end to end: the real kubectl applies and scales
// MoEDeployments through the API double, which calls the operator's HTTPS
// webhook (verified against the caBundle the operator wrote); refusals are
// checked as kubectl prints them. Objects that get in anyway (webhook down
// with failurePolicy Ignore, a policy tightened later) are held by the
// reconciler at QuotaAdmitted=False, phase QuotaExceeded, with no new groups.
#include "webhook_kubectl_fixture.hpp"

namespace moeserve::op::testing {
namespace {

const std::string& kVwc = kValidatingWebhookConfigurations;
const std::string kMd = "moedeployments.moeserve.io";

class QuotaWebhook : public WebhookKubectlTest {
 protected:
  void SetUp() override {
    if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
    (void)cluster_.server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                                      {"metadata", {{"name", "moeserve-system"}}}});  // FakeCluster may have made it
    StartOperator();
  }
  // Applies a policy and waits until the operator has judged with it.
  void ApplyPolicy(int max_gpus, int max_replicas) {
    auto applied = kubectl_->Apply("policy", PolicyYaml("team-a", max_gpus, max_replicas));
    ASSERT_EQ(applied.rc, 0) << applied.output;
    ASSERT_TRUE(WaitFor([&] {
      auto p = cluster_.server.Get("quotapolicies.moeserve.io", "team-a", "team-a");
      if (!p) return false;
      const int64_t generation = (*p)["metadata"].value("generation", int64_t{0});
      return (*p).value("status", json::object()).value("observedGeneration", int64_t{-1}) == generation;
    })) << "the QuotaPolicy status was never written";
  }
  json Condition(const std::string& name, const std::string& type) {
    return ConditionOf(cluster_.server, "team-a", name, type);
  }

};

TEST_F(QuotaWebhook, KubectlApplyAndScaleAreRefusedPastThePolicyWithTheMessage) {
  InstallWebhook("Fail");
  ApplyPolicy(32, 4);

  auto small = kubectl_->Apply("small", DeploymentYaml("small", 2));
  ASSERT_EQ(small.rc, 0) << small.output;
  EXPECT_NE(small.output.find("moedeployment.moeserve.io/small created"), std::string::npos) << small.output;

  auto big = kubectl_->Apply("big", DeploymentYaml("big", 4));
  EXPECT_NE(big.rc, 0);
  EXPECT_NE(big.output.find("admission webhook \"quota.moeserve.io\" denied the request: QuotaPolicy team-a: "
                            "limits.maxGPUs is 32; this MoEDeployment would bring the namespace to 48"),
            std::string::npos)
      << big.output;
  EXPECT_NE(big.output.find("Error from server (Forbidden)"), std::string::npos) << big.output;
  EXPECT_FALSE(cluster_.server.Get(kMd, "team-a", "big"));

  // The scale subresource: growing past the policy is refused, up to it is not.
  auto too_far = (*kubectl_)("scale moedeployment small -n team-a --replicas=5");
  EXPECT_NE(too_far.rc, 0);
  EXPECT_NE(too_far.output.find("admission webhook \"quota.moeserve.io\" denied the request: QuotaPolicy team-a: "
                                "limits.maxGPUs is 32; this MoEDeployment would bring the namespace to 40"),
            std::string::npos)
      << too_far.output;
  EXPECT_NE(too_far.output.find("limits.maxReplicas is 4"), std::string::npos) << too_far.output;
  EXPECT_EQ((*cluster_.server.Get(kMd, "team-a", "small"))["spec"]["replicas"], 2);
  auto up_to = (*kubectl_)("scale moedeployment small -n team-a --replicas=4");
  ASSERT_EQ(up_to.rc, 0) << up_to.output;
  EXPECT_EQ((*cluster_.server.Get(kMd, "team-a", "small"))["spec"]["replicas"], 4);

  // Within the limits and admitted, as the webhook said.
  ASSERT_TRUE(WaitFor([&] { return GroupsOf(cluster_.server, "small") == 4; }));
  EXPECT_EQ(Condition("small", "QuotaAdmitted").value("status", ""), "True");
  EXPECT_EQ(Condition("small", "QuotaAdmitted").value("reason", ""), "WithinQuota");

  // The policy reports what is used.
  ASSERT_TRUE(WaitFor([&] {
    auto p = cluster_.server.Get("quotapolicies.moeserve.io", "team-a", "team-a");
    for (const auto& c : p->value("status", json::object()).value("conditions", json::array()))
      if (c.value("type", "") == "Ready") return c.value("message", "") == "GPUs 32/32, replicas 4/4 in 1 admitted MoEDeployments";
    return false;
  }));
}

TEST_F(QuotaWebhook, AGovernedNamespaceRefusesADeploymentWithoutAPolicyReference) {
  InstallWebhook("Fail");
  ApplyPolicy(32, 4);
  auto loose = kubectl_->Apply("loose", DeploymentYaml("loose", 1, ""));
  EXPECT_NE(loose.rc, 0);
  EXPECT_NE(loose.output.find("admission webhook \"quota.moeserve.io\" denied the request: namespace team-a is "
                              "governed by QuotaPolicy [team-a] and has no default"),
            std::string::npos)
      << loose.output;
  // With a default policy, it is governed by that one instead.
  auto defaults = kubectl_->Apply("default-policy", PolicyYaml("default", 8, 1));
  ASSERT_EQ(defaults.rc, 0) << defaults.output;
  ASSERT_TRUE(WaitFor([&] { return cluster_.server.Get("quotapolicies.moeserve.io", "team-a", "default")
                                       ->value("status", json::object()).contains("conditions"); }));
  auto fits = kubectl_->Apply("loose", DeploymentYaml("loose", 1, ""));
  ASSERT_EQ(fits.rc, 0) << fits.output;
  auto over = kubectl_->Apply("loose2", DeploymentYaml("loose2", 1, ""));
  EXPECT_NE(over.output.find("QuotaPolicy default: limits.maxGPUs is 8; this MoEDeployment would bring the "
                             "namespace to 16"),
            std::string::npos)
      << over.output;
}

TEST_F(QuotaWebhook, WebhookDownFailRefusesIgnoreAdmitsAndTheReconcilerHoldsIt) {
  ApplyPolicy(16, 4);
  auto small = kubectl_->Apply("small", DeploymentYaml("small", 2));
  ASSERT_EQ(small.rc, 0) << small.output;
  ASSERT_TRUE(WaitFor([&] { return GroupsOf(cluster_.server, "small") == 2; }));
  std::this_thread::sleep_for(1100ms);  // creationTimestamp has whole seconds: small is older

  // The webhook is down: nothing listens where its Service points.
  InstallWebhook("Fail");
  cluster_.server.admission().MapService("moeserve-system", "moeserve-webhook", {1});
  auto refused = kubectl_->Apply("extra", DeploymentYaml("extra", 1));
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(refused.output.find("Internal error occurred: failed calling webhook \"quota.moeserve.io\""),
            std::string::npos)
      << refused.output;
  ASSERT_TRUE(cluster_.server.Mutate(kVwc, "", "moeserve-quota",
                                     [](json& o) { o["webhooks"][0]["failurePolicy"] = "Ignore"; }));
  auto ignored = kubectl_->Apply("extra", DeploymentYaml("extra", 1));
  ASSERT_EQ(ignored.rc, 0) << ignored.output;

  // It got in: held, with no groups; the older deployment keeps its own.
  ASSERT_TRUE(WaitFor([&] { return Condition("extra", "QuotaAdmitted").value("status", "") == "False"; }));
  EXPECT_EQ(Condition("extra", "QuotaAdmitted").value("reason", ""), "QuotaExceeded");
  EXPECT_EQ(Condition("extra", "QuotaAdmitted").value("message", ""),
            "QuotaPolicy team-a: limits.maxGPUs is 16; this MoEDeployment would bring the namespace to 24");
  EXPECT_EQ(StatusOf(cluster_.server, "team-a", "extra").value("phase", ""), "QuotaExceeded");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(GroupsOf(cluster_.server, "extra"), 0u);
  EXPECT_EQ(GroupsOf(cluster_.server, "small"), 2u);
  EXPECT_EQ(Condition("small", "QuotaAdmitted").value("status", ""), "True");

  // Room made: deleting the older one admits it.
  ASSERT_EQ((*kubectl_)("delete moedeployment small -n team-a --wait=false").rc, 0);
  ASSERT_TRUE(WaitFor([&] { return Condition("extra", "QuotaAdmitted").value("status", "") == "True"; }));
  ASSERT_TRUE(WaitFor([&] { return GroupsOf(cluster_.server, "extra") == 1; }));
}

TEST_F(QuotaWebhook, TighteningAPolicyHoldsTheNewestDeploymentsWithoutNewGroups) {
  InstallWebhook("Fail");
  ApplyPolicy(32, 4);
  ASSERT_EQ(kubectl_->Apply("first", DeploymentYaml("first", 2)).rc, 0);
  std::this_thread::sleep_for(1100ms);  // creationTimestamp has whole seconds: first is older
  ASSERT_EQ(kubectl_->Apply("second", DeploymentYaml("second", 2)).rc, 0);
  ASSERT_TRUE(WaitFor([&] { return GroupsOf(cluster_.server, "first") == 2 && GroupsOf(cluster_.server, "second") == 2; }));

  // Budgeting's part of the status, which the quota reconciler must keep.
  const json usage = json::array({{{"tenant", "a"}, {"period", "day"}, {"spentUSD", 1.5}}});
  ASSERT_TRUE(cluster_.server.Mutate("quotapolicies.moeserve.io", "team-a", "team-a",
                                     [&](json& o) { o["status"]["usage"] = usage; }, /*status=*/true));
  ApplyPolicy(16, 4);
  ASSERT_TRUE(WaitFor([&] { return Condition("second", "QuotaAdmitted").value("status", "") == "False"; }));
  EXPECT_EQ(Condition("second", "QuotaAdmitted").value("reason", ""), "QuotaExceeded");
  EXPECT_EQ(StatusOf(cluster_.server, "team-a", "second").value("phase", ""), "QuotaExceeded");
  EXPECT_EQ(Condition("first", "QuotaAdmitted").value("status", ""), "True");
  // Held as it is: its groups stay, none is added.
  EXPECT_EQ(GroupsOf(cluster_.server, "second"), 2u);
  ASSERT_TRUE(WaitFor([&] {
    auto p = cluster_.server.Get("quotapolicies.moeserve.io", "team-a", "team-a");
    for (const auto& c : p->value("status", json::object()).value("conditions", json::array()))
      if (c.value("type", "") == "QuotaExceeded") return c.value("status", "") == "True";
    return false;
  }));
  EXPECT_EQ((*cluster_.server.Get("quotapolicies.moeserve.io", "team-a", "team-a"))["status"]["usage"], usage);

  // Growing it further is refused; shrinking it is allowed, and removes groups.
  auto grow = (*kubectl_)("scale moedeployment second -n team-a --replicas=3");
  EXPECT_NE(grow.rc, 0);
  EXPECT_NE(grow.output.find("would bring the namespace to 40"), std::string::npos) << grow.output;
  auto shrink = (*kubectl_)("scale moedeployment second -n team-a --replicas=1");
  ASSERT_EQ(shrink.rc, 0) << shrink.output;
  ASSERT_TRUE(WaitFor([&] { return GroupsOf(cluster_.server, "second") == 1; }));
  // Still over (16 + 8 > 16): held at one group.
  EXPECT_EQ(Condition("second", "QuotaAdmitted").value("status", ""), "False");

  // A direct write (what a client gets past a webhook that is down) to grow
  // it adds no group while it is over quota.
  ASSERT_TRUE(cluster_.server.Mutate(kMd, "team-a", "second", [](json& o) { o["spec"]["replicas"] = 3; }));
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(GroupsOf(cluster_.server, "second"), 1u);
}

}  // namespace
}  // namespace moeserve::op::testing
