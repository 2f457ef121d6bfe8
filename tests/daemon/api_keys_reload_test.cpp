// The daemon follows its API keys file as the kubelet updates a Secret
// volume: each version in its own `..<timestamp>` directory, `..data` a
// symlink to the current one, swapped by rename(2), and `api-keys.yaml` a
// symlink through `..data`. A swap reaches a running daemon without a
// restart; a version that does not load (missing, malformed, empty) makes
// the daemon refuse every key until one loads (a key the broken version was
// meant to revoke must not stay alive), says so on /readyz and /metrics, and
// is logged without any key in the log.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "secret_volume.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/daemon/keys/api_keys_reloader.hpp"

namespace moeserve::daemon {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::Http;

using testing::SecretVolume;

std::string KeysFile(const std::vector<std::pair<std::string, std::string>>& tenant_keys) {
  std::string text = "keys:\n";
  for (const auto& [tenant, key] : tenant_keys)
    text += "  - sha256: " + Sha256Hex(std::string_view(key)) + "\n    tenant: " + tenant + "\n    role: user\n";
  return text;
}

bool Admitted(ReloadingApiKeys& keys, const std::string& key) {
  return keys.Current()->Authenticate("Bearer " + key).has_value();
}

TEST(ApiKeysReload, FollowsTheKubeletsSymlinkSwap) {
  SecretVolume volume;
  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-old"}}));
  ASSERT_TRUE(fs::is_symlink(volume.path("api-keys.yaml")));
  ASSERT_TRUE(fs::is_symlink(volume.path("..data")));
  auto keys = ReloadingApiKeys::Open(volume.path("api-keys.yaml"), 0ms);
  ASSERT_TRUE(keys) << keys.error().ToString();
  ReloadingApiKeys& k = **keys;
  EXPECT_TRUE(Admitted(k, "sk-acme-old"));
  EXPECT_FALSE(Admitted(k, "sk-acme-new"));

  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-new"}}));
  EXPECT_TRUE(Admitted(k, "sk-acme-new"));
  EXPECT_FALSE(Admitted(k, "sk-acme-old"));
  EXPECT_EQ(k.reloads(), 1u);

  // Nothing changed on disk: nothing is reloaded.
  for (int i = 0; i < 5; ++i) (void)k.Current();
  EXPECT_EQ(k.reloads(), 1u);
}

TEST(ApiKeysReload, ABrokenVersionRefusesEveryKeyAndLogsNoKey) {
  SecretVolume volume;
  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-1"}}));
  auto keys = ReloadingApiKeys::Open(volume.path("api-keys.yaml"), 0ms);
  ASSERT_TRUE(keys) << keys.error().ToString();
  ReloadingApiKeys& k = **keys;
  const std::string first_sha = k.State().file_sha256;
  EXPECT_EQ(first_sha, Sha256Hex(std::string_view(KeysFile({{"acme", "sk-acme-1"}}))));
  EXPECT_FALSE(k.State().refusing);

  // Not YAML, and a plain key in it that must not reach the log.
  ::testing::internal::CaptureStderr();
  volume.Publish("api-keys.yaml", "keys:\n  - key: sk-planted-canary-91f3\n    tenant: [unclosed\n");
  EXPECT_FALSE(Admitted(k, "sk-acme-1"));
  EXPECT_FALSE(Admitted(k, "sk-planted-canary-91f3"));
  EXPECT_FALSE(Admitted(k, "sk-acme-1"));  // checked again: still refused, counted and logged once
  EXPECT_TRUE(k.State().refusing);
  EXPECT_EQ(k.failures(), 1u);
  // Valid YAML whose entry is malformed (a null key).
  volume.Publish("api-keys.yaml", "keys:\n  - key: ~\n    tenant: acme\n");
  EXPECT_FALSE(Admitted(k, "sk-acme-1"));
  EXPECT_FALSE(Admitted(k, "null"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(k.failures(), 2u);
  EXPECT_EQ(k.reloads(), 0u);
  const auto state = k.State();
  EXPECT_TRUE(state.refusing);
  EXPECT_NE(state.problem.find("keys[0].key: must be text, not null"), std::string::npos) << state.problem;
  EXPECT_EQ(state.file_sha256, first_sha) << "the hash is of the version last loaded";
  EXPECT_NE(log.find("refusing every API key"), std::string::npos) << log;
  EXPECT_EQ(log.find("sk-planted-canary-91f3"), std::string::npos) << log;
  EXPECT_EQ(log.find("sk-acme-1"), std::string::npos) << log;
  EXPECT_EQ(state.problem.find("sk-planted-canary-91f3"), std::string::npos) << state.problem;

  // A good version after the bad ones is picked up.
  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-2"}}));
  EXPECT_TRUE(Admitted(k, "sk-acme-2"));
  EXPECT_FALSE(Admitted(k, "sk-acme-1"));
  EXPECT_EQ(k.reloads(), 1u);
  EXPECT_FALSE(k.State().refusing);
  EXPECT_EQ(k.State().file_sha256, Sha256Hex(std::string_view(KeysFile({{"acme", "sk-acme-2"}}))));
}

TEST(ApiKeysReload, ChecksAtMostOncePerInterval) {
  SecretVolume volume;
  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-1"}}));
  auto keys = ReloadingApiKeys::Open(volume.path("api-keys.yaml"), 1h);
  ASSERT_TRUE(keys) << keys.error().ToString();
  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-2"}}));
  // Within the interval the file is not looked at: the old keys hold.
  EXPECT_TRUE((*keys)->Current()->Authenticate("Bearer sk-acme-1").has_value());
  EXPECT_EQ((*keys)->reloads(), 0u);
}

// A running daemon (its HTTP front, the real request path) picks up the swap.
TEST(ApiKeysReload, RunningDaemonServesTheRotatedKeyWithoutRestart) {
  SecretVolume volume;
  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-before"}}));
  DaemonConfig c = testing::TestConfig();
  c.api_keys_file = volume.path("api-keys.yaml");
  auto d = testing::StartDaemon(c);
  ASSERT_TRUE(d);
  const int port = testing::PortOf(*d);
  auto status_with = [&](const std::string& key) {
    return Http(port, "GET", "/v1/models", "", {{"Authorization", "Bearer " + key}}).status;
  };
  EXPECT_EQ(status_with("sk-acme-before"), 200);
  EXPECT_EQ(status_with("sk-acme-after"), 401);

  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-after"}}));
  const auto published = std::chrono::steady_clock::now();
  bool switched = false;
  while (!switched && std::chrono::steady_clock::now() - published < 10s) {
    switched = status_with("sk-acme-after") == 200;
    if (!switched) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(switched) << "the daemon never admitted the rotated key";
  EXPECT_EQ(status_with("sk-acme-before"), 401);

  // A broken version: the daemon refuses every key until a good one lands.
  volume.Publish("api-keys.yaml", "keys: [not, a, list, of, maps\n");
  const auto broken = std::chrono::steady_clock::now();
  bool refused = false;
  while (!refused && std::chrono::steady_clock::now() - broken < 10s) {
    refused = status_with("sk-acme-after") == 401;
    if (!refused) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(refused) << "the daemon kept a key the broken file no longer vouches for";
  d->Shutdown(1);
}

// A running daemon whose keys file goes bad in the ways a revocation can go
// wrong: each test starts from a good file with two tenants, then revokes
// beta's key in a version that does not load. beta must get 401 from the
// next check on; /readyz and /metrics say why; a good file brings keys back.
class ApiKeysRevocation : public ::testing::Test {
 protected:
  static constexpr char kMetricsToken[] = "metrics-token-0123456789";
  static void SetUpTestSuite() {
    volume_ = new SecretVolume();
    volume_->Publish({{"api-keys.yaml", GoodFile()}, {"metrics-token", kMetricsToken}});
    DaemonConfig c = testing::TestConfig();
    c.api_keys_file = volume_->path("api-keys.yaml");
    c.metrics_token_file = volume_->path("metrics-token");
    daemon_ = testing::StartDaemon(c).release();
    port_ = daemon_ ? testing::PortOf(*daemon_) : 0;
  }
  static void TearDownTestSuite() {
    if (daemon_) daemon_->Shutdown(1);
    delete daemon_;
    delete volume_;
    daemon_ = nullptr;
    volume_ = nullptr;
  }
  static std::string GoodFile() { return KeysFile({{"acme", "sk-acme-kept"}, {"beta", "sk-beta-revoked"}}); }

  void SetUp() override {
    ASSERT_NE(daemon_, nullptr);
    Publish(GoodFile());
    ASSERT_TRUE(WaitForStatus("sk-beta-revoked", 200)) << "the good file was never loaded";
    ASSERT_EQ(StatusWith("sk-acme-kept"), 200);
    ASSERT_EQ(Http(port_, "GET", "/readyz").status, 200);
  }

  static void Publish(const std::string& keys_file) {
    volume_->Publish({{"api-keys.yaml", keys_file}, {"metrics-token", kMetricsToken}});
  }
  static int StatusWith(const std::string& key) {
    return Http(port_, "GET", "/v1/models", "", {{"Authorization", "Bearer " + key}}).status;
  }
  // The daemon checks the file at most once a second: wait up to 10 s.
  static bool WaitForStatus(const std::string& key, int want) {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < 10s) {
      if (StatusWith(key) == want) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  static std::string Metrics() {
    return Http(port_, "GET", "/metrics", "", {{"Authorization", std::string("Bearer ") + kMetricsToken}}).body;
  }
  static double Sample(const std::string& metrics, const std::string& name) {
    for (size_t pos = 0; (pos = metrics.find(name, pos)) != std::string::npos; pos += name.size()) {
      if ((pos == 0 || metrics[pos - 1] == '\n') && metrics[pos + name.size()] == ' ') {
        return std::stod(metrics.substr(pos + name.size() + 1));
      }
    }
    return -1;
  }

  // The revocation lands in a version that does not load: beta is refused,
  // and so is every other key; the daemon says why; a good file restores it.
  void ExpectFailsClosed(const std::string& broken_reason) {
    const double failures_before = Sample(Metrics(), "moe_api_keys_reload_failures_total");
    EXPECT_TRUE(WaitForStatus("sk-beta-revoked", 401)) << "the revoked key still works after " << broken_reason;
    EXPECT_EQ(StatusWith("sk-acme-kept"), 401) << "fail closed: no key is trusted from a file that does not load";
    auto ready = Http(port_, "GET", "/readyz");
    EXPECT_EQ(ready.status, 503) << ready.body;
    EXPECT_EQ(ready.Json().value("status", ""), "api_keys_invalid") << ready.body;
    EXPECT_NE(ready.Json().value("detail", "").find(broken_reason), std::string::npos) << ready.body;
    const std::string m = Metrics();
    EXPECT_EQ(Sample(m, "moe_api_keys_reload_failures_total"), failures_before + 1) << m;
    EXPECT_EQ(Sample(m, "moe_api_keys_refusing"), 1) << m;
    EXPECT_EQ(Sample(m, "moe_api_keys_file_info{sha256=\"" + Sha256Hex(std::string_view(GoodFile())) + "\"}"), 1)
        << "the hash stays that of the version last loaded\n" << m;

    const std::string fixed = KeysFile({{"acme", "sk-acme-kept"}});
    Publish(fixed);
    EXPECT_TRUE(WaitForStatus("sk-acme-kept", 200)) << "a good file did not bring the keys back";
    EXPECT_EQ(StatusWith("sk-beta-revoked"), 401);
    EXPECT_EQ(Http(port_, "GET", "/readyz").status, 200);
    const std::string after = Metrics();
    EXPECT_EQ(Sample(after, "moe_api_keys_refusing"), 0) << after;
    EXPECT_EQ(Sample(after, "moe_api_keys_file_info{sha256=\"" + Sha256Hex(std::string_view(fixed)) + "\"}"), 1) << after;
    EXPECT_EQ(after.find(Sha256Hex(std::string_view(GoodFile()))), std::string::npos) << "one file-info sample\n" << after;
  }

  inline static SecretVolume* volume_ = nullptr;
  inline static Daemon* daemon_ = nullptr;
  inline static int port_ = 0;
};

TEST_F(ApiKeysRevocation, RemovalSavedWithATypoRevokesTheKey) {
  // beta's entry deleted, and acme's `tenant:` mistyped in the same edit.
  Publish("keys:\n  - sha256: " + Sha256Hex(std::string_view("sk-acme-kept")) + "\n    tenant: acme\n    role: usr\n");
  ExpectFailsClosed("keys[0].role: 'usr' is not admin or user");
}

TEST_F(ApiKeysRevocation, DeletedFileRevokesEveryKey) {
  std::filesystem::remove(volume_->path("api-keys.yaml"));
  ExpectFailsClosed("cannot be opened");
}

TEST_F(ApiKeysRevocation, EmptyKeyListRevokesEveryKey) {
  Publish("keys: []\n");
  ExpectFailsClosed("lists no keys");
}

TEST_F(ApiKeysRevocation, NullKeyAddedOnReloadIsRefusedAndBearerNullGetsNothing) {
  // A new entry whose key was left blank: once the literal key "null".
  Publish(KeysFile({{"acme", "sk-acme-kept"}}) + "  - key:\n    tenant: beta\n");
  EXPECT_TRUE(WaitForStatus("sk-beta-revoked", 401));
  EXPECT_EQ(StatusWith("null"), 401);
  auto ready = Http(port_, "GET", "/readyz");
  EXPECT_NE(ready.body.find("keys[1].key: must be text, not null"), std::string::npos) << ready.body;
}

}  // namespace
}  // namespace moeserve::daemon
