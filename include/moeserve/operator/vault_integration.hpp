// Vault wired for the reconciler: the client, the per-namespace sessions, a
// SecretSource that routes `vault:` references to Vault and `secretRef:`
// ones to Kubernetes Secrets, and the CleanupHook that revokes tokens under
// the finalizer. Owns all of them; set
//   options.reconciler.secret_source = integration->secret_source();
//   options.reconciler.cleanup = integration->cleanup();
// and keep the integration alive as long as the operator.
//
// Thread safety: as its parts (all thread-safe).
#pragma once

#include <memory>

#include "moeserve/operator/kube_client.hpp"
#include "moeserve/operator/reconciler.hpp"
#include "moeserve/operator/vault_client.hpp"
#include "moeserve/operator/vault_secret_source.hpp"
#include "moeserve/operator/vault_sessions.hpp"

namespace moeserve::op {

class VaultIntegration {
 public:
  VaultIntegration(KubeClient& kube, VaultConfig config, VaultAuthOptions auth)
      : vault_(std::move(config)),
        sessions_(vault_, kube, std::move(auth)),
        kubernetes_(kube),
        vault_source_(vault_, sessions_),
        routing_(kubernetes_, &vault_source_),
        cleanup_(sessions_) {}

  SecretSource* secret_source() { return &routing_; }
  // Vault paths alone, as (namespace, role) log in: what HookSecretSource
  // reads hook keys through, with the operator's namespace and hook role.
  SecretSource* vault_source() { return &vault_source_; }
  CleanupHook* cleanup() { return &cleanup_; }
  VaultSessions& sessions() { return sessions_; }
  VaultClient& client() { return vault_; }

 private:
  VaultClient vault_;
  VaultSessions sessions_;
  KubernetesSecretSource kubernetes_;
  VaultSecretSource vault_source_;
  RoutingSecretSource routing_;
  VaultCleanup cleanup_;
};

}  // namespace moeserve::op
