#include "moeserve/operator/moedeployment.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <string_view>

#include "moeserve/common/model_cache_key.hpp"
#include "moeserve/common/sha256.hpp"

namespace moeserve::op {
namespace {

SecretReference ReadSecretReference(const json& j) {
  SecretReference ref;
  if (!j.is_object()) return ref;
  if (j.contains("vault")) ref.vault_path = j["vault"].value("path", "");
  if (j.contains("secretRef")) ref.secret_name = j["secretRef"].value("name", "");
  return ref;
}

// The spec's bounds and defaults are the CRD's (crds/moeserve.io_moedeployments.yaml);
// the API server applies them to what it admits, and the parser applies them
// again, so an object stored before a bound existed, or a spec from elsewhere
// (the webhook's, a test's), means the same. operator.crd_bounds walks the
// schema and holds every default, minimum, maximum and enum to these reads.
constexpr int64_t kNoUpperBound = std::numeric_limits<int64_t>::max();

// An integer field of `object`: absent (or null) gives `fallback`; present
// must be an integer in [lo, hi]. Errors name `field`.
Result<int64_t> IntegerField(const json& object, const char* key, const std::string& field, int64_t fallback,
                             int64_t lo, int64_t hi = kNoUpperBound) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return fallback;
  const json& v = object[key];
  if (!v.is_number_integer()) return Fail(Error::InvalidArgument(field + ": must be an integer (got " + v.dump() + ")"));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return Fail(Error::InvalidArgument(field + ": must be at most " + std::to_string(hi) + " (got " + v.dump() + ")"));
  const int64_t n = v.get<int64_t>();
  if (n < lo) return Fail(Error::InvalidArgument(field + ": must be >= " + std::to_string(lo) + " (got " + v.dump() + ")"));
  if (n > hi)
    return Fail(Error::InvalidArgument(field + ": must be at most " + std::to_string(hi) + " (got " + v.dump() + ")"));
  return n;
}

// A field held in an int (the CRD's int32 fields): as IntegerField, at most INT32_MAX.
// A nested object of the spec: absent or null gives {}; any other type is
// refused naming the field (never read as absent).
Result<json> ObjectField(const json& object, const char* key, const std::string& field) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return json::object();
  if (!object[key].is_object()) return Fail(Error::InvalidArgument(field + ": must be an object"));
  return object[key];
}

Result<int> IntField(const json& object, const char* key, const std::string& field, int fallback, int64_t lo,
                     int64_t hi = std::numeric_limits<int32_t>::max()) {
  MOE_ASSIGN_OR_RETURN(const int64_t n, IntegerField(object, key, field, fallback, lo, hi));
  return static_cast<int>(n);
}

// A string field whose value must be one of `allowed`; absent gives `fallback`.
Result<std::string> EnumField(const json& object, const char* key, const std::string& field,
                              const std::string& fallback, std::initializer_list<std::string_view> allowed) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return fallback;
  const json& v = object[key];
  std::string list;
  for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  if (v.is_string() && std::find(allowed.begin(), allowed.end(), v.get<std::string>()) != allowed.end())
    return v.get<std::string>();
  return Fail(Error::InvalidArgument(field + ": must be one of " + list + " (got " +
                                     v.dump(-1, ' ', false, json::error_handler_t::replace) + ")"));
}

// spec.engine.thinking.budgets: absent stays absent (the model's config.json
// values apply); present, each tier is a count >= 0, a missing one its default.
Result<json> ThinkingBudgets(const json& thinking) {
  if (!thinking.is_object() || !thinking.contains("budgets") || thinking["budgets"].is_null()) return json::object();
  const json& budgets = thinking["budgets"];
  if (!budgets.is_object())
    return Fail(Error::InvalidArgument("spec.engine.thinking.budgets: must be an object"));
  json out = json::object();
  struct Tier {
    const char* name;
    int64_t fallback;
  };
  for (const Tier& t : {Tier{"low", 256}, Tier{"medium", 2048}, Tier{"high", 16384}}) {
    MOE_ASSIGN_OR_RETURN(out[t.name], IntegerField(budgets, t.name, std::string("spec.engine.thinking.budgets.") + t.name,
                                                   t.fallback, 0));
  }
  return out;
}

// JSON-path text for a resource name, as kubectl prints map keys: limits["nvidia.com/gpu"].
std::string ResourceField(const std::string& side, const std::string& name) {
  return "spec.resources." + side + "[" + json(name).dump(-1, ' ', false, json::error_handler_t::replace) + "]";
}

// spec.resources as a container takes it, restricted to what a tenant may
// ask for. Anything else could reach a device quota never counts: an
// extended resource (nvidia.com/gpu, amd.com/gpu, nvidia.com/mig-*) or a
// dynamic resource claim.
Status CheckTenantResources(const json& resources) {
  if (resources.is_null()) return Ok();
  if (!resources.is_object()) return Fail(Error::InvalidArgument("spec.resources: not an object"));
  for (const auto& [side, names] : resources.items()) {
    if (side != "requests" && side != "limits")
      return Fail(Error::InvalidArgument("spec.resources." + side +
                                         ": not allowed; spec.resources may hold only requests and limits"));
    if (names.is_null()) continue;
    if (!names.is_object()) return Fail(Error::InvalidArgument("spec.resources." + side + ": not an object"));
    for (const auto& [name, quantity] : names.items()) {
      if (!TenantResourceName(name))
        return Fail(Error::InvalidArgument(
            ResourceField(side, name) +
            ": not allowed; spec.resources may name cpu, memory and ephemeral-storage only (GPUs come from "
            "spec.parallelism.gpusPerNode, which the QuotaPolicy counts)"));
      if (!quantity.is_string() && !quantity.is_number())
        return Fail(Error::InvalidArgument(ResourceField(side, name) + ": not a quantity"));
    }
  }
  return Ok();
}

}  // namespace

