// Secrets never leak into what people and other tenants read: a canary value
// is planted in every place a secret can enter today (object-store
// credentials, tenant API keys, the TLS private key, the generated admin key
// and metrics token, an API key a client gets wrong, and the same from Vault:
// KV values, another team's value refused by Vault's policy, and the
// operator's Vault login token), the operator and
// the daemon run on them, and everything they produce that is not a Secret
// (log output, Events, MoEDeployment status, ConfigMaps, pod templates,
// Services, volumes, HTTP answers, error values) is captured into one known
// directory and scanned for the canaries, raw and base64-encoded at every
// alignment. The scanner itself is shown to find a planted leak.
//
// Artifacts: $MOESERVE_BINARY_DIR/test-artifacts/secrets_canary/.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../daemon/daemon_harness.hpp"
#include "../storage/s3_listing_double.hpp"
#include "../operator/operator_test_util.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/daemon/metrics.hpp"
#include "moeserve/storage/weight_puller.hpp"
#include "moeserve/operator/vault_integration.hpp"
#include "fake_vault.hpp"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Distinct canaries per entry point, so a finding names where it came from.
const std::map<std::string, std::string> kCanaries = {
    {"object-store secret key", "CanaryS3Secret7f3a9c1e5b2d4068a1b3"},
    {"tenant API key", "sk-canary-tenant-4e8d2a6c0b1f3957"},
    {"TLS private key", "CanaryTlsPrivateKey9b7c5a3e1d2f4068"},
    {"wrong API key sent by a client", "sk-canary-wrong-5c1e9a7d3b2f4860"},
    {"Vault object-store secret key", "CanaryVaultS3Secret2d8f6b4a0c1e3957"},
    {"Vault tenant API key", "sk-canary-vault-tenant-8a6c4e2b0d1f3579"},
    {"another team's Vault value", "CanaryVaultOtherTeam5e3c1a9f7b2d4680"},
};

// Every way a value can appear in text we produce: raw, or base64 at any of
// the three alignments inside a longer encoded value (only the characters
// that depend on the value alone are searched).
std::vector<std::string> Encodings(const std::string& value) {
  std::vector<std::string> out = {value};
  for (size_t k = 0; k < 3; ++k) {
    std::string padded = std::string(k, 'x') + value;
    std::string b64 = Base64Encode(std::string_view(padded));
    const size_t first = 4 * ((k + 2) / 3), last = 4 * ((k + value.size()) / 3);
    if (last > first + 8) out.push_back(b64.substr(first, last - first));
  }
  return out;
}

struct Finding {
  std::string file, canary;
};

// Scans every regular file under `dir` for every encoding of every canary.
std::vector<Finding> ScanForLeaks(const fs::path& dir, const std::map<std::string, std::string>& canaries) {
  std::vector<Finding> found;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (const auto& [where, value] : canaries) {
      for (const auto& enc : Encodings(value)) {
        if (text.find(enc) != std::string::npos) {
          found.push_back({entry.path().string(), where});
          break;
        }
      }
    }
  }
  return found;
}

fs::path ArtifactsDir() {
  const char* b = std::getenv("MOESERVE_BINARY_DIR");
  fs::path dir = fs::path(b ? b : MOESERVE_BINARY_DIR_DEFAULT) / "test-artifacts" / "secrets_canary";
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void WriteArtifact(const fs::path& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir / name) << text;
}

// Sends this process's stderr (where every log line goes) to a file for the
// lifetime of the object.
class StderrCapture {
 public:
  explicit StderrCapture(const fs::path& file) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrCapture() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
  }

 private:
  int saved_ = -1;
};

json LabelledSecret(const std::string& name, const json& string_data, const std::string& type = "Opaque") {
  json data = json::object();
  for (const auto& [k, v] : string_data.items()) data[k] = Base64Encode(std::string_view(v.get<std::string>()));
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"type", type},
          {"metadata", {{"name", name}, {"namespace", "team-a"}, {"labels", {{"moeserve.io/usable", "true"}}}}},
          {"data", data}};
}

