// The operator's Vault tokens, one per (namespace, role): each is obtained
// by Kubernetes auth with a short-lived token of that namespace's Vault
// service account (TokenRequest API, with the Vault audience), so Vault's
// role bindings and policies decide what each namespace may read. The
// operator never logs in as itself on a namespace's behalf.
//
// Lifetime: a token is renewed (renew-self) on its first use after two
// thirds of its lease (the reconciler reads every resync interval, which
// must be well under the TTL); when renewal fails, or gives back less than a
// third of the first lease (the role's max TTL is near), the session logs in
// again. Invalidate() forgets a token a read found dead; Revoke() revokes it
// (revoke-self) when the last deployment using it goes.
//
// Development mode: with a fixed token (VAULT_TOKEN) every namespace reads
// with that one token; it is never renewed or revoked here.
//
// Thread safety: all methods may be called from any thread; calls for one
// identity are serialised, different identities proceed in parallel.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "moeserve/operator/kube_client.hpp"
#include "moeserve/operator/vault_client.hpp"

namespace moeserve::op {

struct VaultAuthOptions {
  std::string auth_mount = "kubernetes";
  // The per-namespace ServiceAccount whose token logs in (RBAC names it in
  // resourceNames for serviceaccounts/token).
  std::string service_account = "moeserve-vault";
  std::string audience = "vault";
  int64_t service_account_token_seconds = 600;  // the API's minimum
  std::string fixed_token;                      // VAULT_TOKEN: development only
  // The clock leases are measured on; tests move it.
  std::function<std::chrono::steady_clock::time_point()> now = [] { return std::chrono::steady_clock::now(); };
};

class VaultSessions {
 public:
  VaultSessions(VaultClient& vault, KubeClient& kube, VaultAuthOptions options);

  // A live token for the identity, logging in or renewing as needed.
  // Errors say which step failed with Vault's or the API server's text.
  Result<std::string> Token(const std::string& ns, const std::string& role);
  // Forgets `token` if it is still the identity's (a read found it dead).
  void Invalidate(const std::string& ns, const std::string& role, const std::string& token);
  // Revokes and forgets the identity's token; Ok when there is none.
  Status Revoke(const std::string& ns, const std::string& role);

  bool development() const { return !options_.fixed_token.empty(); }
  uint64_t logins() const { return logins_; }
  uint64_t renewals() const { return renewals_; }

 private:
  struct Session {
    std::mutex mu;
    std::string token;
    std::chrono::steady_clock::time_point renew_at, expires;
    std::chrono::seconds first_lease{0};
    bool renewable = false;
  };
  std::shared_ptr<Session> SessionFor(const std::string& ns, const std::string& role);
  Status Login(Session& s, const std::string& ns, const std::string& role);
  void Adopt(Session& s, const VaultLease& lease);

  VaultClient& vault_;
  KubeClient& kube_;
  VaultAuthOptions options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;  // "<ns>\n<role>"
  std::atomic<uint64_t> logins_{0}, renewals_{0};
};

}  // namespace moeserve::op