bool GpuTaintKey(const std::string& key) {
  for (const auto& vendor : kGpuVendors)
    if (key == vendor.resource) return true;
  return false;
}

bool TenantResourceName(const std::string& name) {
  return name == "cpu" || name == "memory" || name == "ephemeral-storage";
}

Result<MoEDeploymentSpec> ParseMoEDeploymentSpec(const json& spec) {
  if (!spec.is_object()) return Fail(Error::InvalidArgument("spec: missing"));
  MoEDeploymentSpec s;
  try {
    s.image = spec.value("image", "");
    if (s.image.empty()) return Fail(Error::InvalidArgument("spec.image: required"));
    const json model = spec.value("model", json::object());
    s.model_uri = model.value("uri", "");
    if (s.model_uri.empty()) return Fail(Error::InvalidArgument("spec.model.uri: required"));
    s.model_revision = model.value("revision", "latest");
    s.model_endpoint = model.value("endpoint", "");
    s.model_credentials = ReadSecretReference(model.value("credentials", json::object()));
    const json vault = spec.value("vault", json::object());
    s.vault_role = vault.value("role", "");
    s.model_credentials.vault_role = s.vault_role;
    MOE_ASSIGN_OR_RETURN(const json engine, ObjectField(spec, "engine", "spec.engine"));
    MOE_ASSIGN_OR_RETURN(s.max_context_tokens,
                         IntegerField(engine, "maxContextTokens", "spec.engine.maxContextTokens", 131072, 1024));
    MOE_ASSIGN_OR_RETURN(const json thinking, ObjectField(engine, "thinking", "spec.engine.thinking"));
    MOE_ASSIGN_OR_RETURN(s.default_tier, EnumField(thinking, "defaultTier", "spec.engine.thinking.defaultTier",
                                                   "medium", {"low", "medium", "high"}));
    MOE_ASSIGN_OR_RETURN(s.thinking_budgets, ThinkingBudgets(thinking));
    MOE_ASSIGN_OR_RETURN(const json par, ObjectField(spec, "parallelism", "spec.parallelism"));
    MOE_ASSIGN_OR_RETURN(s.nodes_per_replica,
                         IntField(par, "nodesPerReplica", "spec.parallelism.nodesPerReplica", 1, 1, 64));
    MOE_ASSIGN_OR_RETURN(s.gpus_per_node, IntField(par, "gpusPerNode", "spec.parallelism.gpusPerNode", 8, 0, 16));
    MOE_ASSIGN_OR_RETURN(s.replicas, IntField(spec, "replicas", "spec.replicas", 1, 0));
    s.resources = spec.value("resources", json::object());
    s.node_selector = spec.value("nodeSelector", json());
    s.tolerations = spec.value("tolerations", json());
    s.affinity = spec.value("affinity", json());
    MOE_ASSIGN_OR_RETURN(const json cache, ObjectField(spec, "cache", "spec.cache"));
    // A tenant never chooses a path on the node: the CRD no longer has the
    // field, and an object stored before it lost it is refused here.
    if (cache.is_object() && cache.contains("hostPath"))
      return Fail(Error::InvalidArgument(
          "spec.cache.hostPath: not supported; the node cache location is platform configuration "
          "(moe-operator --cache-root); remove the field and keep only spec.cache.sizeLimitGi"));
    // Absent: 0, no limit.
    MOE_ASSIGN_OR_RETURN(s.cache_size_gi, IntegerField(cache, "sizeLimitGi", "spec.cache.sizeLimitGi", 0, 1));
    if (spec.contains("state")) {
      const json state = spec["state"];
      MOE_ASSIGN_OR_RETURN(s.state_size_gi, IntegerField(state, "sizeGi", "spec.state.sizeGi", 1, 1));
      s.state_storage_class = state.value("storageClassName", "");
    }
    if (spec.contains("prefixDisk") && !spec["prefixDisk"].is_null()) {
      MOE_ASSIGN_OR_RETURN(const json disk, ObjectField(spec, "prefixDisk", "spec.prefixDisk"));
      // Where the files go is the operator's: an emptyDir at kPrefixDiskDir.
      // A path or a volume kind (hostPath, a claim) would let a tenant reach
      // the node's disk or another pod's files: refused, never obeyed.
      for (const auto& [key, value] : disk.items())
        if (key != "sizeGi" && key != "maxAgeSeconds")
          return Fail(Error::InvalidArgument(
              "spec.prefixDisk." + key + ": not supported; the prefix cache's files live on an emptyDir the operator "
              "mounts at " + kPrefixDiskDir + " in each pod, so only spec.prefixDisk.sizeGi and "
              "spec.prefixDisk.maxAgeSeconds may be set"));
      if (!disk.contains("sizeGi") || disk["sizeGi"].is_null())
        return Fail(Error::InvalidArgument("spec.prefixDisk.sizeGi: required (the emptyDir's size, in GiB)"));
      MOE_ASSIGN_OR_RETURN(s.prefix_disk_size_gi,
                           IntegerField(disk, "sizeGi", "spec.prefixDisk.sizeGi", 0, 1, kPrefixDiskMaxGi));
      MOE_ASSIGN_OR_RETURN(s.prefix_disk_max_age_seconds,
                           IntegerField(disk, "maxAgeSeconds", "spec.prefixDisk.maxAgeSeconds", 0, 0,
                                        kPrefixDiskMaxAgeSeconds));
    }
    const json endpoint = spec.value("endpoint", json::object());
    MOE_ASSIGN_OR_RETURN(s.port, IntField(endpoint, "port", "spec.endpoint.port", 8000, 1, 65535));
    s.api_keys = ReadSecretReference(endpoint.value("apiKeys", json::object()));
    s.api_keys.vault_role = s.vault_role;
    if (endpoint.contains("tls")) s.tls_secret = endpoint["tls"].value("secretName", "");
    if (spec.contains("quotaPolicyRef")) s.quota_policy = spec["quotaPolicyRef"].value("name", "");
    MOE_ASSIGN_OR_RETURN(s.max_unavailable_replicas,
                         IntField(spec.value("rollout", json::object()), "maxUnavailableReplicas",
                                  "spec.rollout.maxUnavailableReplicas", 1, 1));
  } catch (const json::exception& e) {
    return Fail(Error::InvalidArgument(std::string("spec: ") + e.what()));
  }
  MOE_ASSIGN_OR_RETURN(s.autoscaling, ParseAutoscalingSpec(spec.contains("autoscaling") ? spec["autoscaling"] : json()));
  MOE_TRY(CheckTenantResources(s.resources));
  return s;
}

