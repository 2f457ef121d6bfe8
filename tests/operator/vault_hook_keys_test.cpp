// The keys that sign budget alerts are the platform's. A tenant that names
// the hook's Vault path in its own MoEDeployment (directly, or spelled with
// `..`, `//`, percent-encoding) gets nothing copied into its namespace, even
// where its Vault role could read that path; a QuotaPolicy's
// spec.vault.allowedPathPrefixes bounds what is copied; hook keys are read
// with the operator's own Vault identity (the ServiceAccount in the
// operator's namespace, the hook role), never the tenant namespace's, and
// hook Secrets only from the operator's namespace.
#include <gtest/gtest.h>

#include "moeserve/common/base64.hpp"
#include "moeserve/operator/hook_secret_source.hpp"
#include "moeserve/operator/vault_integration.hpp"
#include "vault_test_util.hpp"

namespace moeserve::op::testing {
namespace {

using namespace std::chrono_literals;

constexpr char kHookKey[] = "whsec-platform-signing-key-3f9a";
constexpr char kHookPrefix[] = "secret/data/moeserve-hooks";
constexpr char kHookPath[] = "secret/data/moeserve-hooks/team-a/sre";

json VaultDeployment(const std::string& name, const std::string& credentials_path, const std::string& keys_path = "") {
  json md = MoEDeploymentManifest("team-a", name, 1, 1);
  if (!credentials_path.empty()) md["spec"]["model"]["credentials"] = {{"vault", {{"path", credentials_path}}}};
  if (!keys_path.empty()) md["spec"]["endpoint"]["apiKeys"] = {{"vault", {{"path", keys_path}}}};
  return md;
}

class VaultHookKeys : public ::testing::Test {
 protected:
  VaultHookKeys() : client(world.cluster.Client()), integration(*client, world.Config(), world.Auth()) {
    // The operator's own Vault identity: its namespace's moeserve-vault, as role moeserve-hooks.
    EXPECT_TRUE(server().Create("serviceaccounts", {{"apiVersion", "v1"},
                                                    {"kind", "ServiceAccount"},
                                                    {"metadata", {{"name", "moeserve-vault"}, {"namespace", "moeserve-system"}}}}));
    fakes::FakeVaultRole hooks;
    hooks.bound_service_account_names = {"moeserve-vault"};
    hooks.bound_service_account_namespaces = {"moeserve-system"};
    hooks.audience = "vault";
    hooks.read_paths = {std::string(kHookPrefix) + "/*"};
    world.vault.SetRole("moeserve-hooks", hooks);
    world.vault.Put("secret", "moeserve-hooks/team-a/sre", {{"secret", kHookKey}});
    world.vault.Put("secret", "team-a/s3", {{"AWS_SECRET_ACCESS_KEY", "team-a-s3"}});
    world.vault.Put("secret", "team-a/models/s3", {{"AWS_SECRET_ACCESS_KEY", "team-a-models-s3"}});
  }
  // team-a's role as it had to be while hooks were read with the
  // namespace's role: it reads the hook's path too.
  void TenantRoleReadsTheHookPath() {
    fakes::FakeVaultRole team_a;
    team_a.bound_service_account_names = {"moeserve-vault"};
    team_a.bound_service_account_namespaces = {"team-a"};
    team_a.audience = "vault";
    team_a.read_paths = {"secret/data/team-a/*", std::string(kHookPrefix) + "/team-a/*"};
    world.vault.SetRole("team-a", team_a);
  }
  OperatorOptions Options() {
    OperatorOptions options;
    options.reconciler.secret_source = integration.secret_source();
    options.reconciler.cleanup = integration.cleanup();
    options.reconciler.vault_resync = 200ms;
    options.hook_vault = integration.vault_source();
    options.hook_secrets.vault_prefix = kHookPrefix;
    return options;
  }
  fakes::FakeApiServer& server() { return world.cluster.server; }
  json SecretsSynced(const std::string& name) { return ConditionOf(server(), "team-a", name, "SecretsSynced"); }
  // Every value of every Secret in team-a, decoded.
  std::vector<std::string> TenantSecretValues() {
    std::vector<std::string> out;
    for (const auto& secret : server().List("secrets", "team-a")) {
      const json data = secret.value("data", json::object());  // kept: items() does not own it
      for (const auto& [k, v] : data.items())
        if (v.is_string()) out.push_back(Base64Decode(v.get<std::string>()));
    }
    return out;
  }

