// The quota webhook refuses Vault paths a MoEDeployment may not name, as
// kubectl prints it: a path under the hook keys' reserved prefix (however
// spelled), and one outside the governing QuotaPolicy's
// spec.vault.allowedPathPrefixes, and a login as the role hook keys are read
// with (spec.vault.role); a path inside is admitted. The real
// kubectl talks to the API double, which calls the operator's webhook.
#include "webhook_kubectl_fixture.hpp"

namespace moeserve::op::testing {
namespace {

const std::string kMd = "moedeployments.moeserve.io";

// One replica group of 8 GPUs under QuotaPolicy team-a, its object-store credentials from Vault.
std::string VaultDeploymentYaml(const std::string& name, const std::string& credentials_path) {
  return "apiVersion: moeserve.io/v1alpha1\nkind: MoEDeployment\nmetadata:\n  name: " + name +
         "\n  namespace: team-a\nspec:\n  image: moeserve/moe-daemon:0.1.0\n  model:\n    uri: s3://models/m/\n"
         "    credentials: {vault: {path: \"" + credentials_path + "\"}}\n"
         "  parallelism: {nodesPerReplica: 1, gpusPerNode: 8}\n  replicas: 1\n  quotaPolicyRef: {name: team-a}\n";
}

class VaultWebhook : public WebhookKubectlTest {
 protected:
  void SetUp() override {
    if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
    OperatorOptions options;
    options.hook_secrets.vault_prefix = "secret/data/moeserve-hooks";
    StartOperator(options);
    if (HasFatalFailure()) return;
    InstallWebhook();
  }
};

TEST_F(VaultWebhook, KubectlApplyOfAForbiddenVaultPathIsRefusedNamingTheField) {
  auto policy = kubectl_->Apply("policy", PolicyYaml("team-a", 64, 8) +
                                              "  vault:\n    allowedPathPrefixes: [secret/data/team-a/]\n");
  ASSERT_EQ(policy.rc, 0) << policy.output;

  // The hook's path, through a `..` that an allowed prefix would otherwise cover.
  auto hook = kubectl_->Apply("hook", VaultDeploymentYaml("hook", "secret/data/team-a/../moeserve-hooks/team-a/sre"));
  EXPECT_NE(hook.rc, 0);
  EXPECT_NE(hook.output.find("admission webhook \"quota.moeserve.io\" denied the request: spec: "
                             "spec.model.credentials.vault.path: "),
            std::string::npos)
      << hook.output;
  EXPECT_FALSE(cluster_.server.Get(kMd, "team-a", "hook"));
  auto direct = kubectl_->Apply("direct", VaultDeploymentYaml("direct", "secret/data/moeserve-hooks/team-a/sre"));
  EXPECT_NE(direct.rc, 0);
  EXPECT_NE(direct.output.find("spec.model.credentials.vault.path: secret/data/moeserve-hooks/team-a/sre is under "
                               "secret/data/moeserve-hooks, which is reserved for the platform's hook keys"),
            std::string::npos)
      << direct.output;

  // Another team's path: outside the policy's prefixes.
  auto other = kubectl_->Apply("other", VaultDeploymentYaml("other", "secret/data/team-b/s3"));
  EXPECT_NE(other.rc, 0);
  EXPECT_NE(other.output.find("spec.model.credentials.vault.path: secret/data/team-b/s3 is outside the Vault paths "
                              "QuotaPolicy team-a allows (spec.vault.allowedPathPrefixes [secret/data/team-a])"),
            std::string::npos)
      << other.output;
  EXPECT_FALSE(cluster_.server.Get(kMd, "team-a", "other"));

  auto own = kubectl_->Apply("own", VaultDeploymentYaml("own", "secret/data/team-a/s3"));
  ASSERT_EQ(own.rc, 0) << own.output;
  EXPECT_TRUE(cluster_.server.Get(kMd, "team-a", "own"));
}

TEST_F(VaultWebhook, KubectlApplyNamingTheHookRoleIsRefusedNamingTheField) {
  auto policy = kubectl_->Apply("policy", PolicyYaml("team-a", 64, 8) +
                                              "  vault:\n    allowedPathPrefixes: [secret/data/team-a/]\n");
  ASSERT_EQ(policy.rc, 0) << policy.output;
  // An allowed path, but read as the role the operator reads hook keys with.
  std::string yaml = VaultDeploymentYaml("as-hooks", "secret/data/team-a/s3") + "  vault: {role: moeserve-hooks}\n";
  auto as_hooks = kubectl_->Apply("as-hooks", yaml);
  EXPECT_NE(as_hooks.rc, 0);
  EXPECT_NE(as_hooks.output.find("spec.vault.role: moeserve-hooks is the role moe-operator reads hook keys with"),
            std::string::npos)
      << as_hooks.output;
  EXPECT_FALSE(cluster_.server.Get(kMd, "team-a", "as-hooks"));
  // Its own role is fine.
  auto own = kubectl_->Apply("own-role", VaultDeploymentYaml("own-role", "secret/data/team-a/s3") +
                                             "  vault: {role: team-a-models}\n");
  ASSERT_EQ(own.rc, 0) << own.output;
  EXPECT_TRUE(cluster_.server.Get(kMd, "team-a", "own-role"));
}

}  // namespace
}  // namespace moeserve::op::testing