bool Contains(const json& have, const json& want) {
  if (want.is_object()) {
    if (!have.is_object()) return false;
    for (const auto& [k, v] : want.items()) {
      if (!have.contains(k)) {
        if (v.is_null() || (v.is_object() && v.empty()) || (v.is_array() && v.empty())) continue;
        return false;
      }
      if (!Contains(have[k], v)) return false;
    }
    return true;
  }
  if (want.is_array()) {
    if (!have.is_array() || have.size() != want.size()) return false;
    for (size_t i = 0; i < want.size(); ++i)
      if (!Contains(have[i], want[i])) return false;
    return true;
  }
  return have == want;
}



bool IsAdminSecretOf(const json& secret, const json& md) {
  if (!secret.is_object() || !secret.contains("metadata") || !secret["metadata"].is_object()) return false;
  const json labels = secret["metadata"].value("labels", json::object());
  const std::string uid = md["metadata"].value("uid", "");
  return labels.is_object() && !uid.empty() && labels.value(kOwnerUidLabel, json()) == json(uid) &&
         labels.value(kOwnerNamespaceLabel, json()) == md["metadata"].value("namespace", json()) &&
         labels.value(kOwnerNameLabel, json()) == md["metadata"].value("name", json());
}

namespace desired {

std::string Name(const json& md) { return md["metadata"].value("name", ""); }
std::string Namespace(const json& md) { return md["metadata"].value("namespace", ""); }

json Labels(const json& md, const std::string& component) {
  return {{"app.kubernetes.io/name", "moeserve"},
          {"app.kubernetes.io/instance", Name(md)},
          {"app.kubernetes.io/managed-by", kManagedBy},
          {"app.kubernetes.io/component", component}};
}

json OwnerReference(const json& md) {
  return {{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "MoEDeployment"},
          {"name", Name(md)},                      {"uid", md["metadata"].value("uid", "")},
          {"controller", true},                    {"blockOwnerDeletion", true}};
}

json Metadata(const json& md, const std::string& name, const std::string& component) {
  return {{"name", name},
          {"namespace", Namespace(md)},
          {"labels", Labels(md, component)},
          {"ownerReferences", json::array({OwnerReference(md)})}};
}

std::string GroupName(const json& md, int replica) { return Name(md) + "-r" + std::to_string(replica); }
std::string SessionReplicaName(int replica) { return "r" + std::to_string(replica); }
std::string ConfigMapName(const json& md) { return Name(md) + "-config"; }
std::string SecretName(const json& md) { return Name(md) + "-secrets"; }
std::string CacheClaimName(const json& md) { return Name(md) + "-cache"; }

std::string AdminSecretName(const json& md) {
  // As CacheVolumeName: the first dot after the prefix ends the namespace.
  const std::string readable = "moeserve-admin." + Namespace(md) + "." + Name(md);
  if (readable.size() <= 253) return readable;
  return "moeserve-admin.sha-" + Sha256Hex(Namespace(md) + "/" + Name(md)).substr(0, 40);
}

std::string CacheVolumeName(const json& md) {
  // A namespace has no dots, so the first dot after the prefix ends it: two
  // deployments can never map to one name. Too long: a digest (one dot only).
  const std::string readable = "moeserve-cache." + Namespace(md) + "." + Name(md);
  if (readable.size() <= 253) return readable;
  return "moeserve-cache.sha-" + Sha256Hex(Namespace(md) + "/" + Name(md)).substr(0, 40);
}

std::string CacheHostPath(const json& md, const PlatformConfig& platform) {
  std::string root = platform.cache_root;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  // namespaces/ keeps per-namespace caches apart from a shared cache's own
  // models/, partial/, meta/ and locks/, whatever a namespace is called.
  return platform.shared_cache ? root : root + "/namespaces/" + Namespace(md);
}

std::string ModelDirectory(const MoEDeploymentSpec& spec) {
  return std::string(kCacheDir) + "/models/" + ModelCacheKey(spec.model_uri, spec.model_revision);
}

std::string Endpoint(const json& md, const MoEDeploymentSpec& spec) {
  return std::string(spec.tls_secret.empty() ? "http" : "https") + "://" + Name(md) + "." + Namespace(md) +
         ".svc:" + std::to_string(spec.port) + "/v1";
}

json ConfigMap(const json& md, const MoEDeploymentSpec& spec) {
  // config.yaml is moe-daemon's serve configuration (daemon/config.hpp; it
  // refuses unknown keys, so only keys it knows; tests/e2e parses it with the
  // daemon's own parser). The daemon pulls `model` (a URI) at `model_revision`
  // into the node-local cache before /readyz turns 200. model-source.yaml
  // restates the source for people and tools. JSON is YAML, and nlohmann
  // orders keys, so the same spec gives the same bytes and hash.
  // The daemon serves the directory the init container pulled and verified
  // (it never pulls itself: its cache mount is read-only). Keys are always
  // configured (the operator's admin key at least), so it listens on every
  // address; /metrics wants the metrics token.
  json serve = {
      {"model", ModelDirectory(spec)},
      {"model_revision", spec.model_revision},
      {"api_keys_file", std::string(kSecretsDir) + "/" + kApiKeysKey},
      {"metrics_token_file", std::string(kSecretsDir) + "/" + kMetricsTokenKey},
      {"host", "0.0.0.0"},
      {"port", spec.port},
      {"served_model_name", Name(md)},
      {"max_context", spec.max_context_tokens},
      {"default_reasoning_effort", spec.default_tier},
  };
  json budgets = json::object();
  for (const char* tier : {"low", "medium", "high"})
    if (spec.thinking_budgets.contains(tier)) budgets[tier] = spec.thinking_budgets[tier];
  if (!budgets.empty()) serve["thinking_budgets"] = budgets;
  if (spec.state_size_gi > 0) serve["state_dir"] = kStateDir;  // the usage ledger survives the pod
  if (spec.prefix_disk_size_gi > 0) {  // the prefix cache's tier on the pod's emptyDir
    serve["prefix_disk_dir"] = kPrefixDiskDir;
    serve["prefix_disk_bytes"] = (spec.prefix_disk_size_gi << 30) * kPrefixDiskSharePercent / 100;
    if (spec.prefix_disk_max_age_seconds > 0) serve["prefix_disk_max_age_seconds"] = spec.prefix_disk_max_age_seconds;
  }
  // A server-kept session lives on the replica that created it (its id names
  // the replica, given to each StatefulSet as --session_replica). A turn the
  // Service sends to another replica is forwarded to the owner, whose HTTP
  // server is its group's rank 0, addressed through the group's headless
  // Service. With TLS the peers are reached over https as clients are.
  // With spec.autoscaling the list names every group up to maxReplicas, so
  // that a scaling step leaves the config (and its hash) alone: a step adds
  // or removes one group and never rolls the others.
  const int peer_groups =
      spec.autoscaling.enabled ? std::max(spec.replicas, spec.autoscaling.max_replicas) : spec.replicas;
  if (peer_groups > 1) {
    std::string peers;
    const std::string scheme = spec.tls_secret.empty() ? "http" : "https";
    for (int r = 0; r < peer_groups; ++r) {
      const std::string group = GroupName(md, r);
      if (!peers.empty()) peers += ",";
      peers += SessionReplicaName(r) + "=" + scheme + "://" + group + "-0." + group + "." + Namespace(md) +
               ".svc:" + std::to_string(spec.port);
    }
    serve["session_peers"] = peers;
  }
  if (!spec.budgeting.policy.empty()) {
    // Several replicas share the policy's budgets: the operator sums their
    // usage, fires the hooks and hands the global spend back; a daemon that
    // starts takes the last one recorded from the mounted ConfigMap.
    serve["policy_name"] = spec.budgeting.policy;
    serve["deployment_name"] = Name(md);
    serve["spend_from_operator"] = true;
    serve["global_spend_file"] = std::string(kBudgetDir) + "/spend.json";
    if (!spec.budgeting.pricing.is_null()) serve["pricing"] = spec.budgeting.pricing;
    if (!spec.budgeting.budgets.is_null()) serve["budgets"] = spec.budgeting.budgets;
  }
  if (!spec.tls_secret.empty()) {
    serve["tls_cert_file"] = std::string(kSecretsDir) + "/" + kTlsCertKey;
    serve["tls_key_file"] = std::string(kSecretsDir) + "/" + kTlsKeyKey;
  }
  json source = {{"uri", spec.model_uri},
                 {"revision", spec.model_revision},
                 {"endpoint", spec.model_endpoint},
                 {"directory", ModelDirectory(spec)},
                 {"credentials_prefix", spec.model_credentials.empty() ? "" : kObjectStorePrefix},
                 {"cache", {{"path", kCacheDir}, {"sizeLimitGi", spec.cache_size_gi}}},
                 {"parallelism", {{"nodesPerReplica", spec.nodes_per_replica}, {"gpusPerNode", spec.gpus_per_node}}}};
  if (!spec.quota_policy.empty()) source["quotaPolicy"] = spec.quota_policy;
  json cm = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", Metadata(md, ConfigMapName(md), "config")}};
  cm["data"] = {{"config.yaml", serve.dump(2) + "\n"}, {"model-source.yaml", source.dump(2) + "\n"}};
  return cm;
}

json Secret(const json& md, const std::map<std::string, std::string>& data) {
  json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"type", "Opaque"},
                 {"metadata", Metadata(md, SecretName(md), "secrets")}};
  json encoded = json::object();
  for (const auto& [k, v] : data) encoded[k] = Base64Encode(v);
  secret["data"] = encoded;
  return secret;
}

