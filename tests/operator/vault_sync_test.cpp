// The operator with Vault: `vault:` references of a MoEDeployment are read
// with the namespace's own login and written into <name>-secrets; a sealed
// Vault keeps the last good Secret and says why; a rotated object-store
// credential rolls the groups once, a rotated API key rolls nothing; an
// unchanged or identical version writes nothing; another team's path gets
// Vault's 403 and copies nothing; the finalizer revokes the login token; no
// value reaches a log, Event or status.
#include <gtest/gtest.h>

#include <set>

#include "moeserve/common/base64.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "moeserve/operator/vault_integration.hpp"
#include "vault_test_util.hpp"

namespace moeserve::op::testing {
namespace {

using namespace std::chrono_literals;

constexpr auto kResync = 200ms;

json VaultDeployment(const std::string& ns, const std::string& name, const std::string& credentials_path,
                     const std::string& keys_path, int replicas = 2) {
  json md = MoEDeploymentManifest(ns, name, replicas, 1);
  if (!credentials_path.empty()) md["spec"]["model"]["credentials"] = {{"vault", {{"path", credentials_path}}}};
  if (!keys_path.empty()) md["spec"]["endpoint"]["apiKeys"] = {{"vault", {{"path", keys_path}}}};
  return md;
}

std::map<std::string, std::string> SecretData(fakes::FakeApiServer& server, const std::string& ns,
                                              const std::string& name) {
  std::map<std::string, std::string> out;
  auto secret = server.Get("secrets", ns, name);
  if (!secret) return out;
  const json data = secret->value("data", json::object());  // kept: items() does not own it
  for (const auto& [k, v] : data.items()) out[k] = Base64Decode(v.get<std::string>());
  return out;
}

std::map<std::string, int64_t> Generations(fakes::FakeApiServer& server, const std::string& ns) {
  std::map<std::string, int64_t> out;
  for (const auto& sts : server.List("statefulsets.apps", ns))
    out[sts["metadata"]["name"].get<std::string>()] = sts["metadata"].value("generation", int64_t{0});
  return out;
}

std::set<std::string> TemplateHashes(fakes::FakeApiServer& server, const std::string& ns) {
  std::set<std::string> hashes;
  for (const auto& sts : server.List("statefulsets.apps", ns))
    hashes.insert(sts["spec"]["template"]["metadata"]["annotations"].value(kConfigHashAnnotation, ""));
  return hashes;
}

size_t WritesTo(fakes::FakeApiServer& server, const std::string& what, size_t from = 0) {
  const auto writes = server.Writes();
  size_t n = 0;
  for (size_t i = from; i < writes.size(); ++i) n += writes[i].path.find(what) != std::string::npos ? 1 : 0;
  return n;
}

class VaultSync : public ::testing::Test {
 protected:
  VaultSync()
      : client(world.cluster.Client()),
        integration(*client, world.Config(), world.Auth()) {
    world.vault.Put("secret", "team-a/s3", {{"AWS_ACCESS_KEY_ID", "AKIA-VAULT-1"}, {"AWS_SECRET_ACCESS_KEY", "vault-s3-secret-1"}});
    world.vault.Put("secret", "team-a/keys", {{"acme", "sk-vault-acme-1"}});
    world.vault.Put("secret", "team-b/keys", {{"globex", "sk-vault-globex-1"}});
  }
  OperatorOptions Options() {
    OperatorOptions options;
    options.reconciler.secret_source = integration.secret_source();
    options.reconciler.cleanup = integration.cleanup();
    options.reconciler.vault_resync = kResync;
    return options;
  }
  fakes::FakeApiServer& server() { return world.cluster.server; }
  bool Synced(const std::string& ns, const std::string& name) {
    return ConditionOf(server(), ns, name, "SecretsSynced").value("status", "") == "True";
  }
  bool Ready(const std::string& ns, const std::string& name) {
    return StatusOf(server(), ns, name).value("phase", "") == "Ready";
  }

