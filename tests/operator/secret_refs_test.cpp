// Secret references, attacked as a tenant would: with kubectl, a
// MoEDeployment that names Secrets of its namespace the tenant cannot read
// (credentials, apiKeys, TLS). Before, the operator copied any of them into
// a pod running the tenant's image. Now only Secrets labelled
// moeserve.io/usable=true are copied; others get SecretsSynced=False with
// reason SecretNotUsable, and none of their bytes reach the deployment's
// Secret.
#include <gtest/gtest.h>

#include "moeserve/common/base64.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

// Every value of the deployment's Secret, decoded, in one string.
std::string SecretBytes(fakes::FakeApiServer& server, const std::string& ns, const std::string& name) {
  auto secret = server.Get("secrets", ns, name);
  if (!secret) return "";
  std::string all;
  for (const auto& [k, v] : (*secret)["data"].items()) all += k + "=" + Base64Decode(v.get<std::string>()) + "\n";
  return all;
}

TEST(SecretRefs, OnlyUsableSecretsAreCopied) {
  if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
  FakeCluster cluster;
  auto& server = cluster.server;
  Kubectl kubectl(server);
  // Secrets of the namespace that the platform did not mark usable.
  auto secrets = kubectl.Apply("secrets", R"(apiVersion: v1
kind: Secret
metadata: {name: platform-s3, namespace: team-a}
stringData: {AWS_ACCESS_KEY_ID: AKIA-PLATFORM, AWS_SECRET_ACCESS_KEY: platform-s3-secret}
---
apiVersion: v1
kind: Secret
metadata: {name: other-keys, namespace: team-a}
stringData: {billing: other-teams-key}
---
apiVersion: v1
kind: Secret
metadata: {name: wildcard-tls, namespace: team-a}
type: kubernetes.io/tls
stringData: {tls.crt: WILDCARD-CERT, tls.key: WILDCARD-PRIVATE-KEY}
)");
  ASSERT_EQ(secrets.rc, 0) << secrets.output;
  auto applied = kubectl.Apply("md", R"(apiVersion: moeserve.io/v1alpha1
kind: MoEDeployment
metadata: {name: thief, namespace: team-a}
spec:
  image: attacker/exfiltrate:latest
  model:
    uri: s3://models/m/
    credentials: {secretRef: {name: platform-s3}}
  endpoint:
    apiKeys: {secretRef: {name: other-keys}}
    tls: {secretName: wildcard-tls}
)");
  ASSERT_EQ(applied.rc, 0) << applied.output;

  auto client = cluster.Client();
  OperatorOptions options;
  options.reconciler.secret_resync = 200ms;
  RunningOperator running(*client, options);
  ASSERT_TRUE(WaitFor([&] { return !ConditionOf(server, "team-a", "thief", "SecretsSynced").empty(); }));
  json synced = ConditionOf(server, "team-a", "thief", "SecretsSynced");
  EXPECT_EQ(synced["status"], "False");
  EXPECT_EQ(synced["reason"], "SecretNotUsable");
  for (const char* name : {"platform-s3", "other-keys", "wildcard-tls"})
    EXPECT_NE(synced["message"].get<std::string>().find(name), std::string::npos) << name << ": " << synced.dump();
  const std::string copied = SecretBytes(server, "team-a", "thief-secrets");
  ASSERT_FALSE(copied.empty()) << "the deployment's own Secret (its keys) is still written";
  for (const std::string& value : std::vector<std::string>{"AKIA-PLATFORM", "platform-s3-secret", "other-teams-key",
                                                           "WILDCARD-CERT", "WILDCARD-PRIVATE-KEY",
                                                           Sha256Hex("other-teams-key")})
    EXPECT_EQ(copied.find(value), std::string::npos) << value << " was copied";
  // kubectl describe shows the tenant why.
  auto described = kubectl("describe moedeployment thief -n team-a");
  EXPECT_NE(described.output.find("SecretNotUsable"), std::string::npos) << described.output;

  // The platform marks them usable: now they are copied.
  for (const char* name : {"platform-s3", "other-keys", "wildcard-tls"}) {
    auto labelled = kubectl(std::string("label secret ") + name + " -n team-a moeserve.io/usable=true");
    ASSERT_EQ(labelled.rc, 0) << labelled.output;
  }
  ASSERT_TRUE(WaitFor([&] { return ConditionOf(server, "team-a", "thief", "SecretsSynced").value("status", "") == "True"; }))
      << ConditionOf(server, "team-a", "thief", "SecretsSynced").dump();
  const std::string now_copied = SecretBytes(server, "team-a", "thief-secrets");
  for (const std::string& value :
       std::vector<std::string>{"platform-s3-secret", "WILDCARD-PRIVATE-KEY", Sha256Hex("other-teams-key")})
    EXPECT_NE(now_copied.find(value), std::string::npos) << value;
}

TEST(SecretRefs, UsableLabelRemovedDropsTheCopy) {
  FakeCluster cluster;
  auto& server = cluster.server;
  ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                        {"metadata", {{"name", "creds"}, {"namespace", "team-a"},
                                                      {"labels", {{kUsableLabel, "true"}}}}},
                                        {"stringData", {{"AWS_SECRET_ACCESS_KEY", "revocable"}}}}));
  json manifest = MoEDeploymentManifest("team-a", "m", 1, 1);
  manifest["spec"]["model"]["credentials"] = {{"secretRef", {{"name", "creds"}}}};
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", manifest));
  auto client = cluster.Client();
  OperatorOptions options;
  options.reconciler.secret_resync = 100ms;
  RunningOperator running(*client, options);
  ASSERT_TRUE(WaitFor([&] { return SecretBytes(server, "team-a", "m-secrets").find("revocable") != std::string::npos; }));
  ASSERT_TRUE(server.Mutate("secrets", "team-a", "creds", [](json& o) { o["metadata"]["labels"][kUsableLabel] = "false"; }));
  ASSERT_TRUE(WaitFor([&] { return SecretBytes(server, "team-a", "m-secrets").find("revocable") == std::string::npos; }));
  EXPECT_TRUE(WaitFor([&] { return ConditionOf(server, "team-a", "m", "SecretsSynced").value("reason", "") == "SecretNotUsable"; }))
      << ConditionOf(server, "team-a", "m", "SecretsSynced").dump();
}

}  // namespace
}  // namespace moeserve::op::testing