json AdminSecret(const json& md, const std::string& operator_namespace, const std::string& admin_key) {
  json labels = Labels(md, "admin-key");
  labels[kOwnerNamespaceLabel] = Namespace(md);
  labels[kOwnerNameLabel] = Name(md);
  labels[kOwnerUidLabel] = md["metadata"].value("uid", "");
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"type", "Opaque"},
          {"metadata", {{"name", AdminSecretName(md)}, {"namespace", operator_namespace}, {"labels", labels}}},
          {"data", {{kAdminKeyKey, Base64Encode(admin_key)}}}};
}

json GroupSelector(const json& md, int replica) {
  return {{"app.kubernetes.io/instance", Name(md)},
          {"app.kubernetes.io/component", "daemon"},
          {kReplicaLabel, std::to_string(replica)}};
}

json GroupService(const json& md, const MoEDeploymentSpec& spec, int replica) {
  json meta = Metadata(md, GroupName(md, replica), "discovery");
  meta["labels"][kReplicaLabel] = std::to_string(replica);
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", meta},
          {"spec",
           {{"clusterIP", "None"},
            // Ranks find each other before they are Ready: rendezvous comes first.
            {"publishNotReadyAddresses", true},
            {"selector", GroupSelector(md, replica)},
            {"ports", spec.nodes_per_replica > 1
                          ? json::array({{{"name", "http"}, {"port", spec.port}, {"targetPort", spec.port}},
                                         {{"name", "rendezvous"}, {"port", kRendezvousPort}, {"targetPort", kRendezvousPort}}})
                          : json::array({{{"name", "http"}, {"port", spec.port}, {"targetPort", spec.port}}})}}}};
}

