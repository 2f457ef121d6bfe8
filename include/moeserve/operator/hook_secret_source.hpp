// Where the usage sync reads a QuotaPolicy hook's key (hooks[].secret), the
// HMAC key that signs its cost alerts. The key is the platform's: a receiver
// trusts a signed body as the platform's word, so no tenant may ever hold
// it. It is therefore read only from places no MoEDeployment can name, and
// only with identities no tenant's deployment uses:
//
//  - secret.vault.path: under `<--hook-vault-prefix>/<policy namespace>/`
//    (canonical, vault_paths.hpp; MoEDeployments may name nothing under the
//    prefix), read with the operator's own Vault identity: the
//    ServiceAccount --vault-service-account in the operator's namespace,
//    logging in as role --hook-vault-role. Never with the tenant
//    namespace's role, which also reads what the tenant's deployments copy
//    into their own Secrets.
//  - secret.secretRef.name: a Secret in the operator's namespace (MoEDeployments
//    name Secrets of their own namespace only) labelled
//    moeserve.io/hook-namespace=<policy namespace>, so one namespace's
//    policy cannot sign with another's key.
//
// Errors name the hook's field and say what is missing; never a value.
//
// Thread safety: Fetch may be called from any thread (its sources are thread-safe).
#pragma once

#include <map>
#include <string>

#include "moeserve/operator/kube_client.hpp"
#include "moeserve/operator/reconciler.hpp"

namespace moeserve::op {

// The label that gives a Secret in the operator's namespace to one namespace's hooks.
inline constexpr char kHookNamespaceLabel[] = "moeserve.io/hook-namespace";

struct HookSecretOptions {
  std::string operator_namespace = "moeserve-system";  // --operator-namespace
  std::string vault_prefix;                            // --hook-vault-prefix, canonical; "" = no Vault hooks
  std::string vault_role = "moeserve-hooks";           // --hook-vault-role
};

class HookSecretSource : public SecretSource {
 public:
  // `vault`: reads a path as (namespace, role) log in (VaultSecretSource);
  // null when Vault is not configured.
  HookSecretSource(KubeClient& kube, SecretSource* vault, HookSecretOptions options)
      : kube_(kube), vault_(vault), options_(std::move(options)) {}
  // `ns`: the QuotaPolicy's namespace.
  Result<std::map<std::string, std::string>> Fetch(const std::string& ns, const SecretReference& ref) override;

 private:
  KubeClient& kube_;
  SecretSource* vault_;
  HookSecretOptions options_;
};

}  // namespace moeserve::op