  VaultWorld world;
  std::unique_ptr<KubeClient> client;
  VaultIntegration integration;
};

TEST_F(VaultHookKeys, ATenantNamingTheHookPathGetsNothingHoweverItSpellsIt) {
  TenantRoleReadsTheHookPath();
  const std::vector<std::pair<std::string, std::string>> attempts = {
      {"direct", kHookPath},
      {"dotdot", "secret/data/team-a/../moeserve-hooks/team-a/sre"},
      {"encoded", "secret/data/team-a/%2e%2e/moeserve-hooks/team-a/sre"},
      {"slashes", "secret//data/moeserve-hooks//team-a/sre/"},
      {"escaped", "secret/data/%6Doeserve-hooks/team-a/sre"},
  };
  for (const auto& [name, path] : attempts) ASSERT_TRUE(server().Create("moedeployments.moeserve.io", VaultDeployment(name, path)));
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io", VaultDeployment("keys", "", kHookPath)));
  RunningOperator running(*client, Options());
  // Every deployment judged once: then nothing of the key is in the
  // tenant's namespace, and it was never read at all.
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& [name, path] : attempts)
      if (!SecretsSynced(name).contains("reason")) return false;
    return SecretsSynced("keys").contains("reason");
  }));
  for (const auto& value : TenantSecretValues()) EXPECT_EQ(value.find(kHookKey), std::string::npos);
  EXPECT_EQ(world.vault.Count("GET", "/v1/secret/data/moeserve-hooks"), 0u);
  for (const auto& [name, path] : attempts) {
    ASSERT_TRUE(WaitFor([&] { return SecretsSynced(name).value("reason", "") == "VaultPathNotAllowed"; }))
        << name << ": " << SecretsSynced(name).dump();
    const json condition = SecretsSynced(name);
    EXPECT_EQ(condition["status"], "False");
    EXPECT_EQ(condition["message"].get<std::string>().rfind("spec.model.credentials.vault.path: ", 0), 0u)
        << condition.dump();
  }
  ASSERT_TRUE(WaitFor([&] { return SecretsSynced("keys").value("reason", "") == "VaultPathNotAllowed"; }))
      << SecretsSynced("keys").dump();
  EXPECT_EQ(SecretsSynced("keys")["message"].get<std::string>().rfind("spec.endpoint.apiKeys.vault.path: ", 0), 0u);
  ASSERT_TRUE(server().Get("secrets", "team-a", "direct-secrets"));
}

TEST_F(VaultHookKeys, TheQuotaPolicysAllowedPrefixesBoundWhatIsCopied) {
  json policy = {{"apiVersion", "moeserve.io/v1alpha1"},
                 {"kind", "QuotaPolicy"},
                 {"metadata", {{"name", "default"}, {"namespace", "team-a"}}},
                 {"spec", {{"vault", {{"allowedPathPrefixes", {"secret/data/team-a/models/"}}}}}}};
  ASSERT_TRUE(server().Create("quotapolicies.moeserve.io", policy));
  // team-a's Vault role reads both paths: the policy alone tells them apart.
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io", VaultDeployment("inside", "secret/data/team-a/models/s3")));
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io", VaultDeployment("outside", "secret/data/team-a/s3")));
  RunningOperator running(*client, Options());
  ASSERT_TRUE(WaitFor([&] { return SecretsSynced("inside").value("status", "") == "True"; })) << SecretsSynced("inside").dump();
  ASSERT_TRUE(WaitFor([&] { return SecretsSynced("outside").value("reason", "") == "VaultPathNotAllowed"; }))
      << SecretsSynced("outside").dump();
  EXPECT_EQ(SecretsSynced("outside")["message"],
            "spec.model.credentials.vault.path: secret/data/team-a/s3 is outside the Vault paths QuotaPolicy default "
            "allows (spec.vault.allowedPathPrefixes [secret/data/team-a/models])");
  auto inside = server().Get("secrets", "team-a", "inside-secrets");
  ASSERT_TRUE(inside);
  EXPECT_EQ(Base64Decode((*inside)["data"]["object-store.AWS_SECRET_ACCESS_KEY"].get<std::string>()), "team-a-models-s3");
  ASSERT_TRUE(WaitFor([&] { return server().Get("secrets", "team-a", "outside-secrets").has_value(); }));
  EXPECT_FALSE((*server().Get("secrets", "team-a", "outside-secrets"))["data"].contains("object-store.AWS_SECRET_ACCESS_KEY"));
  EXPECT_EQ(world.vault.Count("GET", "/v1/secret/data/team-a/s3"), 0u);
}

