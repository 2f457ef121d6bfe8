// daemon.api_keys_blank: a keys entry whose key is blank (`key:`, `key: ~`,
// `key: null`, empty, whitespace) is refused with a message naming the
// entry, by the parser and by a daemon starting on the file. yaml-cpp reads
// a null node as the text "null": before this check such an entry let
// `Authorization: Bearer null` in as its tenant.
#include <gtest/gtest.h>

#include <fstream>

#include "daemon_harness.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/daemon.hpp"

namespace moeserve::daemon {
namespace {

const std::string kGoodEntry = "keys:\n  - key: sk-acme-0123456789\n    tenant: acme\n";

TEST(ApiKeysBlank, EveryBlankFormIsRefusedNamingTheEntry) {
  for (const std::string blank : {"", " ~", " null", " Null", " NULL", " \"\"", " ''", " \"   \"", " \"\\t\"",
                                  " \" sk-padded\"", " \"sk-line\\n\""}) {
    const std::string text = kGoodEntry + "  - key:" + blank + "\n    tenant: beta\n";
    auto keys = ApiKeys::Parse(text, "keys.yaml");
    ASSERT_FALSE(keys) << "accepted key:" << blank << (keys && keys->Authenticate("Bearer null") ? " (Bearer null gets in)" : "");
    EXPECT_NE(keys.error().message().find("keys.yaml: keys[1].key: must"), std::string::npos)
        << "key:" << blank << " -> " << keys.error().message();
  }
  // The tenant and role are names too.
  for (const std::string field : {"tenant", "role"}) {
    for (const std::string blank : {"", " ~", " null", " \"  \""}) {
      auto keys = ApiKeys::Parse(kGoodEntry + "  - key: sk-beta-0123456789\n    " + field + ":" + blank + "\n", "keys.yaml");
      ASSERT_FALSE(keys) << field << ":" << blank;
      EXPECT_NE(keys.error().message().find("keys[1]." + field + ": must be text"), std::string::npos)
          << keys.error().message();
    }
  }
}

TEST(ApiKeysBlank, ADaemonDoesNotStartOnANullKey) {
  const std::string path = ::testing::TempDir() + "/keys-null-" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(path) << kGoodEntry << "  - key: null\n    tenant: beta\n";
  DaemonConfig c = testing::TestConfig();
  c.api_keys_file = path;
  auto d = Daemon::Create(c);
  ASSERT_FALSE(d) << "the daemon started; Bearer null would be tenant beta";
  EXPECT_NE(d.error().message().find(path + ": keys[1].key: must be text, not null"), std::string::npos)
      << d.error().message();
}

TEST(ApiKeysBlank, ANonBlankKeyStillWorks) {
  auto keys = ApiKeys::Parse(kGoodEntry + "  - key: \"null-but-quoted-and-long\"\n    tenant: beta\n", "keys.yaml");
  ASSERT_TRUE(keys) << keys.error().ToString();
  EXPECT_EQ(keys->Authenticate("Bearer null-but-quoted-and-long")->tenant, "beta");
  EXPECT_EQ(keys->Authenticate("Bearer sk-acme-0123456789")->tenant, "acme");
  EXPECT_FALSE(keys->Authenticate("Bearer null"));
}

}  // namespace
}  // namespace moeserve::daemon