// The operator's side: Secrets with canaries, one MoEDeployment using all of
// them and one naming an unlabelled Secret; what it writes besides Secrets.
std::map<std::string, std::string> RunOperator(const fs::path& dir) {
  using namespace op::testing;
  FakeCluster cluster;
  auto& server = cluster.server;
  std::map<std::string, std::string> generated;
  EXPECT_TRUE(server.Create("secrets", LabelledSecret("s3", {{"AWS_ACCESS_KEY_ID", "AKIAEXAMPLE"},
                                                              {"AWS_SECRET_ACCESS_KEY", kCanaries.at("object-store secret key")}})));
  EXPECT_TRUE(server.Create("secrets", LabelledSecret("keys", {{"team-a", kCanaries.at("tenant API key")}})));
  EXPECT_TRUE(server.Create("secrets", LabelledSecret("tls", {{"tls.crt", "-----BEGIN CERTIFICATE-----"},
                                                               {"tls.key", kCanaries.at("TLS private key")}},
                                                        "kubernetes.io/tls")));
  json unlabelled = LabelledSecret("unlabelled", {{"team-b", kCanaries.at("tenant API key")}});
  unlabelled["metadata"].erase("labels");
  EXPECT_TRUE(server.Create("secrets", unlabelled));
  json md = MoEDeploymentManifest("team-a", "canary", 1, 1);
  md["spec"]["model"]["credentials"] = {{"secretRef", {{"name", "s3"}}}};
  md["spec"]["endpoint"]["apiKeys"] = {{"secretRef", {{"name", "keys"}}}};
  md["spec"]["endpoint"]["tls"] = {{"secretName", "tls"}};
  EXPECT_TRUE(server.Create("moedeployments.moeserve.io", md));
  json refused = MoEDeploymentManifest("team-a", "refused", 1, 1);
  refused["spec"]["endpoint"]["apiKeys"] = {{"secretRef", {{"name", "unlabelled"}}}};
  EXPECT_TRUE(server.Create("moedeployments.moeserve.io", refused));

  // Vault: team-a's own paths, and team-b's path that team-a's policy refuses.
  EXPECT_TRUE(server.Create("serviceaccounts", {{"apiVersion", "v1"}, {"kind", "ServiceAccount"},
                                                {"metadata", {{"name", "moeserve-vault"}, {"namespace", "team-a"}}}}));
  fakes::FakeVault vault(server.url());
  EXPECT_GT(vault.Start(0), 0);
  fakes::FakeVaultRole role;
  role.bound_service_account_names = {"moeserve-vault"};
  role.bound_service_account_namespaces = {"team-a"};
  role.audience = "vault";
  role.read_paths = {"secret/data/team-a/*"};
  vault.SetRole("team-a", role);
  vault.Put("secret", "team-a/s3", {{"AWS_ACCESS_KEY_ID", "AKIAVAULTEXAMPLE"},
                                    {"AWS_SECRET_ACCESS_KEY", kCanaries.at("Vault object-store secret key")}});
  vault.Put("secret", "team-a/keys", {{"team-a-vault", kCanaries.at("Vault tenant API key")}});
  vault.Put("secret", "team-b/keys", {{"team-b", kCanaries.at("another team's Vault value")}});
  json vaulted = MoEDeploymentManifest("team-a", "vaulted", 1, 1);
  vaulted["spec"]["model"]["credentials"] = {{"vault", {{"path", "secret/data/team-a/s3"}}}};
  vaulted["spec"]["endpoint"]["apiKeys"] = {{"vault", {{"path", "secret/data/team-a/keys"}}}};
  EXPECT_TRUE(server.Create("moedeployments.moeserve.io", vaulted));
  json vault_refused = MoEDeploymentManifest("team-a", "vault-refused", 1, 1);
  vault_refused["spec"]["endpoint"]["apiKeys"] = {{"vault", {{"path", "secret/data/team-b/keys"}}}};
  EXPECT_TRUE(server.Create("moedeployments.moeserve.io", vault_refused));

  auto client = cluster.Client();
  {
    StderrCapture capture(dir / "operator.log");
    op::VaultConfig vault_config;
    vault_config.address = vault.url();
    vault_config.allow_insecure_http = true;  // the double speaks plain http on loopback
    op::VaultIntegration integration(*client, vault_config, op::VaultAuthOptions{});
    op::OperatorOptions options;
    options.reconciler.secret_source = integration.secret_source();
    options.reconciler.cleanup = integration.cleanup();
    options.reconciler.vault_resync = std::chrono::milliseconds(200);
    RunningOperator running(*client, options);
    EXPECT_TRUE(WaitFor([&] {
      return server.Get("statefulsets.apps", "team-a", "canary-r0").has_value() &&
             !ConditionOf(server, "team-a", "refused", "SecretsSynced").empty() &&
             ConditionOf(server, "team-a", "vaulted", "SecretsSynced").value("status", "") == "True" &&
             ConditionOf(server, "team-a", "vault-refused", "SecretsSynced").value("reason", "") ==
                 "VaultPermissionDenied";
    })) << "the operator did not reconcile every deployment";
    // Sealed for a while: the condition carries Vault's text, never a value.
    vault.SetSealed(true);
    EXPECT_TRUE(WaitFor([&] {
      return ConditionOf(server, "team-a", "vaulted", "SecretsSynced").value("reason", "") == "VaultUnavailable";
    })) << "the sealed Vault was not reported";
    vault.SetSealed(false);
    running.Stop();
  }
  if (auto s = server.Get("secrets", "team-a", "vaulted-secrets")) {
    const json data = (*s).value("data", json::object());
    EXPECT_EQ(Base64Decode(data.value("object-store.AWS_SECRET_ACCESS_KEY", "")),
              kCanaries.at("Vault object-store secret key"))
        << "the Vault value did not reach the deployment's Secret";
  } else {
    ADD_FAILURE() << "no vaulted-secrets";
  }
  // Everything the operator wrote that people read, one file per kind.
  for (const char* kind : {"events", "configmaps", "statefulsets.apps", "services", "persistentvolumes",
                           "persistentvolumeclaims", "moedeployments.moeserve.io"}) {
    json all = json::array();
    for (auto& o : server.List(kind)) all.push_back(o);
    WriteArtifact(dir, std::string("api-") + kind + ".json", all.dump(2));
  }
  // The generated admin key and metrics token are canaries too: they live in
  // the operator's namespace and the deployment's Secret and must appear
  // nowhere else.
  if (auto s = server.Get("secrets", "team-a", "canary-secrets")) {
    for (const auto& [k, v] : (*s)["data"].items()) {
      if (k == "metrics-token") generated["generated " + k] = Base64Decode(v.get<std::string>());
    }
  }
  if (auto s = server.Get("secrets", "moeserve-system", "moeserve-admin.team-a.canary")) {
    const json data = (*s).value("data", json::object());
    if (data.contains("admin-key")) generated["generated admin-key"] = Base64Decode(data["admin-key"].get<std::string>());
  }
  EXPECT_EQ(generated.size(), 2u) << "the deployment's Secret holds no generated admin key and metrics token";
  // The operator's Vault login tokens are secrets too.
  const auto tokens = vault.LoginTokens();
  EXPECT_FALSE(tokens.empty()) << "the operator never logged in to Vault";
  for (size_t i = 0; i < tokens.size(); ++i) generated["Vault login token " + std::to_string(i)] = tokens[i];
  return generated;
}

