// The MoEDeployment kind: its spec as the operator reads it, and the children
// it wants (pure functions of the object, so tests can read them directly).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "moeserve/common/base64.hpp"
#include "moeserve/common/status.hpp"
#include "moeserve/operator/kube_client.hpp"

namespace moeserve::op {

inline constexpr char kFinalizer[] = "moeserve.io/cleanup";
inline constexpr char kConfigHashAnnotation[] = "moeserve.io/config-hash";
inline constexpr char kReplicaLabel[] = "moeserve.io/replica";
inline constexpr char kManagedBy[] = "moe-operator";
// Where the daemon's pod finds things.
inline constexpr char kConfigDir[] = "/etc/moeserve/config";
inline constexpr char kSecretsDir[] = "/etc/moeserve/secrets";
inline constexpr char kCacheDir[] = "/var/cache/moeserve";

// Where a secret comes from: exactly one of a Vault path or a Secret's name.
struct SecretReference {
  std::string vault_path;
  std::string secret_name;
  bool empty() const { return vault_path.empty() && secret_name.empty(); }
};

struct MoEDeploymentSpec {
  std::string image;
  std::string model_uri, model_revision, model_endpoint;
  SecretReference model_credentials;
  std::string vault_role, vault_service_account;
  int64_t max_context_tokens = 131072;
  std::string default_tier = "medium";
  json thinking_budgets = json::object();
  int nodes_per_replica = 1;
  int gpus_per_node = 8;
  int replicas = 1;
  json resources = json::object(), node_selector, tolerations, affinity;
  std::string cache_host_path = "/var/lib/moeserve/cache";
  int64_t cache_size_gi = 0;
  int port = 8000;
  SecretReference api_keys;
  std::string tls_secret;
  std::string quota_policy;
  int max_unavailable_replicas = 1;

  int LocalRanks() const { return gpus_per_node > 0 ? gpus_per_node : 1; }
};

// Reads spec (after the CRD's defaults); an error names the field.
Result<MoEDeploymentSpec> ParseMoEDeploymentSpec(const json& spec);

namespace desired {
// app.kubernetes.io/{name,instance,managed-by,component}
json Labels(const json& md, const std::string& component);
json OwnerReference(const json& md);
std::string GroupName(const json& md, int replica);  // <name>-r<replica>
std::string ConfigMapName(const json& md);            // <name>-config
std::string SecretName(const json& md);               // <name>-secrets
std::string Endpoint(const json& md, const MoEDeploymentSpec& spec);
// A display path for a revision in the cache (the puller keys its own
// entries by a hash of the URI and revision; see model-source.yaml).
std::string ModelDirectory(const MoEDeploymentSpec& spec);

json ConfigMap(const json& md, const MoEDeploymentSpec& spec);
json Secret(const json& md, const std::map<std::string, std::string>& data);
json GroupService(const json& md, const MoEDeploymentSpec& spec, int replica);
json StatefulSet(const json& md, const MoEDeploymentSpec& spec, int replica, const std::string& config_hash);
json PodDisruptionBudget(const json& md, const MoEDeploymentSpec& spec, int replica);
json EndpointService(const json& md, const MoEDeploymentSpec& spec);
std::string ConfigHash(const json& config_map, const json& secret);
}  // namespace desired

// True when every field of `want` is in `have` with the same value (lists
// element by element): fields the server added (defaults, clusterIP,
// status) do not count as differences.
bool Contains(const json& have, const json& want);


}  // namespace moeserve::op
