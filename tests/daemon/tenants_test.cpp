// daemon.tenants: the keys file's `tenants` map gives each key's principal the
// tiers its tenant may use ("*" for tenants without an entry; every tier when
// absent), and malformed entries stop the load naming the entry.
#include <gtest/gtest.h>

#include "moeserve/daemon/keys/api_keys.hpp"

namespace moeserve::daemon {
namespace {

TEST(Tenants, KeysCarryTheirTenantsTiers) {
  auto keys = ApiKeys::Parse(R"(
tenants:
  acme: {tiers: [low, medium]}
  "*": {tiers: [low]}
keys:
  - {key: sk-acme, tenant: acme}
  - {key: sk-other, tenant: other}
  - {key: sk-admin, tenant: ops, role: admin}
)", "keys.yaml");
  ASSERT_TRUE(keys) << keys.error().ToString();
  auto acme = keys->Authenticate("Bearer sk-acme");
  ASSERT_TRUE(acme);
  EXPECT_EQ(acme->tiers, TierBit("low") | TierBit("medium"));
  EXPECT_EQ(TierSetNames(acme->tiers), "low, medium");
  EXPECT_EQ(keys->Authenticate("Bearer sk-other")->tiers, TierBit("low"));
  EXPECT_EQ(keys->Authenticate("Bearer sk-admin")->tiers, TierBit("low"));  // admins follow their tenant too
  auto open = ApiKeys::Parse("keys:\n  - {key: k, tenant: t}\n", "keys.yaml");
  ASSERT_TRUE(open);
  EXPECT_EQ(open->Authenticate("Bearer k")->tiers, kAllTiers);
}

TEST(Tenants, MalformedTenantsAreRefusedNamingTheEntry) {
  for (const char* bad : {"tenants: [acme]\nkeys:\n  - {key: k}\n",
                          "tenants:\n  acme: {tiers: [ultra]}\nkeys:\n  - {key: k}\n",
                          "tenants:\n  acme: {tiers: low}\nkeys:\n  - {key: k}\n",
                          "tenants:\n  acme: {tier: [low]}\nkeys:\n  - {key: k}\n",
                          "tenants:\n  acme: {tiers: [{a: b}]}\nkeys:\n  - {key: k}\n"}) {
    auto keys = ApiKeys::Parse(bad, "keys.yaml");
    ASSERT_FALSE(keys) << bad;
    EXPECT_EQ(keys.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(keys.error().message().find("keys.yaml: tenants"), std::string::npos) << keys.error().message();
  }
}

}  // namespace
}  // namespace moeserve::daemon