// The daemon's side: keys and a metrics token with canaries, requests with a
// wrong key, and a pull signed with a canary secret key.
void RunDaemon(const fs::path& dir) {
  using namespace daemon::testing;
  const std::string keys = (dir / "keys.yaml.input").string() + ".tmp";
  std::ofstream(keys) << "keys:\n  - key: " << kCanaries.at("tenant API key") << "\n    tenant: team-a\n";
  daemon::DaemonConfig c = TestConfig();
  c.api_keys_file = keys;
  std::string transcript;
  {
    StderrCapture capture(dir / "daemon.log");
    auto d = StartDaemon(c);
    ASSERT_NE(d, nullptr);
    const int port = PortOf(*d);
    auto wrong = Chat(port, {{"messages", UserTurn("hi")}, {"max_tokens", 2}},
                      {{"Authorization", "Bearer " + kCanaries.at("wrong API key sent by a client")}});
    EXPECT_EQ(wrong.status, 401);
    transcript += "wrong key -> " + std::to_string(wrong.status) + " " + wrong.body + "\n";
    auto right = Chat(port, {{"messages", UserTurn("hi")}, {"max_tokens", 2}, {"user", "someone"}},
                      {{"Authorization", "Bearer " + kCanaries.at("tenant API key")}});
    EXPECT_EQ(right.status, 200);
    transcript += "right key -> " + std::to_string(right.status) + " " + right.body + "\n";
    auto models = Http(port, "GET", "/v1/models", "", {{"Authorization", "Bearer " + kCanaries.at("tenant API key")}});
    transcript += "models -> " + models.body + "\n";
    // The metrics as an admin would see them, through the daemon's own registry.
    transcript += "metrics ->\n" + d->metrics().Scrape() + "\n";
    d->Shutdown(1);

    // A pull from an S3 double, signed with the canary secret key: log lines
    // and the error value (the double serves no model) must not carry it.
    testing::S3ListingDouble s3("models", {{"m/config.json", "{}"}});
    storage::WeightPuller puller(storage::CacheConfig{(dir / "cache.tmp").string(), 0});
    storage::PullOptions po;
    po.source.endpoint_url = s3.endpoint();
    po.source.region = "us-east-1";
    po.source.credentials = storage::AwsCredentials{"AKIAEXAMPLE", kCanaries.at("object-store secret key"), ""};
    auto pulled = puller.Pull("s3://models/m/", po);
    transcript += std::string("pull -> ") + (pulled ? "ok " + pulled->dir : pulled.error().ToString()) + "\n";
  }
  fs::remove_all(dir / "cache.tmp");
  fs::remove(keys);
  WriteArtifact(dir, "daemon-http.txt", transcript);
}