TEST_F(VaultHookKeys, HookKeysAreReadAsTheOperatorNeverAsTheTenantNamespace) {
  // team-a's role reads only team-a's paths, as it should.
  HookSecretOptions options;
  options.operator_namespace = "moeserve-system";
  options.vault_prefix = kHookPrefix;
  HookSecretSource hooks(*client, integration.vault_source(), options);
  SecretReference ref;
  ref.vault_path = std::string(kHookPrefix) + "//team-a/./sre";
  auto key = hooks.Fetch("team-a", ref);
  ASSERT_TRUE(key) << key.error().ToString();
  EXPECT_EQ(key->at("secret"), kHookKey);
  // The login was the operator namespace's service account, as the hook role; team-a's was never asked for.
  bool operator_login = false, tenant_login = false;
  for (const auto& w : server().Writes()) {
    operator_login |= w.method == "POST" && w.path == "/api/v1/namespaces/moeserve-system/serviceaccounts/moeserve-vault/token";
    tenant_login |= w.path.find("/namespaces/team-a/serviceaccounts/") != std::string::npos;
  }
  EXPECT_TRUE(operator_login);
  EXPECT_FALSE(tenant_login);
  EXPECT_EQ(world.vault.Count("GET", "/v1/secret/data/moeserve-hooks/team-a/sre"), 1u);

  // Another namespace's key, or a key outside the prefix, is refused before Vault is asked.
  for (const std::string path : {"secret/data/moeserve-hooks/team-b/sre", "secret/data/team-a/s3",
                                 "secret/data/moeserve-hooks/team-a/../team-b/sre"}) {
    ref.vault_path = path;
    auto refused = hooks.Fetch("team-a", ref);
    ASSERT_FALSE(refused) << path;
    EXPECT_NE(refused.error().message().find("secret.vault.path"), std::string::npos) << refused.error().message();
  }
  EXPECT_EQ(world.vault.Count("GET", "/v1/secret/data/team"), 0u);
  EXPECT_EQ(world.vault.Count("GET", "/v1/secret/data/moeserve-hooks/team-b"), 0u);

  // A Secret: only the operator's namespace, labelled for the policy's namespace.
  auto secret = [&](const std::string& ns, json labels) {
    return json{{"apiVersion", "v1"},
                {"kind", "Secret"},
                {"metadata", {{"name", "hook"}, {"namespace", ns}, {"labels", labels}}},
                {"stringData", {{"secret", kHookKey}}}};
  };
  ASSERT_TRUE(server().Create("secrets", secret("team-a", {{kUsableLabel, "true"}})));
  SecretReference by_name;
  by_name.secret_name = "hook";
  auto missing = hooks.Fetch("team-a", by_name);
  ASSERT_FALSE(missing);  // the tenant's own Secret is not where hook keys live
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound) << missing.error().ToString();
  ASSERT_TRUE(server().Create("secrets", secret("moeserve-system", {{kHookNamespaceLabel, "team-b"}})));
  auto other = hooks.Fetch("team-a", by_name);
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(other.error().message().find("moeserve.io/hook-namespace=team-a"), std::string::npos);
  auto own = hooks.Fetch("team-b", by_name);
  ASSERT_TRUE(own) << own.error().ToString();
  EXPECT_EQ(own->at("secret"), kHookKey);
}

TEST_F(VaultHookKeys, WithoutAHookPrefixNoHookReadsVault) {
  HookSecretSource hooks(*client, integration.vault_source(), HookSecretOptions{});
  SecretReference ref;
  ref.vault_path = kHookPath;
  auto refused = hooks.Fetch("team-a", ref);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("--hook-vault-prefix"), std::string::npos) << refused.error().message();
  EXPECT_EQ(world.vault.Requests().size(), 0u);
}

}  // namespace
}  // namespace moeserve::op::testing
