// The MoEDeployment kind: its spec as the operator reads it, and the children
// it wants (pure functions of the object, so tests can read them directly).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "moeserve/common/base64.hpp"
#include "moeserve/common/status.hpp"
#include "moeserve/operator/autoscaling.hpp"
#include "moeserve/operator/kube_client.hpp"
#include "moeserve/operator/scheduling_policy.hpp"

namespace moeserve::op {

inline constexpr char kFinalizer[] = "moeserve.io/cleanup";
inline constexpr char kConfigHashAnnotation[] = "moeserve.io/config-hash";
inline constexpr char kReplicaLabel[] = "moeserve.io/replica";
inline constexpr char kManagedBy[] = "moe-operator";
// Only Secrets with this label may be named by a MoEDeployment (secretRef, TLS).
inline constexpr char kUsableLabel[] = "moeserve.io/usable";
// Labels on the cluster-scoped PersistentVolume, which cannot carry an owner
// reference to a namespaced MoEDeployment.
inline constexpr char kOwnerNamespaceLabel[] = "moeserve.io/owner-namespace";
inline constexpr char kOwnerNameLabel[] = "moeserve.io/owner-name";
// On objects kept for a MoEDeployment outside its namespace (its admin key's
// Secret in the operator's namespace): the deployment's uid, so that a
// deployment deleted and made again under the same name never inherits one.
inline constexpr char kOwnerUidLabel[] = "moeserve.io/owner-uid";
// The storage class of the cache volumes: no provisioner has it, so only the
// claim each volume is bound to in advance can ever use it.
inline constexpr char kCacheStorageClass[] = "moeserve-node-cache";
// Where the daemon's pod finds things.
inline constexpr char kConfigDir[] = "/etc/moeserve/config";
inline constexpr char kSecretsDir[] = "/etc/moeserve/secrets";
inline constexpr char kCacheDir[] = "/var/cache/moeserve";
inline constexpr char kTmpDir[] = "/tmp";
// The daemon's durable state (its usage ledger), on a per-pod
// PersistentVolumeClaim when spec.state is set.
inline constexpr char kStateDir[] = "/var/lib/moeserve";
// The prefix cache's tier on disk (the daemon's prefix_disk_dir), on a
// per-pod emptyDir when spec.prefixDisk is set: node-local, sized by the
// spec, gone with the pod. Its place is fixed here, never a tenant's field.
inline constexpr char kPrefixDiskDir[] = "/var/cache/moeserve-prefix";
// The share of spec.prefixDisk.sizeGi the daemon's files may take
// (prefix_disk_bytes): the rest is room for the file being written and the
// filesystem's own blocks, so the emptyDir's sizeLimit (which evicts the
// pod when passed) is never reached.
inline constexpr int64_t kPrefixDiskSharePercent = 90;
inline constexpr int64_t kPrefixDiskMaxGi = 65536;
inline constexpr int64_t kPrefixDiskMaxAgeSeconds = 31536000;
// ConfigMap <policy>-budget's spend.json, mounted (optional) for a daemon that starts.
inline constexpr char kBudgetDir[] = "/etc/moeserve/budget";
// The operator's admin key: plain text only in the operator's own namespace
// (desired::AdminSecret); the tenant's namespace holds its SHA-256 alone,
// in api-keys.yaml, which is all the daemon needs to verify it.
inline constexpr char kAdminKeyKey[] = "admin-key";
// Keys of the deployment's Secret.
inline constexpr char kMetricsTokenKey[] = "metrics-token";
// The expert-parallel group's shared secret: it authenticates the ranks to
// rank 0's rendezvous store (mounted only in multi-node groups).
inline constexpr char kGroupSecretKey[] = "group-secret";
// Rank 0's rendezvous store; the collectives themselves use ports the
// ranks pick and publish there, so the NetworkPolicy opens every port
// between a group's own pods.
inline constexpr int kRendezvousPort = 29400;
inline constexpr char kApiKeysKey[] = "api-keys.yaml";
inline constexpr char kTlsCertKey[] = "tls.crt";
inline constexpr char kTlsKeyKey[] = "tls.key";
inline constexpr char kObjectStorePrefix[] = "object-store.";
// The daemon's tenant for the operator's own admin key.
inline constexpr char kAdminTenant[] = "moeserve-admin";

// The GPU vendors the platform knows (the default toleration allow-list's
// keys): each one's device resource, which is also the taint its GPU nodes
// carry, and the variable its container runtime reads to pick the devices a
// container sees, with the value that shows none. A pod that requests no
// device gets every one of these pinned, so an image whose ENV says `all`
// opens nothing.
struct GpuVendor {
  const char* resource;
  const char* visible_devices_env;
  const char* none;
};
inline constexpr GpuVendor kGpuVendors[] = {
    // nvidia-container-runtime: "void" exposes neither GPUs nor driver
    // capabilities (as runc would).
    {"nvidia.com/gpu", "NVIDIA_VISIBLE_DEVICES", "void"},
    // amd-container-runtime: an empty list injects no GPU.
    {"amd.com/gpu", "AMD_VISIBLE_DEVICES", ""},
};
// Whether a toleration key is a known GPU vendor's taint.
bool GpuTaintKey(const std::string& key);

// What the platform decides, never a tenant: operator flags.
struct PlatformConfig {
  // Runs `moe-daemon pull` in each pod's init container: the only writer of the cache.
  std::string daemon_image = "moeserve/moe-daemon:0.1.0";
  // The node cache root on every node. Each namespace gets
  // <cache_root>/namespaces/<ns> unless shared_cache, when all use the root.
  std::string cache_root = "/var/cache/moeserve";
  bool shared_cache = false;
  // Capacity recorded on each cache volume and claim (hostPath does not
  // enforce it; spec.cache.sizeLimitGi bounds what the puller keeps).
  int64_t cache_capacity_gi = 16384;
  // moe-operator --cache-storage-class: the cache claims ask this storage
  // class for their volume (a provisioner's, or volumes made in advance with
  // it), and the operator makes and deletes no PersistentVolume, so it needs
  // no cluster-wide grant on them. "": the operator makes a hostPath volume
  // per MoEDeployment at cache_root.
  std::string cache_storage_class;
  // The daemon's user and group; never root.
  int64_t run_as_user = 65532;
  // Requests and limits a container gets where the spec sets none.
  std::string default_cpu = "1", default_memory = "4Gi";
  std::string puller_cpu = "1", puller_memory = "1Gi";
  // Which nodeSelector keys, toleration keys and affinity a tenant may set.
  SchedulingPolicy scheduling;
};

// Where a secret comes from: exactly one of a Vault path or a Secret's name.
struct SecretReference {
  std::string vault_path;  // the API path after /v1/ (KV v2: <mount>/data/<name>)
  std::string vault_role;  // spec.vault.role for a Vault path; "" = the namespace's name
  std::string secret_name;
  bool empty() const { return vault_path.empty() && secret_name.empty(); }
  bool operator==(const SecretReference&) const = default;
};

struct MoEDeploymentSpec {
  std::string image;
  std::string model_uri, model_revision, model_endpoint;
  SecretReference model_credentials;
  // spec.vault.role; "" = the namespace's name. The service account that
  // logs in is platform configuration (moe-operator --vault-service-account).
  std::string vault_role;
  int64_t max_context_tokens = 131072;
  std::string default_tier = "medium";
  json thinking_budgets = json::object();
  int nodes_per_replica = 1;
  int gpus_per_node = 8;
  int replicas = 1;
  json resources = json::object(), node_selector, tolerations, affinity;
  int64_t cache_size_gi = 0;
  // spec.state: a per-pod volume (StatefulSet volumeClaimTemplates) for the
  // daemon's usage ledger, so a restarted or replaced pod keeps its usage.
  // 0: none (the ledger is then in memory). Fixed once the groups exist: a
  // StatefulSet's claim templates cannot change.
  int64_t state_size_gi = 0;
  std::string state_storage_class;  // "": the cluster's default class
  // spec.prefixDisk: the prefix cache's tier on disk, an emptyDir of this
  // many GiB at kPrefixDiskDir (0: off), and the age past which its unused
  // files are deleted (0: no bound by age).
  int64_t prefix_disk_size_gi = 0;
  int64_t prefix_disk_max_age_seconds = 0;
  int port = 8000;
  SecretReference api_keys;
  std::string tls_secret;
  std::string quota_policy;
  int max_unavailable_replicas = 1;
  // spec.autoscaling: the operator writes spec.replicas (scale subresource) when enabled.
  AutoscalingSpec autoscaling;
  // Not a field of the object: the QuotaPolicy that governs it (the
  // reference, else the namespace's `default`), filled in by the reconciler,
  // whose prices and budgets its daemons enforce against the global spend
  // the operator hands back (usage_sync.hpp).
  struct Budgeting {
    std::string policy;  // "": ungoverned, the daemons keep no budgets
    json pricing, budgets;  // the policy's spec.pricing and spec.budgets (null when unset)
    bool operator==(const Budgeting&) const = default;
  } budgeting;

