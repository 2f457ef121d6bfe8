// The MoEDeployment reconciler, kubebuilder style: it reads desired state,
// compares it with what the caches hold, acts, and reports status. It keeps
// nothing between reconciles that the API server does not hold, and a
// reconcile with nothing to change writes nothing.
//
// Three interfaces let other sources and policies plug in without touching
// the reconcile loop: SecretSource (where referenced secrets are read: a
// Secret, or Vault), CleanupHook (work to do under the finalizer before the
// object goes, such as revoking the Vault token a secret source logged in
// with) and QuotaCheck (whether a deployment is admitted; moe-operator
// passes DecideQuota over its caches, the function its webhook uses; unset,
// every deployment is admitted). A deployment not admitted is held: it keeps
// the groups it has, gets no new ones, rolls none, and reports
// QuotaAdmitted=False and phase QuotaExceeded; one forbidden (an image or
// GPU-node tolerations its policy does not allow) runs no group at all.
//
// Thread safety: Reconcile may run on several workers at once for different
// keys; the work queue never hands one key to two workers.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "moeserve/operator/events.hpp"
#include "moeserve/operator/informer.hpp"
#include "moeserve/operator/kube_client.hpp"
#include "moeserve/operator/moedeployment.hpp"

namespace moeserve::op {

struct ReconcileResult {
  std::chrono::milliseconds requeue_after{0};  // 0: only when something changes
};

class Reconciler {
 public:
  virtual ~Reconciler() = default;
  virtual Result<ReconcileResult> Reconcile(const std::string& key) = 0;
};

// Resolves a SecretReference to key -> value. The default reads Kubernetes
// Secrets (secretRef) and fails a Vault path with kUnavailable (reported as
// SecretsSynced=False, reason VaultUnavailable); moe-operator with a Vault
// address routes Vault paths to VaultSecretSource (vault_secret_source.hpp).
// Errors: kPermissionDenied when the platform does not allow the reference
// (a Secret without moeserve.io/usable=true), kNotFound when it is missing,
// kUnavailable when the source cannot be reached. Messages name the
// reference, never a value.
class SecretSource {
 public:
  virtual ~SecretSource() = default;
  virtual Result<std::map<std::string, std::string>> Fetch(const std::string& ns, const SecretReference& ref) = 0;
};

class KubernetesSecretSource : public SecretSource {
 public:
  explicit KubernetesSecretSource(KubeClient& client) : client_(client) {}
  Result<std::map<std::string, std::string>> Fetch(const std::string& ns, const SecretReference& ref) override;

 private:
  KubeClient& client_;
};

// Runs under the finalizer before a MoEDeployment goes away.
class CleanupHook {
 public:
  virtual ~CleanupHook() = default;
  virtual Status Cleanup(const json& moedeployment) = 0;
};

struct QuotaDecision {
  bool admitted = true;
  std::string reason = "NoQuotaEnforcement";
  std::string message = "quota enforcement is not enabled in this operator";
  // Not admitted for what may not run at all (an image outside
  // limits.allowedImages, GPU-node tolerations without GPUs), as opposed to
  // a sum past a limit: the reconciler then runs no group, not even the
  // ones it has (a policy tightened takes effect).
  bool forbidden = false;
};
using QuotaCheck = std::function<QuotaDecision(const json& moedeployment, const MoEDeploymentSpec& spec)>;

// The informers' caches the reconciler reads (and writes through after its own writes).
struct ReconcilerCaches {
  ObjectCache* moedeployments = nullptr;
  ObjectCache* statefulsets = nullptr;
  ObjectCache* services = nullptr;
  ObjectCache* configmaps = nullptr;
  // The deployments' own Secrets as last read or written (no informer: the
  // operator may not list or watch Secrets).
  ObjectCache* secrets = nullptr;
  ObjectCache* pdbs = nullptr;
  ObjectCache* claims = nullptr;   // PersistentVolumeClaims
  ObjectCache* volumes = nullptr;  // PersistentVolumes (cluster-scoped)
  ObjectCache* networkpolicies = nullptr;  // multi-node groups' NetworkPolicies (null: not managed)
};

struct MoEDeploymentReconcilerOptions {
  SecretSource* secret_source = nullptr;  // default: KubernetesSecretSource
  CleanupHook* cleanup = nullptr;         // default: nothing to clean up
  QuotaCheck quota;                       // unset: admitted
  // The governing QuotaPolicy's budgeting for a deployment (moe-operator:
  // from its QuotaPolicy cache); unset: no budgets in the daemons' config.
  std::function<MoEDeploymentSpec::Budgeting(const json& moedeployment)> budgeting;
  PlatformConfig platform;                // daemon image, node cache, pod defaults
  // Whether a deployment may name a Vault path in `field`
  // (spec.model.credentials.vault.path, spec.endpoint.apiKeys.vault.path);
  // a refused path is never read (SecretsSynced=False, reason
  // VaultPathNotAllowed). moe-operator: CheckDeploymentVaultPath over its
  // QuotaPolicy cache and --hook-vault-prefix (vault_paths.hpp). Unset:
  // Vault's own policies alone decide.
  std::function<Status(const json& moedeployment, const std::string& field, const std::string& path)> vault_path_allowed;
  // The operator's own namespace (moe-operator --operator-namespace): where
  // each deployment's admin key is kept in plain text, out of its tenants'
  // reach (desired::AdminSecret).
  std::string operator_namespace = "moeserve-system";
  // Secrets are not watched (referenced ones, and the deployment's own,
  // which is read back and put right): every deployment is reconciled again
  // this often.
  std::chrono::milliseconds secret_resync{std::chrono::seconds(60)};
  // Vault paths are read again this often (moe-operator --vault-resync-seconds).
  std::chrono::milliseconds vault_resync{std::chrono::seconds(60)};
};

class MoEDeploymentReconciler : public Reconciler {
 public:
  MoEDeploymentReconciler(KubeClient& client, ReconcilerCaches caches, EventRecorder* events,
                          MoEDeploymentReconcilerOptions options = {});
  Result<ReconcileResult> Reconcile(const std::string& key) override;

