// Shared pieces of the Vault tests: the API double with two team
// namespaces and their Vault service accounts, and a Vault double whose
// roles bind each team's service account to that team's paths.
#pragma once

#include <atomic>
#include <chrono>

#include "fake_vault.hpp"
#include "moeserve/operator/vault_client.hpp"
#include "moeserve/operator/vault_sessions.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {

// A steady clock the test moves forward (the Vault double's clock moves with it).
struct TestClock {
  std::atomic<int64_t> offset_s{0};
  std::function<std::chrono::steady_clock::time_point()> Fn() {
    return [this] { return std::chrono::steady_clock::now() + std::chrono::seconds(offset_s.load()); };
  }
};

class VaultWorld {
 public:
  explicit VaultWorld(int64_t ttl_s = 60, int64_t max_ttl_s = 3600) : vault(cluster.server.url()) {
    for (const char* ns : {"team-a", "team-b"}) {
      (void)cluster.server.Create("namespaces",
                                  {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
      EXPECT_TRUE(cluster.server.Create("serviceaccounts", {{"apiVersion", "v1"},
                                                            {"kind", "ServiceAccount"},
                                                            {"metadata", {{"name", "moeserve-vault"}, {"namespace", ns}}}}));
      fakes::FakeVaultRole role;
      role.bound_service_account_names = {"moeserve-vault"};
      role.bound_service_account_namespaces = {ns};
      role.audience = "vault";
      role.read_paths = {"secret/data/" + std::string(ns) + "/*"};
      role.token_ttl_s = ttl_s;
      role.token_max_ttl_s = max_ttl_s;
      vault.SetRole(ns, role);
    }
    EXPECT_GT(vault.Start(0), 0);
  }
  VaultConfig Config() const {
    VaultConfig c;
    c.address = vault.url();
    c.allow_insecure_http = true;  // the double speaks plain http on loopback
    c.request_timeout = std::chrono::seconds(5);
    c.attempts = 3;
    c.backoff_initial = std::chrono::milliseconds(5);
    return c;
  }
  VaultAuthOptions Auth() {
    VaultAuthOptions a;
    a.now = clock.Fn();
    return a;
  }
  // Moves both the operator's and Vault's clocks.
  void Advance(std::chrono::seconds by) {
    clock.offset_s += by.count();
    vault.Advance(by);
  }

  FakeCluster cluster;
  fakes::FakeVault vault;
  TestClock clock;
};

}  // namespace moeserve::op::testing
