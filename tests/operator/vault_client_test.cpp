// The Vault client and the per-namespace sessions against the Vault double
// (which reviews service-account tokens with the API double): login with a
// TokenRequest token, KV v2 reads, renewal at two thirds of the lease,
// re-login after expiry, retries, and Vault's own error text.
#include <gtest/gtest.h>

#include <cstdlib>

#include "moeserve/operator/vault_client.hpp"
#include "moeserve/operator/vault_secret_source.hpp"
#include "moeserve/operator/vault_sessions.hpp"
#include "vault_test_util.hpp"

namespace moeserve::op::testing {
namespace {

using namespace std::chrono_literals;

SecretReference VaultRef(const std::string& path, const std::string& role = "") {
  SecretReference ref;
  ref.vault_path = path;
  ref.vault_role = role;
  return ref;
}

class VaultClientTest : public ::testing::Test {
 protected:
  VaultClientTest() : client(world.cluster.Client()), vault(world.Config()), sessions(vault, *client, world.Auth()),
                      source(vault, sessions) {
    world.vault.Put("secret", "team-a/keys", {{"acme", "sk-acme-1"}});
  }
  VaultWorld world{60, 150};
  std::unique_ptr<KubeClient> client;
  VaultClient vault;
  VaultSessions sessions;
  VaultSecretSource source;
};

TEST_F(VaultClientTest, LogsInWithTheNamespacesServiceAccountAndReadsKvV2) {
  auto data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_TRUE(data) << data.error().ToString();
  EXPECT_EQ(*data, (std::map<std::string, std::string>{{"acme", "sk-acme-1"}}));
  EXPECT_EQ(world.vault.Count("POST", "/v1/auth/kubernetes/login"), 1u);
  EXPECT_EQ(world.cluster.server.tokens().Reviews(), 1u);  // Vault asked the API server whose token it was
  // The TokenRequest named the namespace's Vault service account.
  bool requested = false;
  for (const auto& w : world.cluster.server.Writes())
    requested |= w.method == "POST" && w.path == "/api/v1/namespaces/team-a/serviceaccounts/moeserve-vault/token" &&
                 w.status == 201 && w.body.find("\"vault\"") != std::string::npos;
  EXPECT_TRUE(requested);
  // A second read reuses the token.
  ASSERT_TRUE(source.Fetch("team-a", VaultRef("secret/data/team-a/keys")));
  EXPECT_EQ(world.vault.Count("POST", "/v1/auth/kubernetes/login"), 1u);
  EXPECT_EQ(sessions.logins(), 1u);
}

TEST_F(VaultClientTest, RenewsAtTwoThirdsThenLogsInAgainNearMaxTtl) {
  ASSERT_TRUE(source.Fetch("team-a", VaultRef("secret/data/team-a/keys")));
  world.Advance(30s);  // half the 60 s lease: nothing to do
  ASSERT_TRUE(source.Fetch("team-a", VaultRef("secret/data/team-a/keys")));
  EXPECT_EQ(world.vault.Count("POST", "/v1/auth/token/renew-self"), 0u);
  world.Advance(11s);  // past two thirds (40 s)
  ASSERT_TRUE(source.Fetch("team-a", VaultRef("secret/data/team-a/keys")));
  EXPECT_EQ(world.vault.Count("POST", "/v1/auth/token/renew-self"), 1u);
  EXPECT_EQ(sessions.renewals(), 1u);
  EXPECT_EQ(sessions.logins(), 1u);
  // Renewals until the 150 s max TTL caps the lease below a third of 60 s: a new login.
  for (int i = 0; i < 4; ++i) {
    world.Advance(41s);
    auto data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
    ASSERT_TRUE(data) << data.error().ToString();
  }
  EXPECT_EQ(sessions.logins(), 2u);
  EXPECT_GE(world.vault.Count("POST", "/v1/auth/token/renew-self"), 3u);
}

TEST_F(VaultClientTest, ATokenThatExpiredUnseenIsReplacedByANewLogin) {
  ASSERT_TRUE(source.Fetch("team-a", VaultRef("secret/data/team-a/keys")));
  const std::string first = world.vault.LoginTokens().back();
  // Only Vault's clock moves: the operator still believes in its token.
  world.vault.Advance(61s);
  EXPECT_FALSE(world.vault.TokenValid(first));
  auto data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_TRUE(data) << data.error().ToString();
  EXPECT_EQ(world.vault.Count("GET", "/v1/auth/token/lookup-self"), 1u);
  EXPECT_EQ(sessions.logins(), 2u);
  EXPECT_TRUE(world.vault.TokenValid(world.vault.LoginTokens().back()));
}

TEST_F(VaultClientTest, AnotherTeamsPathIsVaultsOwn403) {
  world.vault.Put("secret", "team-b/keys", {{"globex", "sk-globex-1"}});
  auto data = source.Fetch("team-a", VaultRef("secret/data/team-b/keys"));
  ASSERT_FALSE(data);
  EXPECT_EQ(data.error().code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(data.error().message().find("1 error occurred: * permission denied"), std::string::npos)
      << data.error().message();
  EXPECT_EQ(data.error().message().find("sk-globex-1"), std::string::npos);
  // The token was alive (lookup-self): no new login for a policy refusal.
  EXPECT_EQ(sessions.logins(), 1u);
}

TEST_F(VaultClientTest, ARoleOfAnotherNamespaceRefusesTheLogin) {
  // team-b's service account presented for role team-a: Vault's binding refuses it.
  auto data = source.Fetch("team-b", VaultRef("secret/data/team-a/keys", "team-a"));
  ASSERT_FALSE(data);
  EXPECT_EQ(data.error().code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(data.error().message().find("namespace not authorized"), std::string::npos) << data.error().message();
  EXPECT_EQ(world.vault.Count("GET", "/v1/secret/"), 0u);
}

TEST_F(VaultClientTest, ATokenForAnotherAudienceIsRefused) {
  VaultAuthOptions auth = world.Auth();
  auth.audience = "not-vault";
  VaultSessions other(vault, *client, auth);
  VaultSecretSource other_source(vault, other);
  auto data = other_source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_FALSE(data);
  EXPECT_EQ(data.error().code(), ErrorCode::kPermissionDenied);
}

TEST_F(VaultClientTest, SealedIsUnavailableWithVaultsTextAfterRetries) {
  ASSERT_TRUE(source.Fetch("team-a", VaultRef("secret/data/team-a/keys")));
  world.vault.SetSealed(true);
  const size_t before = world.vault.Requests().size();
  auto data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_FALSE(data);
  EXPECT_EQ(data.error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(data.error().message().find("Vault is sealed"), std::string::npos) << data.error().message();
  EXPECT_EQ(world.vault.Requests().size() - before, 3u);  // three attempts
  world.vault.SetSealed(false);
  EXPECT_TRUE(source.Fetch("team-a", VaultRef("secret/data/team-a/keys")));
}

TEST_F(VaultClientTest, ServerErrorsAreRetriedWithBackoff) {
  ASSERT_TRUE(source.Fetch("team-a", VaultRef("secret/data/team-a/keys")));
  world.vault.FailNext(2, 500, "internal error");
  const size_t reads = world.vault.Count("GET", "/v1/secret/data/team-a/keys");
  auto data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_TRUE(data) << data.error().ToString();
  EXPECT_EQ(world.vault.Count("GET", "/v1/secret/data/team-a/keys") - reads, 3u);  // two 500s, then the answer
  // A 400 is not retried.
  world.vault.FailNext(1, 400, "bad request");
  const size_t before = world.vault.Requests().size();
  data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_FALSE(data);
  EXPECT_EQ(data.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(world.vault.Requests().size() - before, 1u);
}

TEST_F(VaultClientTest, ASlowVaultTimesOutAndIsRetried) {
  VaultConfig config = world.Config();
  config.request_timeout = 100ms;
  config.attempts = 2;
  VaultClient slow(config);
  world.vault.SetDelay(400ms);
  auto looked_up = slow.LookupSelf("hvs.whatever");
  world.vault.SetDelay(0ms);
  ASSERT_FALSE(looked_up);
  EXPECT_EQ(looked_up.error().code(), ErrorCode::kTimeout);
  // Both attempts reached Vault (each is recorded when its delayed answer goes out).
  EXPECT_TRUE(WaitFor([&] { return world.vault.Count("GET", "/v1/auth/token/lookup-self") == 2; }, 3s));
}

TEST_F(VaultClientTest, DeletedAndDestroyedVersionsAreNotFound) {
  world.vault.Put("secret", "team-a/keys", {{"acme", "sk-acme-2"}});
  world.vault.SoftDeleteLatest("secret", "team-a/keys");
  auto data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_FALSE(data);
  EXPECT_EQ(data.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(data.error().message().find("version 2 is deleted"), std::string::npos) << data.error().message();
  world.vault.Put("secret", "team-a/keys", {{"acme", "sk-acme-3"}});
  world.vault.DestroyLatest("secret", "team-a/keys");
  data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_FALSE(data);
  EXPECT_NE(data.error().message().find("version 3 is destroyed"), std::string::npos) << data.error().message();
  EXPECT_EQ(data.error().message().find("sk-acme"), std::string::npos);
}

TEST_F(VaultClientTest, AnAnswerPastTheCapIsRefusedWithoutReadingItAll) {
  // 64 MiB streamed by the double (never held there), against the 1 MiB default.
  constexpr size_t kPadding = size_t{64} << 20;
  world.vault.PadAnswer("secret", "team-a/keys", kPadding);
  auto data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_FALSE(data) << "read " << data->at("padding").size() << " bytes of padding";
  EXPECT_EQ(data.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(data.error().message().find("Vault read secret/data/team-a/keys: the answer is larger than 1048576 bytes "
                                        "(--vault-max-answer-bytes); not read further"),
            std::string::npos)
      << data.error().message();
  // The transfer stopped there: not retried, and the double could not send it all.
  EXPECT_EQ(world.vault.Count("GET", "/v1/secret/data/team-a/keys"), 1u);
  EXPECT_LT(world.vault.PaddingSent(), kPadding);

  // The cap is configurable: 4 MiB reads a 2 MiB answer.
  world.vault.PadAnswer("secret", "team-a/keys", size_t{2} << 20);
  VaultConfig config = world.Config();
  config.max_answer_bytes = size_t{4} << 20;
  VaultClient roomy(config);
  VaultSessions roomy_sessions(roomy, *client, world.Auth());
  VaultSecretSource roomy_source(roomy, roomy_sessions);
  auto padded = roomy_source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_TRUE(padded) << padded.error().ToString();
  EXPECT_EQ(padded->at("padding").size(), size_t{2} << 20);
  EXPECT_EQ(padded->at("acme"), "sk-acme-1");
}

TEST_F(VaultClientTest, AKeyThatCannotBeASecretKeyIsRefused) {
  world.vault.Put("secret", "team-a/keys", {{"acme corp/x", "sk-acme-2"}});
  auto data = source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_FALSE(data);
  EXPECT_EQ(data.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(data.error().message().find("acme corp/x"), std::string::npos) << data.error().message();
  EXPECT_EQ(data.error().message().find("sk-acme-2"), std::string::npos);
}

TEST_F(VaultClientTest, RevokeSelfEndsTheToken) {
  ASSERT_TRUE(source.Fetch("team-a", VaultRef("secret/data/team-a/keys")));
  const std::string token = world.vault.LoginTokens().back();
  ASSERT_TRUE(world.vault.TokenValid(token));
  ASSERT_TRUE(sessions.Revoke("team-a", "team-a"));
  EXPECT_EQ(world.vault.Count("POST", "/v1/auth/token/revoke-self"), 1u);
  EXPECT_FALSE(world.vault.TokenValid(token));
}

TEST_F(VaultClientTest, NamespaceHeaderAndDevelopmentToken) {
  VaultConfig config = world.Config();
  config.vault_namespace = "platform/tenants";
  VaultClient namespaced(config);
  VaultAuthOptions auth = world.Auth();
  auth.fixed_token = world.vault.CreateToken({"secret/data/team-a/*"}, 3600);
  VaultSessions dev(namespaced, *client, auth);
  VaultSecretSource dev_source(namespaced, dev);
  auto data = dev_source.Fetch("team-a", VaultRef("secret/data/team-a/keys"));
  ASSERT_TRUE(data) << data.error().ToString();
  EXPECT_EQ(data->at("acme"), "sk-acme-1");
  const auto requests = world.vault.Requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.back().vault_namespace, "platform/tenants");
  EXPECT_TRUE(requests.back().had_token);
  EXPECT_EQ(world.vault.Count("POST", "/v1/auth/kubernetes/login"), 0u);
}

// Plain http carries tokens, logins and secret values in clear: refused
// unless the development switch is on, before any byte goes out.
TEST_F(VaultClientTest, AnHttpAddressIsRefusedWithoutTheDevelopmentSwitch) {
  VaultConfig config = world.Config();
  ASSERT_EQ(config.address.rfind("http://", 0), 0u);
  config.allow_insecure_http = false;
  const Status checked = CheckVaultAddress(config);
  ASSERT_FALSE(checked);
  EXPECT_NE(checked.error().message().find("is plain http"), std::string::npos) << checked.error().message();
  EXPECT_NE(checked.error().message().find("--vault-allow-insecure-http"), std::string::npos);
  VaultClient refusing(config);
  const size_t before = world.vault.Requests().size();
  auto read = refusing.LookupSelf("hvs.whatever");
  ASSERT_FALSE(read);
  EXPECT_NE(read.error().message().find("is plain http"), std::string::npos) << read.error().message();
  EXPECT_EQ(world.vault.Requests().size(), before) << "a request went out over http";
  // With the switch (what every other test here runs with), the same address is used.
  config.allow_insecure_http = true;
  EXPECT_TRUE(CheckVaultAddress(config));
  (void)VaultClient(config).LookupSelf("hvs.whatever");  // Vault's own 403: the token is made up
  EXPECT_EQ(world.vault.Requests().size(), before + 1);
  // https is always fine; anything else is not a Vault address.
  config.allow_insecure_http = false;
  config.address = "HTTPS://vault.example:8200";
  EXPECT_TRUE(CheckVaultAddress(config));
  config.address = "vault.example:8200";
  EXPECT_FALSE(CheckVaultAddress(config));
}

TEST(VaultConfig, MoeOperatorRefusesToStartOnAnHttpVaultWithoutTheSwitch) {
  ASSERT_TRUE(std::filesystem::exists(OperatorBinary())) << "build moe-operator first: " << OperatorBinary();
  FakeCluster cluster;
  const std::string kubeconfig =
      (std::filesystem::temp_directory_path() / ("moe-vault-http-" + std::to_string(getpid()) + ".yaml")).string();
  ASSERT_TRUE(cluster.server.WriteKubeconfig(kubeconfig));
  const std::string run = "timeout 20 " + OperatorBinary() + " --kubeconfig=" + kubeconfig +
                          " --metrics-addr=0 --health-addr=0 --webhook-addr=0 --vault-addr=http://127.0.0.1:1";
  auto refused = RunShell(run);
  EXPECT_EQ(refused.rc, 2) << refused.output;
  EXPECT_NE(refused.output.find("moe-operator: Vault address http://127.0.0.1:1 is plain http"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("--vault-allow-insecure-http"), std::string::npos) << refused.output;
  // The same in VAULT_ADDR.
  auto from_env = RunShell("VAULT_ADDR=http://127.0.0.1:1 " + run.substr(0, run.find(" --vault-addr")));
  EXPECT_EQ(from_env.rc, 2) << from_env.output;
  EXPECT_NE(from_env.output.find("is plain http"), std::string::npos) << from_env.output;
  std::filesystem::remove(kubeconfig);
}

TEST(VaultConfig, ReadsVaultsEnvironment) {
  setenv("VAULT_ADDR", "https://vault.example:8200", 1);
  setenv("VAULT_CACERT", "/etc/vault/ca.pem", 1);
  setenv("VAULT_NAMESPACE", "ns1", 1);
  const VaultConfig c = VaultConfigFromEnvironment();
  unsetenv("VAULT_ADDR");
  unsetenv("VAULT_CACERT");
  unsetenv("VAULT_NAMESPACE");
  EXPECT_EQ(c.address, "https://vault.example:8200");
  EXPECT_EQ(c.ca_cert, "/etc/vault/ca.pem");
  EXPECT_EQ(c.vault_namespace, "ns1");
}

TEST(VaultErrorText, FoldsVaultsMultiErrorToOneLine) {
  EXPECT_EQ(VaultErrorText(nlohmann::json::parse(R"({"errors":["1 error occurred:\n\t* permission denied\n\n"]})")),
            "1 error occurred: * permission denied");
  EXPECT_EQ(VaultErrorText(nlohmann::json::parse(R"({"errors":["a","b"]})")), "a; b");
  EXPECT_EQ(VaultErrorText(nlohmann::json::parse(R"({"errors":[]})")), "");
}

}  // namespace
}  // namespace moeserve::op::testing
