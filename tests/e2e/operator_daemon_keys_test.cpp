// What the operator writes into a deployment's Secret is what the daemon
// reads: api-keys.yaml parses with the daemon's own parser and admits the
// operator's admin key (kept in the operator's namespace) as admin and each
// tenant key as that tenant (never as admin), and no value of the tenant's
// Secret as admin; the metrics token is one line. And the directory the serve
// config names is the one `moe-daemon pull` (verified) fills.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "fake_apiserver.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/storage/weight_puller.hpp"
#include "moeserve/engine/manifest.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "moeserve/operator/operator.hpp"

namespace moeserve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 20s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

struct TempDir {
  TempDir() : path(fs::temp_directory_path() / ("moe-e2e-" + std::to_string(getpid()) + "-" + std::to_string(counter++))) {
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static inline int counter = 0;
  fs::path path;
};

TEST(OperatorDaemonContract, SecretKeysAreWhatTheDaemonAuthenticates) {
  fakes::FakeApiServer server;
  ASSERT_TRUE(server.RegisterCrdFile(std::string(MOESERVE_SOURCE_DIR_DEFAULT) + "/crds/moeserve.io_moedeployments.yaml"));
  // The operator reads QuotaPolicies too (its caches sync before it works).
  ASSERT_TRUE(server.RegisterCrdFile(std::string(MOESERVE_SOURCE_DIR_DEFAULT) + "/crds/moeserve.io_quotapolicies.yaml"));
  ASSERT_GT(server.Start(0), 0);
  for (const char* ns : {"team-a", "moeserve-system"})  // the tenant's, and the operator's own
    ASSERT_TRUE(server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}));
  ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                        {"metadata", {{"name", "keys"}, {"namespace", "team-a"},
                                                      {"labels", {{op::kUsableLabel, "true"}}}}},
                                        {"stringData", {{"acme", "sk-acme-1"}, {"globex", "sk-globex-1"}}}}));
  json md = {{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "MoEDeployment"},
             {"metadata", {{"name", "m"}, {"namespace", "team-a"}}},
             {"spec", {{"image", "moeserve/moe-daemon:0.1.0"}, {"model", {{"uri", "s3://models/m/"}}},
                       {"endpoint", {{"apiKeys", {{"secretRef", {{"name", "keys"}}}}}}}}}};
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", md));
  op::KubeConfig config;
  config.server = server.url();
  auto client = op::KubeClient::Create(config);
  ASSERT_TRUE(client);
  op::Operator oper(**client, {});
  Status ran;
  std::thread runner([&] { ran = oper.Run(); });
  const bool written = WaitFor([&] {
    auto s = server.Get("secrets", "team-a", "m-secrets");
    return s && (*s)["data"].contains("api-keys.yaml") && server.Get("configmaps", "team-a", "m-config");
  });
  auto secret = server.Get("secrets", "team-a", "m-secrets");
  auto cm = server.Get("configmaps", "team-a", "m-config");
  auto md_now = server.Get("moedeployments.moeserve.io", "team-a", "m");
  ASSERT_TRUE(md_now);
  auto admin_secret = server.Get("secrets", "moeserve-system", op::desired::AdminSecretName(*md_now));
  oper.RequestStop();
  runner.join();
  ASSERT_TRUE(written);
  ASSERT_TRUE(admin_secret) << "no admin key in the operator's namespace";
  const std::string admin_key = Base64Decode((*admin_secret)["data"].value(op::kAdminKeyKey, ""));

  // The Secret volume's files, where the serve config says they are (moved to a temp dir).
  TempDir dir;
  std::map<std::string, std::string> data;
  for (const auto& [k, v] : (*secret)["data"].items()) data[k] = Base64Decode(v.get<std::string>());
  for (const char* file : {"api-keys.yaml", "metrics-token"}) std::ofstream(dir.path / file) << data[file];
  std::string text = (*cm)["data"]["config.yaml"];
  for (const char* file : {"api-keys.yaml", "metrics-token"}) {
    const std::string from = std::string(op::kSecretsDir) + "/" + file;
    text.replace(text.find(from), from.size(), (dir.path / file).string());
  }
  auto cfg = daemon::ParseDaemonConfigYaml(text, "config.yaml");
  ASSERT_TRUE(cfg) << cfg.error().ToString() << "\n" << text;

  auto keys = daemon::ApiKeys::LoadFile(cfg->api_keys_file);
  ASSERT_TRUE(keys) << keys.error().ToString();
  EXPECT_EQ(keys->size(), 3u);
  auto admin = keys->Authenticate("Bearer " + admin_key);
  ASSERT_TRUE(admin);
  EXPECT_TRUE(admin->admin);
  EXPECT_EQ(admin->tenant, op::kAdminTenant);
  auto acme = keys->Authenticate("Bearer sk-acme-1");
  ASSERT_TRUE(acme);
  EXPECT_EQ(acme->tenant, "acme");
  EXPECT_FALSE(acme->admin);
  EXPECT_FALSE(keys->Authenticate("Bearer " + data["metrics-token"])) << "the metrics token is not an API key";
  EXPECT_FALSE(keys->Authenticate("Bearer sk-guess"));
  // Nothing a tenant can read in its namespace is an admin credential.
  for (const auto& [k, v] : data) {
    auto as = keys->Authenticate("Bearer " + v);
    EXPECT_FALSE(as && as->admin) << "the tenant's Secret holds an admin key in " << k;
  }
  EXPECT_EQ(data["metrics-token"].find('\n'), std::string::npos);
  EXPECT_FALSE(data["metrics-token"].empty());
}

TEST(OperatorDaemonContract, ServeConfigNamesTheDirectoryTheVerifiedPullFills) {
  TempDir source, cache;
  std::ofstream(source.path / "weights.bin") << std::string(4096, 'w');
  auto manifest = engine::BuildManifest(source.path.string());
  ASSERT_TRUE(manifest) << manifest.error().ToString();
  std::ofstream(source.path / "manifest.json") << manifest->ToJson();

  op::MoEDeploymentSpec spec;
  spec.model_uri = "file://" + source.path.string();
  spec.model_revision = "2026-11-01";
  storage::PullOptions options;
  options.revision = spec.model_revision;
  options.log_progress = false;  // verify stays on, as the init container runs it
  storage::WeightPuller puller({cache.path.string(), 0});
  auto pulled = puller.Pull(spec.model_uri, options);
  ASSERT_TRUE(pulled) << pulled.error().ToString();

  // The pod mounts the cache at kCacheDir; the puller's cache root is that mount.
  const std::string in_pod = op::desired::ModelDirectory(spec);
  ASSERT_EQ(in_pod.rfind(op::kCacheDir, 0), 0u);
  EXPECT_EQ(fs::path(pulled->dir).lexically_normal(),
            fs::path(cache.path.string() + in_pod.substr(std::string(op::kCacheDir).size())).lexically_normal());
}

}  // namespace
}  // namespace moeserve