  // Whether a StatefulSet's pods all run its current template and are ready.
  static bool GroupReady(const json& statefulset);

 private:
  struct Rollout {
    int groups = 0;
    int ready = 0;    // up to date and ready
    int updated = 0;  // running the current template
    int existing = 0;
  };
  struct SecretsState {
    bool synced = true;
    // A failure that may pass (missing, unreachable, malformed): keep the
    // last good Secret. A refusal (not usable) drops what was refused.
    bool keep_last_good = false;
    // What decides api-keys.yaml where the rest of the last good Secret is
    // kept, so that a revoked key never outlives its removal:
    //  kFresh: data[api-keys.yaml] holds (the keys read now, or no tenant
    //          keys at all: no reference, or its Secret or Vault secret is
    //          gone, 404);
    //  kMalformed: the keys were read but refused; the last good file keeps
    //          only the entries the current keys still hold (keys_held);
    //  kUnreachable: the keys could not be read (Vault sealed, the API
    //          server failing); the last good file's tenant entries stay.
    // The admin entry is always the current admin key's.
    enum class Keys { kFresh, kMalformed, kUnreachable } keys = Keys::kFresh;
    std::set<std::pair<std::string, std::string>> keys_held;  // (tenant, sha256) of the current keys
    std::string reason = "Synced", message;
    std::map<std::string, std::string> data;
  };

  Result<ReconcileResult> Finalize(json md);
  Status EnsureFinalizer(json& md);
  // The deployment's own Secret, read live (the operator holds no list or
  // watch on Secrets; caches_.secrets keeps what was last read or written).
  Result<std::optional<json>> OwnSecret(const json& md);
  // The admin key (AdminKey), and the metrics token and group secret read
  // back from the deployment's Secret, generated only when it has none.
  Result<std::map<std::string, std::string>> OperatorKeys(const json& md, const std::optional<json>& secret);
  // The admin key, read back from its Secret in the operator's namespace;
  // generated (and that Secret written) only when there is none for this
  // deployment's uid. Tenants see its hash alone.
  Result<std::string> AdminKey(const json& md);
  Status DeleteAdminSecret(const json& md);
  SecretsState GatherSecrets(const json& md, const MoEDeploymentSpec& spec,
                             const std::map<std::string, std::string>& operator_keys);
  // The cache volume and its claim: created when missing, never updated
  // (their specs are immutable); a released volume is replaced.
  Status EnsureCache(const json& md);
  Status DeleteCacheVolume(const json& md);
  // Deletes the group's pods that the StatefulSet owns, each with uid and
  // resourceVersion preconditions.
  Status DeleteGroupPods(const json& md, const json& statefulset, int replica);
  // Creates `want` or updates the existing object until it contains `want`.
  Result<json> Apply(const ResourceRef& ref, ObjectCache* cache, const json& md, const json& want);
  Result<Rollout> RollOut(const json& md, const MoEDeploymentSpec& spec, const std::string& config_hash);
  Status RemoveSurplusGroups(const json& md, const MoEDeploymentSpec& spec);
  Status WriteStatus(json& md, const MoEDeploymentSpec* spec, const Rollout& rollout, const SecretsState& secrets,
                     const QuotaDecision& quota, const std::string& failure);

  KubeClient& client_;
  ReconcilerCaches caches_;
  EventRecorder* events_;
  MoEDeploymentReconcilerOptions options_;
  std::unique_ptr<SecretSource> default_secret_source_;
};

}  // namespace moeserve::op
