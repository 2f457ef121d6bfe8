// DecideQuota, the one function the webhook and the reconciler share: which
// policy governs, sums over the namespace (first come, first served), each
// limit with the message kubectl shows, and NewOrWorse for updates.
#include <gtest/gtest.h>

#include "moeserve/operator/quota_policy.hpp"

namespace moeserve::op {
namespace {

json Policy(const std::string& name, json limits, const std::string& ns = "team-a") {
  return {{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "QuotaPolicy"},
          {"metadata", {{"name", name}, {"namespace", ns}}}, {"spec", {{"limits", limits}}}};
}

json Deployment(const std::string& name, int replicas, int nodes, int gpus, const std::string& policy = "team-a",
                const std::string& created = "2026-12-01T00:00:00Z") {
  json md = {{"apiVersion", "moeserve.io/v1alpha1"},
             {"kind", "MoEDeployment"},
             {"metadata", {{"name", name}, {"namespace", "team-a"}, {"creationTimestamp", created}}},
             {"spec",
              {{"image", "registry.internal/moeserve/moe-daemon:0.1.0"},
               {"model", {{"uri", "s3://models/m/"}}},
               {"parallelism", {{"nodesPerReplica", nodes}, {"gpusPerNode", gpus}}},
               {"replicas", replicas}}}};
  if (!policy.empty()) md["spec"]["quotaPolicyRef"] = {{"name", policy}};
  return md;
}

QuotaEvaluation Decide(const json& md, const std::vector<json>& policies, const std::vector<json>& deployments) {
  auto spec = ParseMoEDeploymentSpec(md["spec"]);
  EXPECT_TRUE(spec) << spec.error().ToString();
  return DecideQuota(md, *spec, policies, deployments);
}

TEST(QuotaPolicy, GpusAreSummedOverTheNamespaceWithTheMessageKubectlShows) {
  const std::vector<json> policies = {Policy("team-a", {{"maxGPUs", 32}, {"maxReplicas", 4}})};
  const json first = Deployment("first", 2, 1, 8, "team-a", "2026-12-01T00:00:00Z");   // 16 GPUs
  const json second = Deployment("second", 2, 2, 8, "team-a", "2026-12-01T00:00:05Z");  // 32 GPUs
  auto ok = Decide(first, policies, {first, second});
  EXPECT_TRUE(ok.decision.admitted) << ok.decision.message;
  EXPECT_EQ(ok.namespace_gpus, 16);  // the later one does not count against the earlier
  auto over = Decide(second, policies, {first, second});
  ASSERT_FALSE(over.decision.admitted);
  EXPECT_EQ(over.decision.reason, "QuotaExceeded");
  EXPECT_EQ(over.decision.message,
            "QuotaPolicy team-a: limits.maxGPUs is 32; this MoEDeployment would bring the namespace to 48");
  EXPECT_EQ(over.namespace_gpus, 48);
}

TEST(QuotaPolicy, ReplicasContextTiersAndImagesEachNameLimitRequestAndAllowed) {
  const std::vector<json> policies = {Policy("team-a", {{"maxReplicas", 1},
                                                        {"maxContextTokens", 65536},
                                                        {"allowedTiers", {"low", "medium"}},
                                                        {"allowedImages", {"registry.internal/moeserve/"}}})};
  json md = Deployment("big", 3, 1, 0);
  md["spec"]["engine"] = {{"maxContextTokens", 131072},
                          {"thinking", {{"defaultTier", "medium"}, {"budgets", {{"low", 1}, {"medium", 2}, {"high", 3}}}}}};
  md["spec"]["image"] = "docker.io/someone/daemon:1";
  auto e = Decide(md, policies, {});
  ASSERT_FALSE(e.decision.admitted);
  ASSERT_EQ(e.violations.size(), 4u) << e.decision.message;
  EXPECT_EQ(e.violations[0].message, "QuotaPolicy team-a: limits.maxReplicas is 1; this MoEDeployment would bring the namespace to 3");
  EXPECT_EQ(e.violations[1].message,
            "QuotaPolicy team-a: limits.maxContextTokens is 65536; spec.engine.maxContextTokens asks for 131072");
  EXPECT_EQ(e.violations[2].message,
            "QuotaPolicy team-a: limits.allowedTiers is [low, medium]; spec.engine.thinking configures [high]");
  EXPECT_EQ(e.violations[3].message,
            "QuotaPolicy team-a: limits.allowedImages is [registry.internal/moeserve/] (prefixes and digests); spec.image is "
            "docker.io/someone/daemon:1");
  // One message, the policy named once.
  EXPECT_EQ(e.decision.message.find("QuotaPolicy team-a"), e.decision.message.rfind("QuotaPolicy team-a"));

  // Inside every limit: admitted, and the message says how much is used.
  json fits = Deployment("fits", 1, 1, 8);
  fits["spec"]["engine"] = {{"maxContextTokens", 65536}, {"thinking", {{"defaultTier", "low"}}}};
  auto ok = Decide(fits, policies, {});
  EXPECT_TRUE(ok.decision.admitted) << ok.decision.message;
  EXPECT_EQ(ok.decision.reason, "WithinQuota");
}

TEST(QuotaPolicy, AGovernedNamespaceRequiresAReferenceUnlessADefaultExists) {
  const json no_ref = Deployment("loose", 1, 1, 8, "");
  auto ungoverned = Decide(no_ref, {}, {});
  EXPECT_TRUE(ungoverned.decision.admitted);
  EXPECT_EQ(ungoverned.decision.reason, "NoQuotaPolicy");

  auto required = Decide(no_ref, {Policy("team-a", {{"maxGPUs", 100}})}, {});
  ASSERT_FALSE(required.decision.admitted);
  EXPECT_EQ(required.decision.reason, "QuotaPolicyRequired");
  EXPECT_NE(required.decision.message.find("spec.quotaPolicyRef.name must name one"), std::string::npos);
  EXPECT_NE(required.decision.message.find("[team-a]"), std::string::npos);

  // The namespace's default policy governs deployments without a reference.
  auto defaulted = Decide(no_ref, {Policy("team-a", {}), Policy("default", {{"maxGPUs", 4}})}, {});
  EXPECT_EQ(defaulted.policy, "default");
  ASSERT_FALSE(defaulted.decision.admitted);
  EXPECT_EQ(defaulted.decision.message,
            "QuotaPolicy default: limits.maxGPUs is 4; this MoEDeployment would bring the namespace to 8");

  // A reference to a policy that does not exist is refused, governed namespace or not.
  auto missing = Decide(Deployment("typo", 1, 1, 8, "team-b"), {}, {});
  ASSERT_FALSE(missing.decision.admitted);
  EXPECT_EQ(missing.decision.reason, "QuotaPolicyNotFound");
}

TEST(QuotaPolicy, OnlyDeploymentsOfTheSamePolicyAndNamespaceCount) {
  const std::vector<json> policies = {Policy("team-a", {{"maxGPUs", 16}}), Policy("other", {{"maxGPUs", 1000}})};
  json elsewhere = Deployment("elsewhere", 10, 1, 8, "team-a", "2026-11-01T00:00:00Z");
  elsewhere["metadata"]["namespace"] = "team-b";
  const json other_policy = Deployment("other", 10, 1, 8, "other", "2026-11-01T00:00:00Z");
  json deleting = Deployment("deleting", 10, 1, 8, "team-a", "2026-11-01T00:00:00Z");
  deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z";
  const json md = Deployment("md", 2, 1, 8);
  auto e = Decide(md, policies, {elsewhere, other_policy, deleting, md});
  EXPECT_TRUE(e.decision.admitted) << e.decision.message;
  EXPECT_EQ(e.namespace_gpus, 16);
}

TEST(QuotaPolicy, NewOrWorseLetsAnOverQuotaDeploymentShrinkButNotGrow) {
  const std::vector<json> policies = {Policy("team-a", {{"maxGPUs", 8}, {"allowedImages", {"registry.internal/"}}})};
  const json at_4 = Deployment("md", 4, 1, 8);
  const json at_3 = Deployment("md", 3, 1, 8);
  const json at_5 = Deployment("md", 5, 1, 8);
  const auto before = Decide(at_4, policies, {});
  ASSERT_FALSE(before.decision.admitted);
  EXPECT_TRUE(NewOrWorse(Decide(at_3, policies, {}), before).empty());
  EXPECT_TRUE(NewOrWorse(Decide(at_4, policies, {}), before).empty());  // finalizers, labels: same footprint
  const auto grow = NewOrWorse(Decide(at_5, policies, {}), before);
  ASSERT_EQ(grow.size(), 1u);
  EXPECT_EQ(grow[0].limit, "limits.maxGPUs");
  // A different refused image is a new violation even at the same size.
  json image = at_3;
  image["spec"]["image"] = "docker.io/x:1";
  json image2 = at_3;
  image2["spec"]["image"] = "docker.io/y:1";
  const auto changed = NewOrWorse(Decide(image2, policies, {}), Decide(image, policies, {}));
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].limit, "limits.allowedImages");
}

TEST(QuotaPolicy, LimitsOfTheWrongTypeAreAnErrorNotAnException) {
  auto bad = ParseQuotaLimits(Policy("p", {{"maxGPUs", "lots"}}));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("spec.limits.maxGPUs"), std::string::npos);
  auto refused = Decide(Deployment("md", 1, 1, 8), {Policy("team-a", {{"allowedImages", "registry/"}})}, {});
  ASSERT_FALSE(refused.decision.admitted);
  EXPECT_EQ(refused.decision.reason, "InvalidQuotaPolicy");
}

}  // namespace
}  // namespace moeserve::op