  VaultWorld world;
  std::unique_ptr<KubeClient> client;
  VaultIntegration integration;
};

TEST_F(VaultSync, SealedVaultKeepsTheSecretAndTheConditionSaysWhy) {
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                              VaultDeployment("team-a", "m", "secret/data/team-a/s3", "secret/data/team-a/keys", 1)));
  RunningOperator running(*client, Options());
  ASSERT_TRUE(WaitFor([&] { return Synced("team-a", "m"); }));
  const auto good = SecretData(server(), "team-a", "m-secrets");
  EXPECT_EQ(good.at("object-store.AWS_SECRET_ACCESS_KEY"), "vault-s3-secret-1");
  EXPECT_NE(good.at(kApiKeysKey).find(Sha256Hex("sk-vault-acme-1")), std::string::npos);

  world.vault.SetSealed(true);
  ASSERT_TRUE(WaitFor([&] {
    return ConditionOf(server(), "team-a", "m", "SecretsSynced").value("reason", "") == "VaultUnavailable";
  }));
  const json sealed = ConditionOf(server(), "team-a", "m", "SecretsSynced");
  EXPECT_EQ(sealed["status"], "False");
  EXPECT_NE(sealed["message"].get<std::string>().find("Vault is sealed"), std::string::npos) << sealed.dump();
  // Several resyncs while sealed: the last good Secret stays as it was.
  std::this_thread::sleep_for(3 * kResync);
  EXPECT_EQ(SecretData(server(), "team-a", "m-secrets"), good);

  world.vault.SetSealed(false);
  ASSERT_TRUE(WaitFor([&] { return Synced("team-a", "m"); }));
  EXPECT_EQ(SecretData(server(), "team-a", "m-secrets"), good);
}

TEST_F(VaultSync, APolicyThatStopsAllowingTheReadKeepsTheLastGoodSecret) {
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                              VaultDeployment("team-a", "m", "secret/data/team-a/s3", "secret/data/team-a/keys", 1)));
  RunningOperator running(*client, Options());
  ASSERT_TRUE(WaitFor([&] { return Synced("team-a", "m"); }));
  const auto good = SecretData(server(), "team-a", "m-secrets");
  ASSERT_EQ(good.at("object-store.AWS_ACCESS_KEY_ID"), "AKIA-VAULT-1");
  // The team's policy loses its paths (an operator of Vault's mistake, say).
  fakes::FakeVaultRole narrowed;
  narrowed.bound_service_account_names = {"moeserve-vault"};
  narrowed.bound_service_account_namespaces = {"team-a"};
  narrowed.audience = "vault";
  narrowed.read_paths = {"secret/data/team-a/elsewhere/*"};
  fakes::FakeVaultRole restored = narrowed;
  restored.read_paths = {"secret/data/team-a/*"};
  world.vault.SetRole("team-a", narrowed);
  ASSERT_TRUE(WaitFor([&] {
    return ConditionOf(server(), "team-a", "m", "SecretsSynced").value("reason", "") == "VaultPermissionDenied";
  }));
  std::this_thread::sleep_for(3 * kResync);
  EXPECT_EQ(SecretData(server(), "team-a", "m-secrets"), good);
  world.vault.SetRole("team-a", restored);
  ASSERT_TRUE(WaitFor([&] { return Synced("team-a", "m"); }));
  EXPECT_EQ(SecretData(server(), "team-a", "m-secrets"), good);
}