json NetworkPolicy(const json& md, const MoEDeploymentSpec& spec, int replica) {
  json meta = Metadata(md, GroupName(md, replica), "network");
  meta["labels"][kReplicaLabel] = std::to_string(replica);
  const json group = {{"matchLabels", GroupSelector(md, replica)}};
  return {{"apiVersion", "networking.k8s.io/v1"},
          {"kind", "NetworkPolicy"},
          {"metadata", meta},
          {"spec",
           {{"podSelector", group},
            {"policyTypes", json::array({"Ingress"})},
            {"ingress", json::array({
                            // The group's own pods: rendezvous and the collectives' ports.
                            {{"from", json::array({{{"podSelector", group}}})}},
                            // Everyone else: the API (and the probes) only.
                            {{"ports", json::array({{{"port", spec.port}, {"protocol", "TCP"}}})}},
                        })}}}};
}

// Requests and limits as a LimitRange would default them: a side that is
// missing copies the other, and both missing take the platform's value.
json WithDefaultResources(json resources, const std::string& cpu, const std::string& memory) {
  if (!resources.is_object()) resources = json::object();
  for (const char* side : {"requests", "limits"})
    if (!resources.contains(side) || !resources[side].is_object()) resources[side] = json::object();
  for (const auto& [name, fallback] : {std::pair<std::string, std::string>{"cpu", cpu}, {"memory", memory}}) {
    json& requests = resources["requests"];
    json& limits = resources["limits"];
    if (!requests.contains(name) && !limits.contains(name)) requests[name] = limits[name] = fallback;
    else if (!requests.contains(name)) requests[name] = limits[name];
    else if (!limits.contains(name)) limits[name] = requests[name];
  }
  return resources;
}

json ServerResources(const MoEDeploymentSpec& spec, const PlatformConfig& platform) {
  // Only the names a tenant may set are carried over (the parser refuses
  // the rest; this keeps an unchecked spec from adding any either).
  json own = json::object();
  if (spec.resources.is_object())
    for (const char* side : {"requests", "limits"})
      if (spec.resources.contains(side) && spec.resources[side].is_object())
        for (const auto& [name, quantity] : spec.resources[side].items())
          if (TenantResourceName(name)) own[side][name] = quantity;
  json resources = WithDefaultResources(own, platform.default_cpu, platform.default_memory);
  if (spec.gpus_per_node > 0) {
    resources["limits"]["nvidia.com/gpu"] = std::to_string(spec.gpus_per_node);
    resources["requests"]["nvidia.com/gpu"] = std::to_string(spec.gpus_per_node);
  }
  return resources;
}