TEST(SecretsCanary, NoSecretReachesLogsEventsStatusOrConfigMaps) {
  const fs::path dir = ArtifactsDir();
  auto canaries = kCanaries;
  auto generated = RunOperator(dir);
  canaries.insert(generated.begin(), generated.end());
  RunDaemon(dir);
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) files += e.is_regular_file();
  ASSERT_GE(files, 9u) << "too few artifacts were captured to mean anything";
  for (const auto& f : ScanForLeaks(dir, canaries)) ADD_FAILURE() << "the " << f.canary << " leaked into " << f.file;
  std::printf("secrets canary: %zu canaries, %zu artifacts in %s, no leak\n", canaries.size(), files, dir.c_str());
}

TEST(SecretsCanary, TheScanFindsALeakInAnyEncoding) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("canary_scan_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "nested");
  const std::string canary = kCanaries.at("tenant API key");
  WriteArtifact(dir, "clean.log", "INFO nothing to see\n");
  EXPECT_TRUE(ScanForLeaks(dir, kCanaries).empty());
  // Raw in a log line, and base64 inside a longer value at each alignment.
  WriteArtifact(dir, "nested/raw.log", "WARN auth failed for key " + canary + "\n");
  for (size_t k = 0; k < 3; ++k) {
    WriteArtifact(dir, "b64-" + std::to_string(k) + ".json",
                  "{\"data\":\"" + Base64Encode(std::string_view(std::string(k + 1, 'p') + canary + "tail")) + "\"}");
  }
  auto found = ScanForLeaks(dir, kCanaries);
  EXPECT_EQ(found.size(), 4u);
  for (const auto& f : found) EXPECT_EQ(f.canary, "tenant API key") << f.file;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve
