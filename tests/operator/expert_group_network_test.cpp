// operator.expert_group_network: a multi-node replica group gets what its
// ranks need to find each other and nothing more reach them: the
// rendezvous port on the headless Service and on the pods, each pod's IP
// and the group's secret as a file (a Secret key minted once and kept), and
// a NetworkPolicy that admits the group's own pods to every port and
// everyone else to the API port only. A single-node group gets none of it.
#include <gtest/gtest.h>

#include "moeserve/common/base64.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

using json = nlohmann::json;

json EnvOf(const json& sts, const std::string& name) {
  for (const auto& c : sts["spec"]["template"]["spec"]["containers"])
    if (c["name"] == "moe-daemon")
      for (const auto& e : c["env"])
        if (e["name"] == name) return e;
  return nullptr;
}

TEST(ExpertGroupNetwork, MultiNodeGroupsGetRendezvousSecretAndNetworkPolicy) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  json manifest = MoEDeploymentManifest("team-a", "ultra", 2, 2);
  manifest["spec"]["parallelism"]["gpusPerNode"] = 0;
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", manifest));
  OperatorOptions options;
  RunningOperator running(*client, options);

  ASSERT_TRUE(WaitFor([&] { return server.List("networkpolicies.networking.k8s.io", "team-a").size() == 2; }));
  auto policy = server.Get("networkpolicies.networking.k8s.io", "team-a", "ultra-r1");
  ASSERT_TRUE(policy);
  const json& spec = (*policy)["spec"];
  const json group = spec["podSelector"]["matchLabels"];
  EXPECT_EQ(group.value(kReplicaLabel, ""), "1");
  EXPECT_EQ(spec["policyTypes"], json::array({"Ingress"}));
  ASSERT_EQ(spec["ingress"].size(), 2u);
  EXPECT_EQ(spec["ingress"][0]["from"][0]["podSelector"]["matchLabels"], group);
  EXPECT_FALSE(spec["ingress"][0].contains("ports")) << "the group's own pods reach every port";
  EXPECT_FALSE(spec["ingress"][1].contains("from"));
  EXPECT_EQ(spec["ingress"][1]["ports"], json::array({{{"port", 8000}, {"protocol", "TCP"}}}));
  EXPECT_EQ((*policy)["metadata"]["ownerReferences"][0]["name"], "ultra");

  auto svc = server.Get("services", "team-a", "ultra-r0");
  ASSERT_TRUE(svc);
  bool rendezvous = false;
  for (const auto& p : (*svc)["spec"]["ports"]) rendezvous |= p["name"] == "rendezvous" && p["port"] == kRendezvousPort;
  EXPECT_TRUE(rendezvous) << svc->dump(2);
  EXPECT_EQ((*svc)["spec"]["publishNotReadyAddresses"], true);

  ASSERT_TRUE(WaitFor([&] { return server.List("statefulsets.apps", "team-a").size() == 2; }));
  auto sts = server.Get("statefulsets.apps", "team-a", "ultra-r0");
  ASSERT_TRUE(sts);
  EXPECT_EQ(EnvOf(*sts, "MOE_GROUP_SECRET_FILE")["value"], std::string(kSecretsDir) + "/" + kGroupSecretKey);
  EXPECT_EQ(EnvOf(*sts, "MOE_POD_IP")["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
  EXPECT_EQ(EnvOf(*sts, "MOE_RENDEZVOUS_PORT")["value"], std::to_string(kRendezvousPort));
  EXPECT_TRUE(EnvOf(*sts, "MOE_GROUP_SECRET").is_null()) << "the secret is a file, never an environment value";

  // The Secret carries a minted group secret, kept across reconciles.
  ASSERT_TRUE(WaitFor([&] { return server.Get("secrets", "team-a", desired::SecretName(manifest)).has_value(); }));
  auto secret = server.Get("secrets", "team-a", desired::SecretName(manifest));
  ASSERT_TRUE(secret && (*secret)["data"].contains(kGroupSecretKey)) << secret->dump(2);
  const std::string minted = Base64Decode((*secret)["data"][kGroupSecretKey].get<std::string>());
  EXPECT_GE(minted.size(), 16u);
  const uint64_t before = running.op.reconciles();
  ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "ultra", [](json& md) { md["spec"]["replicas"] = 1; }));
  ASSERT_TRUE(WaitFor([&] { return running.op.reconciles() > before; }));
  // Scaling down removes the group's policy with the group.
  ASSERT_TRUE(WaitFor([&] { return server.List("networkpolicies.networking.k8s.io", "team-a").size() == 1; }));
  secret = server.Get("secrets", "team-a", desired::SecretName(manifest));
  ASSERT_TRUE(secret);
  EXPECT_EQ(Base64Decode((*secret)["data"][kGroupSecretKey].get<std::string>()), minted);
}

TEST(ExpertGroupNetwork, SingleNodeGroupsGetNone) {
  json manifest = MoEDeploymentManifest("team-a", "solo", 1, 1);
  auto spec = ParseMoEDeploymentSpec(manifest["spec"]);
  ASSERT_TRUE(spec) << spec.error().ToString();
  manifest["metadata"]["uid"] = "u-2";
  const json sts = desired::StatefulSet(manifest, *spec, 0, "hash");
  EXPECT_TRUE(EnvOf(sts, "MOE_GROUP_SECRET_FILE").is_null());
  EXPECT_TRUE(EnvOf(sts, "MOE_POD_IP").is_null());
  const json svc = desired::GroupService(manifest, *spec, 0);
  EXPECT_EQ(svc["spec"]["ports"].size(), 1u);
}

}  // namespace
}  // namespace moeserve::op::testing