int64_t DeviceUnits(const json& resources) {
  constexpr int64_t kUnreadable = int64_t{1} << 40;  // past any quota, and no overflow when multiplied by groups
  auto units = [&](const json& q) -> int64_t {
    if (q.is_number_integer()) return std::max<int64_t>(0, q.get<int64_t>());
    if (q.is_string()) {
      const std::string text = q.get<std::string>();
      if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos) return kUnreadable;
      return std::stoll(text);
    }
    return kUnreadable;
  };
  std::map<std::string, int64_t> per_name;
  if (!resources.is_object()) return 0;
  for (const char* side : {"requests", "limits"}) {
    if (!resources.contains(side) || !resources[side].is_object()) continue;
    for (const auto& [name, quantity] : resources[side].items())
      if (!TenantResourceName(name)) per_name[name] = std::max(per_name[name], units(quantity));
  }
  int64_t total = 0;
  for (const auto& [name, n] : per_name) total = std::min(kUnreadable, total + n);
  return total;
}

json RestrictedContainerSecurity() {
  return {{"runAsNonRoot", true},
          {"allowPrivilegeEscalation", false},
          {"privileged", false},
          {"readOnlyRootFilesystem", true},
          {"capabilities", {{"drop", json::array({"ALL"})}}},
          {"seccompProfile", {{"type", "RuntimeDefault"}}}};
}