  int LocalRanks() const { return gpus_per_node > 0 ? gpus_per_node : 1; }
  // Field by field: two specs that mean the same (operator.crd_bounds holds
  // an absent field to the CRD's default with it).
  bool operator==(const MoEDeploymentSpec&) const = default;
};

// Reads spec (after the CRD's defaults); an error names the field. Fields
// that are platform configuration (spec.cache.hostPath, stored before the
// schema dropped it) are refused, never obeyed, and so is any resource in
// spec.resources but cpu, memory and ephemeral-storage: GPUs (and every
// other device or extended resource) come only from
// parallelism.gpusPerNode, which quota counts.
Result<MoEDeploymentSpec> ParseMoEDeploymentSpec(const json& spec);

// The resource names a tenant may request or limit in spec.resources.
bool TenantResourceName(const std::string& name);

namespace desired {
// app.kubernetes.io/{name,instance,managed-by,component}
json Labels(const json& md, const std::string& component);
json OwnerReference(const json& md);
std::string GroupName(const json& md, int replica);  // <name>-r<replica>
// The replica name session ids carry (daemon session_replica): r<replica>.
std::string SessionReplicaName(int replica);
std::string ConfigMapName(const json& md);            // <name>-config
std::string SecretName(const json& md);               // <name>-secrets
// The Secret holding the operator's admin key for `md`, in the operator's
// namespace: moeserve-admin.<namespace>.<name> (a digest when too long).
std::string AdminSecretName(const json& md);
std::string CacheClaimName(const json& md);           // <name>-cache
// Cluster-scoped: moeserve-cache-<namespace>-<name>, or a digest when that is too long.
std::string CacheVolumeName(const json& md);
// Where the cache volume lies on each node.
std::string CacheHostPath(const json& md, const PlatformConfig& platform);
std::string Endpoint(const json& md, const MoEDeploymentSpec& spec);
// The verified model in the pod's cache mount, where `moe-daemon pull` puts
// it: models/<ModelCacheKey(uri, revision)> (common/model_cache_key.hpp, the
// one function both sides call).
std::string ModelDirectory(const MoEDeploymentSpec& spec);

json ConfigMap(const json& md, const MoEDeploymentSpec& spec);
json Secret(const json& md, const std::map<std::string, std::string>& data);
// The admin key's Secret in `operator_namespace`. No owner reference (none
// crosses namespaces): labelled with the deployment's namespace, name and
// uid, and deleted under its finalizer.
json AdminSecret(const json& md, const std::string& operator_namespace, const std::string& admin_key);
json GroupService(const json& md, const MoEDeploymentSpec& spec, int replica);
// The serving container's requests and limits: spec.resources with the
// platform's defaults, plus parallelism.gpusPerNode as nvidia.com/gpu. The
// one place a pod's resources are decided: StatefulSet renders it and quota
// (DemandOf) counts it, so the two cannot drift apart.
json ServerResources(const MoEDeploymentSpec& spec, const PlatformConfig& platform = {});
// Device units (every resource but cpu, memory and ephemeral-storage) a
// container's requests/limits ask for: per name the larger of the two
// sides, summed. A quantity that is not a whole number counts as more than
// any quota allows (devices are whole; the renderer writes integers).
int64_t DeviceUnits(const json& resources);
// Pods meet the `restricted` Pod Security Standard: non-root, no privilege
// escalation, every capability dropped, seccomp RuntimeDefault, read-only
// root filesystem (writable emptyDirs where needed), no service-account
// token, requests and limits on every container, and only configMap,
// secret, emptyDir and persistentVolumeClaim volumes. The init container
// (the platform's image) pulls and verifies the weights into the cache; the
// serving container (the tenant's image) mounts the cache read-only.
json StatefulSet(const json& md, const MoEDeploymentSpec& spec, int replica, const std::string& config_hash,
                 const PlatformConfig& platform = {});
// The node cache as a claim bound in advance to a volume made for it alone.
json CacheVolume(const json& md, const PlatformConfig& platform);
json CacheClaim(const json& md, const PlatformConfig& platform);
json PodDisruptionBudget(const json& md, const MoEDeploymentSpec& spec, int replica);
// Multi-node groups: only the group's own pods reach its pods beyond the
// API port (rendezvous and collectives); the API port stays open.
json NetworkPolicy(const json& md, const MoEDeploymentSpec& spec, int replica);
json EndpointService(const json& md, const MoEDeploymentSpec& spec);
std::string ConfigHash(const json& config_map, const json& secret);
}  // namespace desired

// Whether `secret` is the admin key's Secret the operator made for this very
// deployment (namespace, name and uid labels all match).
bool IsAdminSecretOf(const json& secret, const json& md);

// True when every field of `want` is in `have` with the same value (lists
// element by element): fields the server added (defaults, clusterIP,
// status) do not count as differences.
bool Contains(const json& have, const json& want);


}  // namespace moeserve::op