// A Vault secret that is gone (deleted or destroyed: Vault's 404) revokes
// its keys; the operator used to keep the last good copy forever.
TEST_F(VaultSync, AKeysSecretGoneFromVaultRevokesItsKeys) {
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                              VaultDeployment("team-a", "m", "secret/data/team-a/s3", "secret/data/team-a/keys", 1)));
  RunningOperator running(*client, Options());
  ASSERT_TRUE(WaitFor([&] {
    return SecretData(server(), "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-vault-acme-1")) != std::string::npos;
  }));
  const auto before = SecretData(server(), "team-a", "m-secrets");
  for (bool destroy : {false, true}) {
    SCOPED_TRACE(destroy ? "destroyed" : "soft-deleted");
    if (destroy) {
      world.vault.Put("secret", "team-a/keys", {{"acme", "sk-vault-acme-1"}});
      ASSERT_TRUE(WaitFor([&] {
        return SecretData(server(), "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-vault-acme-1")) != std::string::npos;
      }));
      world.vault.DestroyLatest("secret", "team-a/keys");
    } else {
      world.vault.SoftDeleteLatest("secret", "team-a/keys");
    }
    ASSERT_TRUE(WaitFor([&] {
      return SecretData(server(), "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-vault-acme-1")) == std::string::npos;
    })) << "the key outlived its Vault secret";
    const auto after = SecretData(server(), "team-a", "m-secrets");
    EXPECT_EQ(json::parse(after.at(kApiKeysKey))["keys"].size(), 1u) << after.at(kApiKeysKey);
    // The admin entry (the key itself is in the operator's namespace) stays.
    EXPECT_EQ(json::parse(after.at(kApiKeysKey))["keys"][0], json::parse(before.at(kApiKeysKey))["keys"][0]);
    EXPECT_EQ(after.at(kMetricsTokenKey), before.at(kMetricsTokenKey));
    // The credentials, still in Vault, are still there.
    EXPECT_EQ(after.at(std::string(kObjectStorePrefix) + "AWS_ACCESS_KEY_ID"), "AKIA-VAULT-1");
    EXPECT_TRUE(WaitFor([&] {
      return ConditionOf(server(), "team-a", "m", "SecretsSynced").value("reason", "") == "VaultSecretNotFound";
    }));
  }
}

TEST_F(VaultSync, RotationRollsForCredentialsOnceAndNeverForApiKeys) {
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                              VaultDeployment("team-a", "m", "secret/data/team-a/s3", "secret/data/team-a/keys", 2)));
  Kubelet kubelet(server(), 20ms);
  RunningOperator running(*client, Options());
  ASSERT_TRUE(WaitFor([&] { return Ready("team-a", "m") && Synced("team-a", "m"); }));
  const auto hashes_before = TemplateHashes(server(), "team-a");
  ASSERT_EQ(hashes_before.size(), 1u);
  const size_t writes_before = server().Writes().size();

  // An API key rotated: the Secret changes, the pod template does not.
  const auto keys_rotated = std::chrono::steady_clock::now();
  world.vault.Put("secret", "team-a/keys", {{"acme", "sk-vault-acme-2"}});
  ASSERT_TRUE(WaitFor([&] {
    return SecretData(server(), "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-vault-acme-2")) !=
           std::string::npos;
  }));
  const auto keys_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - keys_rotated).count();
  std::this_thread::sleep_for(3 * kResync);
  EXPECT_EQ(TemplateHashes(server(), "team-a"), hashes_before);
  EXPECT_EQ(WritesTo(server(), "/statefulsets/", writes_before), 0u);
  EXPECT_EQ(WritesTo(server(), "/secrets/", writes_before), 1u);

  // An object-store credential rotated: one new template, each group updated once.
  const size_t writes_mid = server().Writes().size();
  const auto generations_before = Generations(server(), "team-a");
  ASSERT_EQ(generations_before.size(), 2u);
  const auto credentials_rotated = std::chrono::steady_clock::now();
  world.vault.Put("secret", "team-a/s3", {{"AWS_ACCESS_KEY_ID", "AKIA-VAULT-2"}, {"AWS_SECRET_ACCESS_KEY", "vault-s3-secret-2"}});
  ASSERT_TRUE(WaitFor([&] {
    auto hashes = TemplateHashes(server(), "team-a");
    return hashes.size() == 1 && hashes != hashes_before;
  }));
  const auto credentials_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - credentials_rotated).count();
  ASSERT_TRUE(WaitFor([&] { return Ready("team-a", "m"); }));
  std::this_thread::sleep_for(4 * kResync);
  EXPECT_EQ(WritesTo(server(), "/statefulsets/", writes_mid), 2u) << "each of the two groups replaced exactly once";
  for (const auto& [name, generation] : Generations(server(), "team-a"))
    EXPECT_EQ(generation, generations_before.at(name) + 1) << name << ": its template changed more than once";
  EXPECT_EQ(WritesTo(server(), "/secrets/", writes_mid), 1u);
  std::printf("[ measured ] resync %lld ms: new Vault version -> Secret (API keys) %lld ms; -> pod template "
              "(credentials) %lld ms\n",
              static_cast<long long>(kResync.count()), static_cast<long long>(keys_ms),
              static_cast<long long>(credentials_ms));
}