json StatefulSet(const json& md, const MoEDeploymentSpec& spec, int replica, const std::string& config_hash,
                 const PlatformConfig& platform) {
  const std::string group = GroupName(md, replica);
  json meta = Metadata(md, group, "daemon");
  meta["labels"][kReplicaLabel] = std::to_string(replica);
  json pod_labels = Labels(md, "daemon");
  pod_labels[kReplicaLabel] = std::to_string(replica);
  const json resources = ServerResources(spec, platform);
  auto env = [](const std::string& name, const std::string& value) { return json{{"name", name}, {"value", value}}; };
  const bool tls = !spec.tls_secret.empty();
  const std::string scheme = tls ? "HTTPS" : "HTTP";

  // 1. The puller: the platform's image, the only container that writes the
  //    cache; it verifies every file against manifest.json (never --no-verify)
  //    and holds the object-store credentials, which the tenant's image never sees.
  json pull_args = {"pull", spec.model_uri, "--revision", spec.model_revision, "--cache", kCacheDir};
  if (!spec.model_endpoint.empty()) {
    pull_args.push_back("--endpoint");
    pull_args.push_back(spec.model_endpoint);
  }
  if (spec.cache_size_gi > 0) {
    pull_args.push_back("--cache-size-limit");
    pull_args.push_back(std::to_string(spec.cache_size_gi) + "GiB");
  }
  json puller = {
      {"name", "pull-weights"},
      {"image", platform.daemon_image},
      {"args", pull_args},
      {"env", json::array({env("HOME", kTmpDir)})},
      {"resources", WithDefaultResources(json::object(), platform.puller_cpu, platform.puller_memory)},
      {"securityContext", RestrictedContainerSecurity()},
      {"volumeMounts",
       json::array({{{"name", "cache"}, {"mountPath", kCacheDir}}, {{"name", "tmp"}, {"mountPath", kTmpDir}}})},
  };
  // Object-store credentials as the standard AWS variables, from the keys
  // the operator copied into the deployment's Secret.
  if (!spec.model_credentials.empty())
    for (const char* key : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}) {
      json ref = {{"name", SecretName(md)}, {"key", std::string(kObjectStorePrefix) + key}, {"optional", true}};
      puller["env"].push_back({{"name", key}, {"valueFrom", {{"secretKeyRef", ref}}}});
    }

  // 2. The server: the tenant's image, the cache read-only.
  json container = {
      {"name", "moe-daemon"},
      {"image", spec.image},
      {"args", {"serve", "--config", std::string(kConfigDir) + "/config.yaml", "--session_replica",
                SessionReplicaName(replica)}},
      {"ports", json::array({{{"name", "http"}, {"containerPort", spec.port}, {"protocol", "TCP"}}})},
      {"env",
       json::array({
           // The StatefulSet controller labels each pod with its ordinal.
           {{"name", "MOE_NODE_RANK"},
            {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.labels['apps.kubernetes.io/pod-index']"}}}}}},
           env("MOE_NUM_NODES", std::to_string(spec.nodes_per_replica)),
           env("MOE_MASTER_ADDR", group + "-0." + group),
           env("MOE_LOCAL_RANKS", std::to_string(spec.LocalRanks())),
           env("MOE_REPLICA_INDEX", std::to_string(replica)),
           env("MOE_MODEL_URI", spec.model_uri),
           env("MOE_MODEL_REVISION", spec.model_revision),
           env("HOME", kTmpDir),
       })},
      {"resources", resources},
      {"securityContext", RestrictedContainerSecurity()},
      {"readinessProbe",
       {{"httpGet", {{"path", "/readyz"}, {"port", "http"}, {"scheme", scheme}}}, {"periodSeconds", 10}}},
      {"livenessProbe",
       {{"httpGet", {{"path", "/healthz"}, {"port", "http"}, {"scheme", scheme}}},
        {"periodSeconds", 20},
        {"failureThreshold", 6}}},
      {"volumeMounts",
       json::array({{{"name", "config"}, {"mountPath", kConfigDir}, {"readOnly", true}},
                    {{"name", "secrets"}, {"mountPath", kSecretsDir}, {"readOnly", true}},
                    {{"name", "cache"}, {"mountPath", kCacheDir}, {"readOnly", true}},
                    {{"name", "tmp"}, {"mountPath", kTmpDir}}})},
  };

  // No device requested: no device visible, whatever the image's ENV says
  // (the runtimes read these to pick devices; a pod's env overrides the
  // image's). The puller never requests one.
  for (const auto& vendor : kGpuVendors) {
    puller["env"].push_back(env(vendor.visible_devices_env, vendor.none));
    if (DeviceUnits(resources) == 0) container["env"].push_back(env(vendor.visible_devices_env, vendor.none));
  }

  // Multi-node groups: the rendezvous port, this pod's address for the
  // collectives, and the group's secret (a file, never an environment value).
  if (spec.nodes_per_replica > 1) {
    container["ports"].push_back({{"name", "rendezvous"}, {"containerPort", kRendezvousPort}, {"protocol", "TCP"}});
    container["env"].push_back({{"name", "MOE_POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}});
    container["env"].push_back(env("MOE_RENDEZVOUS_PORT", std::to_string(kRendezvousPort)));
    container["env"].push_back(env("MOE_GROUP_SECRET_FILE", std::string(kSecretsDir) + "/" + kGroupSecretKey));
  }

  // 3. Volumes: only kinds the restricted profile allows. The Secret volume
  //    lists what the daemon reads; the admin key and the object-store
  //    credentials stay out of the tenant's container.
  json secret_items = json::array({{{"key", kApiKeysKey}, {"path", kApiKeysKey}},
                                   {{"key", kMetricsTokenKey}, {"path", kMetricsTokenKey}}});
  if (tls)
    for (const char* key : {kTlsCertKey, kTlsKeyKey}) secret_items.push_back({{"key", key}, {"path", key}});
  if (spec.nodes_per_replica > 1) secret_items.push_back({{"key", kGroupSecretKey}, {"path", kGroupSecretKey}});
  json volumes = json::array({
      {{"name", "config"}, {"configMap", {{"name", ConfigMapName(md)}}}},
      {{"name", "secrets"}, {"secret", {{"secretName", SecretName(md)}, {"items", secret_items}, {"defaultMode", 0440}}}},
      {{"name", "cache"}, {"persistentVolumeClaim", {{"claimName", CacheClaimName(md)}}}},
      {{"name", "tmp"}, {"emptyDir", {{"sizeLimit", "1Gi"}}}},
  });
  if (!spec.budgeting.policy.empty()) {
    // Optional: the ConfigMap appears with the first usage sync, and a
    // daemon that starts before it waits for the sync's push instead.
    container["volumeMounts"].push_back({{"name", "budget"}, {"mountPath", kBudgetDir}, {"readOnly", true}});
    volumes.push_back({{"name", "budget"},
                       {"configMap",
                        {{"name", spec.budgeting.policy + "-budget"},
                         {"optional", true},
                         {"items", json::array({{{"key", "spend.json"}, {"path", "spend.json"}}})}}}});
  }
  if (spec.prefix_disk_size_gi > 0) {
    // Node-local and the pod's own: a container restart keeps the files, a
    // replaced pod starts empty. Its sizeLimit evicts the pod when passed;
    // the daemon's bound (prefix_disk_bytes) stays below it.
    container["volumeMounts"].push_back({{"name", "prefix-disk"}, {"mountPath", kPrefixDiskDir}});
    volumes.push_back(
        {{"name", "prefix-disk"}, {"emptyDir", {{"sizeLimit", std::to_string(spec.prefix_disk_size_gi) + "Gi"}}}});
  }
  json claim_templates = json::array();
  if (spec.state_size_gi > 0) {
    container["volumeMounts"].push_back({{"name", "state"}, {"mountPath", kStateDir}});
    json claim_spec = {{"accessModes", json::array({"ReadWriteOnce"})},
                       {"resources", {{"requests", {{"storage", std::to_string(spec.state_size_gi) + "Gi"}}}}}};
    if (!spec.state_storage_class.empty()) claim_spec["storageClassName"] = spec.state_storage_class;
    claim_templates.push_back({{"metadata", {{"name", "state"}, {"labels", Labels(md, "state")}}}, {"spec", claim_spec}});
  }
  json pod_spec = {
      {"automountServiceAccountToken", false},
      // On SIGTERM (a group scaled away or replaced) the daemon drains: not
      // ready, new requests refused with 503 Retry-After, requests in flight
      // finish for up to its shutdown_grace_seconds (30). The kubelet must
      // not kill it before that.
      {"terminationGracePeriodSeconds", 45},
      {"enableServiceLinks", false},
      {"securityContext",
       {{"runAsNonRoot", true},
        {"runAsUser", platform.run_as_user},
        {"runAsGroup", platform.run_as_user},
        {"fsGroup", platform.run_as_user},
        {"seccompProfile", {{"type", "RuntimeDefault"}}}}},
      {"initContainers", json::array({puller})},
      {"containers", json::array({container})},
      {"volumes", volumes},
  };
  if (spec.node_selector.is_object()) pod_spec["nodeSelector"] = spec.node_selector;
  if (spec.tolerations.is_array()) pod_spec["tolerations"] = spec.tolerations;
  if (spec.affinity.is_object()) pod_spec["affinity"] = spec.affinity;
  json sts = {{"apiVersion", "apps/v1"},
          {"kind", "StatefulSet"},
          {"metadata", meta},
          {"spec",
           {{"serviceName", group},
            {"replicas", spec.nodes_per_replica},
            {"podManagementPolicy", "Parallel"},
            // The operator replaces a group's pods together (a group with
            // mixed revisions cannot serve), so the controller must not roll them one by one.
            {"updateStrategy", {{"type", "OnDelete"}}},
            {"selector", {{"matchLabels", GroupSelector(md, replica)}}},
            {"template",
             {{"metadata",
               {{"labels", pod_labels},
                {"annotations",
                 {{kConfigHashAnnotation, config_hash}, {"moeserve.io/model-revision", spec.model_revision}}}}},
              {"spec", pod_spec}}}}}};
  if (!claim_templates.empty()) sts["spec"]["volumeClaimTemplates"] = std::move(claim_templates);
  return sts;
}

json CacheVolume(const json& md, const PlatformConfig& platform) {
  json labels = Labels(md, "cache");
  labels[kOwnerNamespaceLabel] = Namespace(md);
  labels[kOwnerNameLabel] = Name(md);
  const std::string capacity = std::to_string(platform.cache_capacity_gi) + "Gi";
  // A hostPath volume is the platform's to define (pods may not name one under
  // `restricted`); pre-bound through claimRef, so no other claim can take it.
  return {{"apiVersion", "v1"},
          {"kind", "PersistentVolume"},
          {"metadata", {{"name", CacheVolumeName(md)}, {"labels", labels}}},
          {"spec",
           {{"capacity", {{"storage", capacity}}},
            {"accessModes", json::array({"ReadWriteOnce"})},
            {"persistentVolumeReclaimPolicy", "Retain"},
            {"storageClassName", kCacheStorageClass},
            {"volumeMode", "Filesystem"},
            {"hostPath", {{"path", CacheHostPath(md, platform)}, {"type", "DirectoryOrCreate"}}},
            {"claimRef",
             {{"apiVersion", "v1"},
              {"kind", "PersistentVolumeClaim"},
              {"namespace", Namespace(md)},
              {"name", CacheClaimName(md)}}}}}};
}

json CacheClaim(const json& md, const PlatformConfig& platform) {
  const std::string capacity = std::to_string(platform.cache_capacity_gi) + "Gi";
  if (!platform.cache_storage_class.empty())
    // The class's volume, whichever it binds: made by its provisioner, or
    // one made in advance (a claimRef naming this claim picks it exactly).
    return {{"apiVersion", "v1"},
            {"kind", "PersistentVolumeClaim"},
            {"metadata", Metadata(md, CacheClaimName(md), "cache")},
            {"spec",
             {{"accessModes", json::array({"ReadWriteOnce"})},
              {"storageClassName", platform.cache_storage_class},
              {"volumeMode", "Filesystem"},
              {"resources", {{"requests", {{"storage", capacity}}}}}}}};
  return {{"apiVersion", "v1"},
          {"kind", "PersistentVolumeClaim"},
          {"metadata", Metadata(md, CacheClaimName(md), "cache")},
          {"spec",
           {{"accessModes", json::array({"ReadWriteOnce"})},
            {"storageClassName", kCacheStorageClass},
            {"volumeName", CacheVolumeName(md)},
            {"volumeMode", "Filesystem"},
            {"resources", {{"requests", {{"storage", capacity}}}}}}}};
}

json PodDisruptionBudget(const json& md, const MoEDeploymentSpec& spec, int replica) {
  json meta = Metadata(md, GroupName(md, replica), "disruption-budget");
  meta["labels"][kReplicaLabel] = std::to_string(replica);
  // One pod of a group at a time: a drain takes a group down but never
  // evicts two of its ranks at once, and never blocks forever.
  return {{"apiVersion", "policy/v1"},
          {"kind", "PodDisruptionBudget"},
          {"metadata", meta},
          {"spec", {{"maxUnavailable", 1}, {"selector", {{"matchLabels", GroupSelector(md, replica)}}}}}};
}

json EndpointService(const json& md, const MoEDeploymentSpec& spec) {
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", Metadata(md, Name(md), "endpoint")},
          {"spec",
           {{"type", "ClusterIP"},
            {"selector",
             {{"app.kubernetes.io/instance", Name(md)},
              {"app.kubernetes.io/component", "daemon"},
              {"apps.kubernetes.io/pod-index", "0"}}},
            {"ports", json::array({{{"name", "http"}, {"port", spec.port}, {"targetPort", spec.port}}})}}}};
}

std::string ConfigHash(const json& config_map, const json& secret) {
  // The daemon reloads its certificate and its API keys file when the files
  // change: a renewal or a rotated key must not restart pods. What only a
  // start reads stays in: the object-store credentials (the pull init
  // container's environment) and the metrics token.
  json data = secret.value("data", json::object());
  data.erase(kTlsCertKey);
  data.erase(kTlsKeyKey);
  data.erase(kApiKeysKey);
  return Sha256Hex(config_map["data"].dump() + "\n" + data.dump()).substr(0, 16);
}

}  // namespace desired
}  // namespace moeserve::op
