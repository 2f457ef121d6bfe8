// Secrets from Vault for the reconciler: a SecretSource that reads KV
// version 2 paths (spec.model.credentials.vault.path,
// spec.endpoint.apiKeys.vault.path) with the token of the deployment's
// namespace and role (VaultSessions), a router that sends `vault:`
// references here and `secretRef:` ones to the Kubernetes source, and the
// CleanupHook that revokes a deployment's Vault token under its finalizer.
//
// Errors keep the reconciler's contract (SecretSource): Vault's own text
// ("1 error occurred: * permission denied", "Vault is sealed") with the
// path, never a value. A 403 on a read is checked with lookup-self: a token
// Vault no longer honours (expired, revoked) is replaced by a new login and
// the read tried once more; a live token means the policy refuses the path.
//
// KV v2 reads carry no lease; the only thing to give back is the login
// token, which Cleanup revokes (a Vault still unreachable after the client's
// retries is logged, not waited for: the deletion goes on and the token ends
// at its TTL). Identities are shared by the deployments of
// one namespace and role: one that loses its token to another's cleanup
// logs in again on its next read.
//
// Thread safety: Fetch and Cleanup may be called from any thread.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "moeserve/operator/reconciler.hpp"
#include "moeserve/operator/vault_client.hpp"
#include "moeserve/operator/vault_sessions.hpp"

namespace moeserve::op {

class VaultSecretSource : public SecretSource {
 public:
  VaultSecretSource(VaultClient& vault, VaultSessions& sessions) : vault_(vault), sessions_(sessions) {}
  Result<std::map<std::string, std::string>> Fetch(const std::string& ns, const SecretReference& ref) override;

 private:
  VaultClient& vault_;
  VaultSessions& sessions_;
  std::mutex mu_;
  std::map<std::string, int64_t> versions_;  // "<ns>\n<role>\n<path>" -> last version read
};

// `vault:` references to `vault` (when Vault is configured), the rest to `secrets`.
class RoutingSecretSource : public SecretSource {
 public:
  RoutingSecretSource(SecretSource& secrets, SecretSource* vault) : secrets_(secrets), vault_(vault) {}
  Result<std::map<std::string, std::string>> Fetch(const std::string& ns, const SecretReference& ref) override;

 private:
  SecretSource& secrets_;
  SecretSource* vault_;
};

// Revokes the Vault token of a deployment's namespace and role.
class VaultCleanup : public CleanupHook {
 public:
  explicit VaultCleanup(VaultSessions& sessions) : sessions_(sessions) {}
  Status Cleanup(const json& moedeployment) override;

 private:
  VaultSessions& sessions_;
};

// The role a deployment logs in with: spec.vault.role, else its namespace.
std::string VaultRoleOf(const std::string& ns, const std::string& role);

}  // namespace moeserve::op