TEST_F(VaultSync, NoNewVersionOrAnIdenticalOneWritesNothing) {
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                              VaultDeployment("team-a", "m", "secret/data/team-a/s3", "secret/data/team-a/keys", 1)));
  Kubelet kubelet(server(), 20ms);
  RunningOperator running(*client, Options());
  ASSERT_TRUE(WaitFor([&] { return Ready("team-a", "m") && Synced("team-a", "m"); }));
  std::this_thread::sleep_for(2 * kResync);  // settle: the last status write
  const size_t writes = server().Writes().size();
  const size_t reads = world.vault.Count("GET", "/v1/secret/data/team-a/keys");
  // Resyncs with no new version.
  ASSERT_TRUE(WaitFor([&] { return world.vault.Count("GET", "/v1/secret/data/team-a/keys") >= reads + 3; }));
  // A new version with the same content.
  world.vault.Put("secret", "team-a/keys", {{"acme", "sk-vault-acme-1"}});
  const size_t after_put = world.vault.Count("GET", "/v1/secret/data/team-a/keys");
  ASSERT_TRUE(WaitFor([&] { return world.vault.Count("GET", "/v1/secret/data/team-a/keys") >= after_put + 3; }));
  const auto all = server().Writes();
  for (size_t i = writes; i < all.size(); ++i) ADD_FAILURE() << "unexpected write " << all[i].method << " " << all[i].path;
  EXPECT_EQ(all.size(), writes);
}

TEST_F(VaultSync, AnotherTeamsPathIsRefusedByVaultAndNothingIsCopied) {
  // team-b names team-a's path; its login (role team-b) has no policy for it.
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                              VaultDeployment("team-b", "thief", "secret/data/team-a/s3", "secret/data/team-a/keys", 1)));
  // And one that claims team-a's role from team-b.
  json claim = VaultDeployment("team-b", "claimer", "", "secret/data/team-a/keys", 1);
  claim["spec"]["vault"] = {{"role", "team-a"}};
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io", claim));
  RunningOperator running(*client, Options());
  ASSERT_TRUE(WaitFor([&] {
    return ConditionOf(server(), "team-b", "thief", "SecretsSynced").value("reason", "") == "VaultPermissionDenied" &&
           ConditionOf(server(), "team-b", "claimer", "SecretsSynced").value("reason", "") == "VaultPermissionDenied";
  }));
  const std::string message = ConditionOf(server(), "team-b", "thief", "SecretsSynced")["message"];
  EXPECT_NE(message.find("secret/data/team-a/keys"), std::string::npos) << message;
  EXPECT_NE(message.find("permission denied"), std::string::npos) << message;
  const std::string claimed = ConditionOf(server(), "team-b", "claimer", "SecretsSynced")["message"];
  EXPECT_NE(claimed.find("namespace not authorized"), std::string::npos) << claimed;
  for (const char* name : {"thief-secrets", "claimer-secrets"}) {
    ASSERT_TRUE(WaitFor([&] { return !SecretData(server(), "team-b", name).empty(); }));
    std::string all;
    for (const auto& [k, v] : SecretData(server(), "team-b", name)) all += k + "=" + v + "\n";
    for (const std::string& value : {std::string("AKIA-VAULT-1"), std::string("vault-s3-secret-1"),
                                     std::string("sk-vault-acme-1"), Sha256Hex("sk-vault-acme-1")})
      EXPECT_EQ(all.find(value), std::string::npos) << value << " copied into " << name;
  }
}

