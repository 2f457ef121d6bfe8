// The daemon follows its API keys file as the kubelet updates a Secret
// volume: each version in its own `..<timestamp>` directory, `..data` a
// symlink to the current one, swapped by rename(2), and `api-keys.yaml` a
// symlink through `..data`. A swap reaches a running daemon without a
// restart; a version that does not parse keeps the old keys and is logged
// without any key in the log.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "secret_volume.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/daemon/api_keys_reloader.hpp"

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

TEST(ApiKeysReload, ABrokenVersionKeepsTheOldKeysAndLogsNoKey) {
  SecretVolume volume;
  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-1"}}));
  auto keys = ReloadingApiKeys::Open(volume.path("api-keys.yaml"), 0ms);
  ASSERT_TRUE(keys) << keys.error().ToString();
  ReloadingApiKeys& k = **keys;

  // Not YAML, and a plain key in it that must not reach the log.
  ::testing::internal::CaptureStderr();
  volume.Publish("api-keys.yaml", "keys:\n  - key: sk-planted-canary-91f3\n    tenant: [unclosed\n");
  EXPECT_TRUE(Admitted(k, "sk-acme-1"));
  EXPECT_FALSE(Admitted(k, "sk-planted-canary-91f3"));
  EXPECT_TRUE(Admitted(k, "sk-acme-1"));  // checked again: still refused, logged once
  // Valid YAML whose entry is malformed (an empty key).
  volume.Publish("api-keys.yaml", "keys:\n  - key: \"\"\n    tenant: acme\n");
  EXPECT_TRUE(Admitted(k, "sk-acme-1"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(k.failures(), 2u);
  EXPECT_EQ(k.reloads(), 0u);
  EXPECT_NE(log.find("keeping the previous 1 keys"), std::string::npos) << log;
  EXPECT_EQ(log.find("sk-planted-canary-91f3"), std::string::npos) << log;
  EXPECT_EQ(log.find("sk-acme-1"), std::string::npos) << log;

  // A good version after the bad ones is picked up.
  volume.Publish("api-keys.yaml", KeysFile({{"acme", "sk-acme-2"}}));
  EXPECT_TRUE(Admitted(k, "sk-acme-2"));
  EXPECT_FALSE(Admitted(k, "sk-acme-1"));
  EXPECT_EQ(k.reloads(), 1u);
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

  // A broken version: the daemon keeps serving the last good keys.
  volume.Publish("api-keys.yaml", "keys: [not, a, list, of, maps\n");
  std::this_thread::sleep_for(1200ms);  // past one check interval
  EXPECT_EQ(status_with("sk-acme-after"), 200);
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon
