// The quota webhook's serving side on each operator replica: the HTTPS
// server, the certificate it serves, and (on the leader) the CA bundle in
// the ValidatingWebhookConfiguration.
//
// Certificates live in one Secret in the operator's namespace (ca.crt,
// tls.crt, tls.key; ca.key too when the operator makes them), so every
// replica serves the same one. Every check_interval each replica:
//  1. reads the Secret; with manage_certs, creates it when absent (a create
//     that loses to another replica's gets 409 and reads the winner's), and
//     replaces it (update with its resourceVersion: one replica wins) when
//     the serving certificate is at two thirds of its lifetime, does not
//     match its key, is not signed by ca.crt or lacks the Service's names;
//     the serving certificate is re-issued under the same CA, and the CA
//     (lifetime ten times the serving certificate's) is replaced at two
//     thirds of its own, the old CA staying in ca.crt beside the new one
//     until it expires;
//  2. serves tls.crt/tls.key when they differ from what it serves;
//  3. when leading, writes ca.crt into clientConfig.caBundle of every
//     webhook of the ValidatingWebhookConfiguration (absent: nothing to do).
// Without manage_certs (cert-manager owns the Secret and the bundle) only
// step 2 runs.
//
// Thread safety: Start/Stop from one thread, SetLeading from any.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "moeserve/operator/admission_server.hpp"
#include "moeserve/operator/kube_client.hpp"

namespace moeserve::op {

namespace resources {
inline const ResourceRef kValidatingWebhookConfiguration{"admissionregistration.k8s.io", "v1",
                                                         "validatingwebhookconfigurations",
                                                         "ValidatingWebhookConfiguration", false};
}  // namespace resources

inline constexpr char kWebhookName[] = "quota.moeserve.io";
inline constexpr char kWebhookPath[] = "/validate-moeserve-io-v1alpha1-moedeployment";

struct WebhookOptions {
  std::string addr;  // --webhook-addr: host:port or :port; "" or "0" = off
  std::string operator_namespace = "moeserve-system";
  std::string service = "moeserve-webhook";     // --webhook-service
  std::string secret = "moeserve-webhook-tls";  // --webhook-secret
  std::string config = "moeserve-quota";        // --webhook-config
  bool manage_certs = true;                     // --webhook-manage-certs
  std::chrono::seconds cert_lifetime{std::chrono::hours(24 * 365)};
  std::chrono::milliseconds check_interval{std::chrono::seconds(10)};
  // The hook keys' Vault prefix (--hook-vault-prefix, canonical): the
  // webhook refuses a MoEDeployment naming a path under it.
  std::string reserved_vault_prefix;
  // The role hook keys are read with (--hook-vault-role): no MoEDeployment's spec.vault.role.
  std::string reserved_vault_role;
  // Writes the Secret. Any replica may make or renew it, so this client has
  // no leader write fence; null: the operator's client.
  KubeClient* cert_client = nullptr;
};

class WebhookController {
 public:
  WebhookController(KubeClient& client, WebhookOptions options, WebhookServer::Handler handler);
  ~WebhookController();

  // Binds the listener and starts the certificate loop. Connections are
  // served once a certificate is loaded.
  Status Start();
  void Stop();
  void SetLeading(bool leading);
  int port() const { return port_; }
  std::string ServedCertificate() const { return server_.CertificatePem(); }

 private:
  void Loop();
  // One pass of steps 1-3.
  Status Sync();
  Result<json> EnsureSecret();
  Status PatchCaBundle(const std::string& ca_pem);

  KubeClient& client_;
  WebhookOptions options_;
  WebhookServer server_;
  int port_ = -1;
  std::atomic<bool> leading_{false};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace moeserve::op