TEST_F(VaultSync, TheFinalizerRevokesTheLoginToken) {
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                              VaultDeployment("team-a", "m", "", "secret/data/team-a/keys", 1)));
  RunningOperator running(*client, Options());
  ASSERT_TRUE(WaitFor([&] { return Synced("team-a", "m"); }));
  ASSERT_FALSE(world.vault.LoginTokens().empty());
  const std::string token = world.vault.LoginTokens().back();
  ASSERT_TRUE(world.vault.TokenValid(token));
  ASSERT_TRUE(server().Delete("moedeployments.moeserve.io", "team-a", "m"));
  ASSERT_TRUE(WaitFor([&] { return !server().Get("moedeployments.moeserve.io", "team-a", "m"); }));
  EXPECT_GE(world.vault.Count("POST", "/v1/auth/token/revoke-self"), 1u);
  EXPECT_FALSE(world.vault.TokenValid(token));
}

TEST_F(VaultSync, ASealedVaultDoesNotHoldADeletion) {
  ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                              VaultDeployment("team-a", "m", "", "secret/data/team-a/keys", 1)));
  RunningOperator running(*client, Options());
  ASSERT_TRUE(WaitFor([&] { return Synced("team-a", "m"); }));
  world.vault.SetSealed(true);
  ASSERT_TRUE(server().Delete("moedeployments.moeserve.io", "team-a", "m"));
  // The revocation is tried (and refused: sealed), then the finalizer lets go.
  ASSERT_TRUE(WaitFor([&] { return !server().Get("moedeployments.moeserve.io", "team-a", "m"); }));
  EXPECT_GE(world.vault.Count("POST", "/v1/auth/token/revoke-self"), 1u);
}

TEST_F(VaultSync, NoVaultValueInLogsEventsOrStatus) {
  ::testing::internal::CaptureStderr();
  {
    ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                                VaultDeployment("team-a", "m", "secret/data/team-a/s3", "secret/data/team-a/keys", 1)));
    ASSERT_TRUE(server().Create("moedeployments.moeserve.io",
                                VaultDeployment("team-b", "thief", "secret/data/team-a/s3", "", 1)));
    Kubelet kubelet(server(), 20ms);
    RunningOperator running(*client, Options());
    ASSERT_TRUE(WaitFor([&] { return Ready("team-a", "m") && Synced("team-a", "m"); }));
    world.vault.SetSealed(true);
    ASSERT_TRUE(WaitFor([&] { return !Synced("team-a", "m"); }));
    world.vault.SetSealed(false);
    world.vault.Put("secret", "team-a/s3", {{"AWS_ACCESS_KEY_ID", "AKIA-VAULT-2"}, {"AWS_SECRET_ACCESS_KEY", "vault-s3-secret-2"}});
    ASSERT_TRUE(WaitFor([&] {
      return SecretData(server(), "team-a", "m-secrets")["object-store.AWS_SECRET_ACCESS_KEY"] == "vault-s3-secret-2";
    }));
    ASSERT_TRUE(server().Delete("moedeployments.moeserve.io", "team-a", "m"));
    ASSERT_TRUE(WaitFor([&] { return !server().Get("moedeployments.moeserve.io", "team-a", "m"); }));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  std::string observed = log;
  for (const auto& e : server().List("events")) observed += e.dump();
  for (const auto& md : server().List("moedeployments.moeserve.io")) observed += md.value("status", json()).dump();
  for (const auto& sts : server().List("statefulsets.apps")) observed += sts.dump();
  for (const auto& cm : server().List("configmaps")) observed += cm.dump();
  ASSERT_NE(log.find("vault:"), std::string::npos) << "the operator logged nothing about Vault: " << log;
  for (const std::string value : {"AKIA-VAULT-1", "vault-s3-secret-1", "AKIA-VAULT-2", "vault-s3-secret-2",
                                   "sk-vault-acme-1", "sk-vault-globex-1"}) {
    EXPECT_EQ(observed.find(value), std::string::npos) << value;
    EXPECT_EQ(observed.find(Base64Encode(value)), std::string::npos) << value << " (base64)";
  }
  for (const auto& token : world.vault.LoginTokens()) EXPECT_EQ(observed.find(token), std::string::npos) << "a Vault token";
}

}  // namespace
}  // namespace moeserve::op::testing
