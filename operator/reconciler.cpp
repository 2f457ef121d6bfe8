#include "moeserve/operator/reconciler.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <charconv>
#include <set>

#include "moeserve/common/log.hpp"
#include "moeserve/common/rfc3339.hpp"
#include "moeserve/common/sha256.hpp"

namespace moeserve::op {
namespace {

std::string Namespace(const json& o) { return o["metadata"].value("namespace", ""); }
std::string Name(const json& o) { return o["metadata"].value("name", ""); }

// Sets a condition as the API conventions say: lastTransitionTime moves only
// when status does.
void SetCondition(json& conditions, const std::string& type, const std::string& status, const std::string& reason,
                  const std::string& message, int64_t generation) {
  json condition = {{"type", type},       {"status", status},   {"reason", reason},
                    {"message", message}, {"observedGeneration", generation}};
  for (auto& c : conditions) {
    if (c.value("type", "") != type) continue;
    condition["lastTransitionTime"] =
        c.value("status", "") == status ? c.value("lastTransitionTime", NowRfc3339()) : NowRfc3339();
    c = condition;
    return;
  }
  condition["lastTransitionTime"] = NowRfc3339();
  conditions.push_back(condition);
}

// `have` updated so that it contains `want`: metadata labels, annotations
// and owner references merged; spec-like fields replaced, keeping what the
// server filled in that we do not set (clusterIP and the like) at the top of
// spec; the pod template replaced whole so removed fields go away.
json Overlay(json have, const json& want) {
  for (const auto& [k, v] : want.items()) {
    if (k == "metadata") {
      for (const char* field : {"labels", "annotations"})
        if (v.contains(field))
          for (const auto& [lk, lv] : v[field].items()) have["metadata"][field][lk] = lv;
      if (v.contains("ownerReferences")) have["metadata"]["ownerReferences"] = v["ownerReferences"];
    } else if (k == "spec" && have.contains("spec") && have["spec"].is_object()) {
      for (const auto& [sk, sv] : v.items()) have["spec"][sk] = sv;
    } else {
      have[k] = v;
    }
  }
  return have;
}

// 32 bytes from OpenSSL's CSPRNG, as hex.
Result<std::string> RandomToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return Fail(Error::Internal("RAND_bytes failed: no randomness for a key"));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

// A label that should hold a small non-negative integer; anything else is
// not ours to interpret (any object can carry our labels).
std::optional<int> ParseIndex(const json& labels, const char* key) {
  if (!labels.is_object() || !labels.contains(key) || !labels[key].is_string()) return std::nullopt;
  const std::string& text = labels[key].get_ref<const std::string&>();
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

bool OwnedByUid(const json& object, const std::string& uid) {
  const json refs = object["metadata"].value("ownerReferences", json::array());
  if (!refs.is_array() || uid.empty()) return false;
  for (const auto& ref : refs)
    if (ref.is_object() && ref.value("uid", "") == uid) return true;
  return false;
}

Preconditions PreconditionsOf(const json& object) {
  return {object["metadata"].value("uid", ""), object["metadata"].value("resourceVersion", "")};
}

std::string ReasonFor(const Error& error, const SecretReference& ref) {
  // Vault decides who reads what through its policies; a refusal there may
  // pass (a policy fixed, a token renewed) and never drops the last good copy.
  if (!ref.vault_path.empty()) {
    switch (error.code()) {
      case ErrorCode::kPermissionDenied: return "VaultPermissionDenied";
      case ErrorCode::kNotFound: return "VaultSecretNotFound";
      case ErrorCode::kInvalidArgument: return "VaultInvalidSecret";
      default: return "VaultUnavailable";
    }
  }
  if (error.code() == ErrorCode::kPermissionDenied) return "SecretNotUsable";
  return error.code() == ErrorCode::kNotFound ? "SecretNotFound" : "SecretUnavailable";
}

// The last good api-keys.yaml less every tenant entry the current keys no
// longer hold (same tenant, same key hash): while a malformed keys Secret
// keeps the last good file serving, a key removed in the same edit is gone.
// `fresh` (the admin key alone) when the last file cannot be read. `held`
// null: every tenant entry of the last file stays (the keys could not be
// read now). The admin entry is always `fresh`'s.
std::string KeysStillHeld(const std::string& last_good, const std::string& fresh,
                          const std::set<std::pair<std::string, std::string>>* held) {
  const json last = json::parse(last_good, nullptr, false);
  const json admin_only = json::parse(fresh, nullptr, false);
  if (!last.is_object() || !last.value("keys", json()).is_array() || !admin_only.is_object()) return fresh;
  json kept = admin_only;  // the current admin entry
  for (const auto& entry : last["keys"]) {
    if (!entry.is_object() || entry.value("role", json()) != json("user")) continue;
    const json tenant = entry.value("tenant", json()), hash = entry.value("sha256", json());
    if (tenant.is_string() && hash.is_string() &&
        (!held || held->contains({tenant.get<std::string>(), hash.get<std::string>()})))
      kept["keys"].push_back(entry);
  }
  return kept.dump(2) + "\n";
}

}  // namespace

Result<std::map<std::string, std::string>> KubernetesSecretSource::Fetch(const std::string& ns,
                                                                           const SecretReference& ref) {
  if (!ref.vault_path.empty())
    return Fail(Error::Unavailable("Vault is not configured in this operator; cannot read " + ref.vault_path));
  MOE_ASSIGN_OR_RETURN(json secret, client_.Get(resources::kSecret, ns, ref.secret_name));
  // The operator may read every Secret of the namespace; a tenant may not.
  // Only Secrets the platform marked may be copied into a tenant's pods.
  const json labels = secret["metadata"].value("labels", json::object());
  if (!labels.is_object() || labels.value(kUsableLabel, "") != "true")
    return Fail(Error::PermissionDenied("Secret " + ns + "/" + ref.secret_name + " is not labelled " + kUsableLabel +
                                        "=true; only such Secrets may be referenced"));
  std::map<std::string, std::string> out;
  const json data = secret.value("data", json::object());
  for (const auto& [k, v] : data.items())
    if (v.is_string()) out[k] = Base64Decode(v.get<std::string>());
  return out;
}

MoEDeploymentReconciler::MoEDeploymentReconciler(KubeClient& client, ReconcilerCaches caches, EventRecorder* events,
                                                 MoEDeploymentReconcilerOptions options)
    : client_(client), caches_(caches), events_(events), options_(std::move(options)) {
  if (!options_.secret_source) {
    default_secret_source_ = std::make_unique<KubernetesSecretSource>(client_);
    options_.secret_source = default_secret_source_.get();
  }
}

bool MoEDeploymentReconciler::GroupReady(const json& sts) {
  const json& status = sts.contains("status") ? sts["status"] : json::object();
  const int64_t generation = sts["metadata"].value("generation", int64_t{0});
  const int want = sts["spec"].value("replicas", 1);
  if (status.value("observedGeneration", int64_t{0}) < generation) return false;
  if (status.value("readyReplicas", 0) < want || status.value("updatedReplicas", 0) < want) return false;
  const std::string current = status.value("currentRevision", ""), update = status.value("updateRevision", "");
  return current.empty() || update.empty() || current == update;
}

Result<ReconcileResult> MoEDeploymentReconciler::Reconcile(const std::string& key) {
  // 1. Load the MoEDeployment. Gone: owner references take its children with it.
  auto cached = caches_.moedeployments->Get(key);
  if (!cached) return ReconcileResult{};
  json md = *cached;

  // 2. Being deleted: clean up what owner references do not cover, then let go.
  if (md["metadata"].contains("deletionTimestamp")) return Finalize(md);

  // 3. Make deletion wait for step 2.
  MOE_TRY(EnsureFinalizer(md));

  // 4. Read the spec. One the operator cannot act on is reported, not retried.
  //    So is one the platform does not allow (scheduling past its
  //    allow-list). Either holds no groups: quota counts none for it, so a
  //    group made before the refusal (an object stored before a field was
  //    closed) is removed, never left running uncounted.
  auto spec = ParseMoEDeploymentSpec(md.value("spec", json::object()));
  Status allowed = spec ? CheckScheduling(spec->node_selector, spec->tolerations, spec->affinity,
                                          options_.platform.scheduling)
                        : Status(Fail(spec.error()));
  if (!allowed) {
    MoEDeploymentSpec none;
    none.replicas = 0;
    MOE_TRY(RemoveSurplusGroups(md, none));
    MOE_TRY(WriteStatus(md, nullptr, {}, {}, {}, allowed.error().message()));
    return ReconcileResult{};
  }

  // 5. Quota: admitted or not, as options_.quota decides (moe-operator's is
  //    DecideQuota over its caches, the webhook's function; unset: admitted).
  QuotaDecision quota = options_.quota ? options_.quota(md, *spec) : QuotaDecision{};
  if (quota.forbidden) {
    // What the policy forbids never runs: not even the groups made before
    // the policy said so (they would go on running the forbidden image).
    MoEDeploymentSpec none;
    none.replicas = 0;
    MOE_TRY(RemoveSurplusGroups(md, none));
    MOE_TRY(WriteStatus(md, nullptr, {}, {}, {}, quota.reason + ": " + quota.message));
    return ReconcileResult{};
  }
  if (options_.budgeting) spec->budgeting = options_.budgeting(md);

  // 6. Config and secrets (the operator's own keys read back, never
  //    regenerated while the Secret holds them), and the hash that rolls pods.
  MOE_ASSIGN_OR_RETURN(const std::optional<json> existing_secret, OwnSecret(md));
  MOE_ASSIGN_OR_RETURN(auto operator_keys, OperatorKeys(md, existing_secret));
  SecretsState secrets = GatherSecrets(md, *spec, operator_keys);
  const json config_map = desired::ConfigMap(md, *spec);
  json secret = desired::Secret(md, secrets.data);
  // A failure that may pass never replaces the last good Secret with a worse
  // one; only a Secret this deployment owns was ever good.
  const bool keep_secret = !secrets.synced && secrets.keep_last_good && existing_secret &&
                           OwnedByUid(*existing_secret, md["metadata"].value("uid", ""));
  if (keep_secret) {
    json kept = existing_secret->value("data", json::object());
    kept.erase(kAdminKeyKey);  // a plain admin key left by an older operator never stays
    // Except revoked keys: a key the tenant removed (or whose Secret is gone)
    // never lives on in the last good copy.
    if (secrets.keys == SecretsState::Keys::kFresh) {
      kept[kApiKeysKey] = Base64Encode(secrets.data.at(kApiKeysKey));
    } else {
      // The tenant entries as decided above, the admin entry always the
      // current key's: a key rotated meanwhile is never shut out.
      const std::string last = kept.value(kApiKeysKey, json("")).is_string() ? Base64Decode(kept[kApiKeysKey].get<std::string>()) : "";
      kept[kApiKeysKey] = Base64Encode(KeysStillHeld(
          last, secrets.data.at(kApiKeysKey),
          secrets.keys == SecretsState::Keys::kMalformed ? &secrets.keys_held : nullptr));
    }
    secret["data"] = kept;
  }
  const std::string config_hash = desired::ConfigHash(config_map, secret);

  // 7. Create or update the children that do not roll; the node cache volume and its claim.
  MOE_TRY(EnsureCache(md));
  MOE_TRY(Apply(resources::kConfigMap, caches_.configmaps, md, config_map));
  MOE_TRY(Apply(resources::kSecret, caches_.secrets, md, secret));
  MOE_TRY(Apply(resources::kService, caches_.services, md, desired::EndpointService(md, *spec)));
  // Over quota (it got in while the webhook was down, or its policy was
  // tightened): it is held. It keeps the groups it has below spec.replicas,
  // as they are (no new group, no roll to a new template, which could ask
  // for more); groups past spec.replicas still go.
  int groups = spec->replicas;
  if (!quota.admitted) {
    groups = 0;
    while (groups < spec->replicas &&
           caches_.statefulsets->Get(Namespace(md) + "/" + desired::GroupName(md, groups)))
      groups++;
  }
  for (int r = 0; r < groups; ++r) {
    MOE_TRY(Apply(resources::kService, caches_.services, md, desired::GroupService(md, *spec, r)));
    MOE_TRY(Apply(resources::kPodDisruptionBudget, caches_.pdbs, md, desired::PodDisruptionBudget(md, *spec, r)));
    if (spec->nodes_per_replica > 1 && caches_.networkpolicies)
      MOE_TRY(Apply(resources::kNetworkPolicy, caches_.networkpolicies, md, desired::NetworkPolicy(md, *spec, r)));
  }

  // 8. Roll the StatefulSets out group by group, then drop groups past spec.replicas.
  MoEDeploymentSpec effective = *spec;
  effective.replicas = groups;
  Rollout rollout;
  if (quota.admitted) {
    MOE_ASSIGN_OR_RETURN(rollout, RollOut(md, effective, config_hash));
  } else {
    rollout.groups = rollout.existing = groups;
    for (int r = 0; r < groups; ++r) {
      const auto sts = caches_.statefulsets->Get(Namespace(md) + "/" + desired::GroupName(md, r));
      const bool current = sts && Contains(*sts, desired::StatefulSet(md, effective, r, config_hash, options_.platform));
      rollout.updated += current ? 1 : 0;
      rollout.ready += current && sts && GroupReady(*sts) ? 1 : 0;
    }
  }
  MOE_TRY(RemoveSurplusGroups(md, effective));

  // 9. Report.
  MOE_TRY(WriteStatus(md, &*spec, rollout, secrets, quota, ""));

  // 10. Owned objects' events bring us back; Secrets (referenced ones and
  //     the deployment's own) and Vault paths are not watched (the operator
  //     may not list or watch Secrets), so look again later.
  ReconcileResult result;
  result.requeue_after = options_.secret_resync;
  if (!spec->model_credentials.vault_path.empty() || !spec->api_keys.vault_path.empty())
    result.requeue_after = result.requeue_after.count() > 0 ? std::min(result.requeue_after, options_.vault_resync)
                                                            : options_.vault_resync;
  return result;
}

Result<ReconcileResult> MoEDeploymentReconciler::Finalize(json md) {
  json finalizers = md["metadata"].value("finalizers", json::array());
  auto mine = std::find(finalizers.begin(), finalizers.end(), kFinalizer);
  if (mine == finalizers.end()) return ReconcileResult{};
  if (options_.cleanup) MOE_TRY(options_.cleanup->Cleanup(md));
  // The cache volume is cluster-scoped, the admin key's Secret in another
  // namespace: no owner reference can take either.
  MOE_TRY(DeleteCacheVolume(md));
  MOE_TRY(DeleteAdminSecret(md));
  finalizers.erase(mine);
  md["metadata"]["finalizers"] = finalizers;
  auto updated = client_.Update(resources::kMoEDeployment, md);
  if (!updated && updated.error().code() != ErrorCode::kNotFound) return Fail(updated.error());
  return ReconcileResult{};
}

Status MoEDeploymentReconciler::EnsureFinalizer(json& md) {
  json finalizers = md["metadata"].value("finalizers", json::array());
  if (std::find(finalizers.begin(), finalizers.end(), kFinalizer) != finalizers.end()) return Ok();
  finalizers.push_back(kFinalizer);
  md["metadata"]["finalizers"] = finalizers;
  const std::string based_on = md["metadata"].value("resourceVersion", "");
  MOE_ASSIGN_OR_RETURN(json updated, client_.Update(resources::kMoEDeployment, md));
  md = updated;
  caches_.moedeployments->UpsertIfUnchanged(md, based_on);
  return Ok();
}

Result<std::optional<json>> MoEDeploymentReconciler::OwnSecret(const json& md) {
  const std::string key = Namespace(md) + "/" + desired::SecretName(md);
  auto live = client_.Get(resources::kSecret, Namespace(md), desired::SecretName(md));
  if (!live) {
    if (live.error().code() != ErrorCode::kNotFound) return Fail(live.error());
    caches_.secrets->Remove(key);
    return std::optional<json>();
  }
  json secret = std::move(*live);
  secret["kind"] = resources::kSecret.kind;
  secret["apiVersion"] = resources::kSecret.ApiVersion();
  if (secret.contains("metadata") && secret["metadata"].is_object()) secret["metadata"].erase("managedFields");
  // What Apply compares against, and where the usage sync finds the admin key.
  caches_.secrets->Upsert(secret);
  return std::optional<json>(std::move(secret));
}

Result<std::map<std::string, std::string>> MoEDeploymentReconciler::OperatorKeys(const json& md,
                                                                                 const std::optional<json>& secret) {
  // Keys in a Secret this deployment does not own were not made here: not trusted.
  json data = json::object();
  if (secret && OwnedByUid(*secret, md["metadata"].value("uid", ""))) data = secret->value("data", json::object());
  std::map<std::string, std::string> keys;
  MOE_ASSIGN_OR_RETURN(keys[kAdminKeyKey], AdminKey(md));
  for (const char* name : {kMetricsTokenKey, kGroupSecretKey}) {
    std::string value;
    if (data.is_object() && data.contains(name) && data[name].is_string())
      value = Base64Decode(data[name].get<std::string>());
    if (value.empty()) {
      MOE_ASSIGN_OR_RETURN(value, RandomToken());
    }
    keys[name] = value;
  }
  return keys;
}

Result<std::string> MoEDeploymentReconciler::AdminKey(const json& md) {
  const std::string& ns = options_.operator_namespace;
  const std::string name = desired::AdminSecretName(md);
  auto live = client_.Get(resources::kSecret, ns, name);
  if (!live && live.error().code() != ErrorCode::kNotFound) return Fail(live.error());
  auto remember = [&](json secret) {
    secret["kind"] = resources::kSecret.kind;
    secret["apiVersion"] = resources::kSecret.ApiVersion();
    if (secret["metadata"].is_object()) secret["metadata"].erase("managedFields");
    caches_.secrets->Upsert(secret);  // where the usage sync finds the key
  };
  if (live && IsAdminSecretOf(*live, md)) {
    const json data = live->value("data", json::object());
    const std::string key =
        data.is_object() && data.value(kAdminKeyKey, json()).is_string() ? Base64Decode(data[kAdminKeyKey].get<std::string>()) : "";
    if (!key.empty()) {
      remember(*live);
      return key;
    }
  }
  // None yet, or one left by an earlier deployment of the same name (another
  // uid): a fresh key, never one made for someone else.
  MOE_ASSIGN_OR_RETURN(std::string key, RandomToken());
  const json want = desired::AdminSecret(md, ns, key);
  Result<json> written = live ? client_.Update(resources::kSecret, Overlay(*live, want)) : client_.Create(resources::kSecret, ns, want);
  if (!written) {
    if (written.error().code() == ErrorCode::kNotFound && !live)
      return Fail(Error::Unavailable("cannot keep the admin key of " + Namespace(md) + "/" + Name(md) + " in Secret " +
                                     ns + "/" + name + ": " + written.error().message() +
                                     " (is --operator-namespace the operator's own namespace?)"));
    return Fail(written.error());  // a conflict: the next reconcile reads it again
  }
  remember(*written);
  return key;
}

Status MoEDeploymentReconciler::DeleteAdminSecret(const json& md) {
  const std::string& ns = options_.operator_namespace;
  const std::string name = desired::AdminSecretName(md);
  auto live = client_.Get(resources::kSecret, ns, name);
  if (!live) return live.error().code() == ErrorCode::kNotFound ? Ok() : Fail(live.error());
  if (!IsAdminSecretOf(*live, md)) return Ok();  // not this deployment's
  auto deleted = client_.Delete(resources::kSecret, ns, name, "Background", PreconditionsOf(*live));
  if (!deleted && deleted.error().code() != ErrorCode::kNotFound) return Fail(deleted.error());
  caches_.secrets->Remove(ns + "/" + name);
  return Ok();
}

MoEDeploymentReconciler::SecretsState MoEDeploymentReconciler::GatherSecrets(
    const json& md, const MoEDeploymentSpec& spec, const std::map<std::string, std::string>& operator_keys) {
  SecretsState state;
  state.data = operator_keys;
  state.data.erase(kAdminKeyKey);  // the tenant's namespace gets its hash alone
  std::vector<std::string> problems;
  bool may_pass = false, forbidden = false;
  auto refuse = [&](const std::string& reason, const std::string& message, bool passing) {
    if (state.synced) state.reason = reason;
    state.synced = false;
    (passing ? may_pass : forbidden) = true;
    problems.push_back(message);  // names references, never values
  };
  // For the tenant keys (`keys` set), also what their failure does to api-keys.yaml.
  auto fetch = [&](const SecretReference& ref,
                   SecretsState::Keys* keys = nullptr) -> std::optional<std::map<std::string, std::string>> {
    auto fetched = options_.secret_source->Fetch(Namespace(md), ref);
    if (fetched) return std::move(*fetched);
    const std::string reason = ReasonFor(fetched.error(), ref);
    std::string message = fetched.error().message();
    if (keys && fetched.error().code() == ErrorCode::kNotFound)
      message += "; its keys are revoked (api-keys.yaml holds only the operator's admin key)";
    else if (keys && reason != "SecretNotUsable")
      *keys = SecretsState::Keys::kUnreachable;
    refuse(reason, message, reason != "SecretNotUsable");
    return std::nullopt;
  };

  // A Vault path the platform does not let this deployment name (the hook
  // keys' reserved prefix, outside its QuotaPolicy's allowed prefixes) is
  // never read: nothing from it may reach the tenant's own Secret.
  auto path_refused = [&](const SecretReference& ref, const char* field) {
    if (ref.vault_path.empty() || !options_.vault_path_allowed) return false;
    Status allowed = options_.vault_path_allowed(md, field, ref.vault_path);
    if (allowed) return false;
    refuse("VaultPathNotAllowed", allowed.error().message(), false);
    return true;
  };

  // Object-store credentials, for the puller.
  if (!spec.model_credentials.empty() && !path_refused(spec.model_credentials, "spec.model.credentials.vault.path"))
    if (auto credentials = fetch(spec.model_credentials))
      for (const auto& [k, v] : *credentials) state.data[kObjectStorePrefix + k] = v;

  // api-keys.yaml in the daemon's format (daemon/api_keys.hpp), hashes only:
  // the operator's admin key first, then tenant -> key from apiKeys.
  const std::string admin_hash = Sha256Hex(operator_keys.at(kAdminKeyKey));
  json file = {{"keys", json::array({{{"sha256", admin_hash}, {"tenant", kAdminTenant}, {"role", "admin"}}})}};
  if (!spec.api_keys.empty() && !path_refused(spec.api_keys, "spec.endpoint.apiKeys.vault.path")) {
    // A keys Secret (or Vault secret) that is gone revokes every key it held:
    // deleting it is how a tenant takes its keys away, so its last copy is
    // never kept (state.keys stays kFresh: the admin key alone).
    if (auto tenant_keys = fetch(spec.api_keys, &state.keys)) {
      for (const auto& [tenant, key] : *tenant_keys)
        if (!key.empty()) state.keys_held.insert({tenant, Sha256Hex(key)});
      // The daemon refuses the whole file over one bad entry: check here.
      std::set<std::string> hashes = {admin_hash};
      json entries = json::array();
      std::string invalid;
      for (const auto& [tenant, key] : *tenant_keys) {
        if (tenant == kAdminTenant) invalid = "tenant name " + std::string(kAdminTenant) + " is reserved";
        else if (key.empty()) invalid = "tenant " + tenant + " has an empty key";
        else if (!hashes.insert(Sha256Hex(key)).second) invalid = "tenant " + tenant + " repeats another entry's key";
        else entries.push_back({{"sha256", Sha256Hex(key)}, {"tenant", tenant}, {"role", "user"}});
        if (!invalid.empty()) break;
      }
      const std::string where = spec.api_keys.vault_path.empty() ? "Secret " + Namespace(md) + "/" + spec.api_keys.secret_name
                                                                  : spec.api_keys.vault_path;
      // Malformed, not forbidden: the tenant fixes it, and meanwhile the last
      // good file serves, less any key the tenant removed (Reconcile).
      if (!invalid.empty()) {
        refuse("InvalidApiKeys", where + ": " + invalid, true);
        state.keys = SecretsState::Keys::kMalformed;
      } else {
        for (auto& e : entries) file["keys"].push_back(std::move(e));
      }
    }
  }
  state.data[kApiKeysKey] = file.dump(2) + "\n";

  // The serving certificate, copied like the rest: pods mount only the deployment's own Secret.
  if (!spec.tls_secret.empty()) {
    SecretReference ref;
    ref.secret_name = spec.tls_secret;
    if (auto tls = fetch(ref)) {
      if (!tls->count(kTlsCertKey) || !tls->count(kTlsKeyKey)) {
        refuse("InvalidTlsSecret", "Secret " + Namespace(md) + "/" + spec.tls_secret + " lacks tls.crt or tls.key", true);
      } else {
        state.data[kTlsCertKey] = tls->at(kTlsCertKey);
        state.data[kTlsKeyKey] = tls->at(kTlsKeyKey);
      }
    }
  }

  // An old copy of a Secret that is no longer usable is never kept.
  state.keep_last_good = may_pass && !forbidden;
  if (state.synced) {
    state.message = "secrets are in Secret " + desired::SecretName(md);
  } else {
    for (size_t i = 0; i < problems.size(); ++i) state.message += (i ? "; " : "") + problems[i];
  }
  return state;
}

Status MoEDeploymentReconciler::EnsureCache(const json& md) {
  if (!options_.platform.cache_storage_class.empty()) {
    // The storage class provides the volume: only the claim is ours.
    const json want_claim = desired::CacheClaim(md, options_.platform);
    if (!caches_.claims->Get(ObjectKey(want_claim)))
      MOE_TRY(Apply(resources::kPersistentVolumeClaim, caches_.claims, md, want_claim));
    return Ok();
  }
  const json want_volume = desired::CacheVolume(md, options_.platform);
  const std::string volume_name = Name(want_volume);
  auto volume = caches_.volumes->Get(volume_name);
  if (volume) {
    const json labels = (*volume)["metadata"].value("labels", json::object());
    const json claim = (*volume)["spec"].value("claimRef", json::object());
    if (!labels.is_object() || !claim.is_object() || labels.value(kOwnerNamespaceLabel, "") != Namespace(md) ||
        labels.value(kOwnerNameLabel, "") != Name(md) || claim.value("namespace", "") != Namespace(md) ||
        claim.value("name", "") != desired::CacheClaimName(md))
      return Fail(Error::PermissionDenied("PersistentVolume " + volume_name + " exists but is not the cache volume of " +
                                          Namespace(md) + "/" + Name(md) + "; not using it"));
    if (volume->value("status", json::object()).value("phase", "") == "Released") {
      // Its claim was deleted: a Retain volume keeps the files but never binds again. Make a new one.
      auto deleted = client_.Delete(resources::kPersistentVolume, "", volume_name, "Background", PreconditionsOf(*volume));
      if (!deleted && deleted.error().code() != ErrorCode::kNotFound) return Fail(deleted.error());
      caches_.volumes->Remove(volume_name);
      volume.reset();
    }
  }
  if (!volume) MOE_TRY(Apply(resources::kPersistentVolume, caches_.volumes, md, want_volume));
  const json want_claim = desired::CacheClaim(md, options_.platform);
  if (!caches_.claims->Get(ObjectKey(want_claim)))
    MOE_TRY(Apply(resources::kPersistentVolumeClaim, caches_.claims, md, want_claim));
  return Ok();
}

Status MoEDeploymentReconciler::DeleteCacheVolume(const json& md) {
  // A storage class's volume follows its reclaim policy once the claim goes.
  if (!options_.platform.cache_storage_class.empty()) return Ok();
  const std::string volume_name = desired::CacheVolumeName(md);
  std::optional<json> volume = caches_.volumes->Get(volume_name);
  if (!volume) {
    auto live = client_.Get(resources::kPersistentVolume, "", volume_name);
    if (!live) return live.error().code() == ErrorCode::kNotFound ? Ok() : Fail(live.error());
    volume = *live;
  }
  const json labels = (*volume)["metadata"].value("labels", json::object());
  if (!labels.is_object() || labels.value(kOwnerNamespaceLabel, "") != Namespace(md) ||
      labels.value(kOwnerNameLabel, "") != Name(md))
    return Ok();  // not this deployment's
  auto deleted = client_.Delete(resources::kPersistentVolume, "", volume_name, "Background", PreconditionsOf(*volume));
  if (!deleted && deleted.error().code() != ErrorCode::kNotFound) return Fail(deleted.error());
  caches_.volumes->Remove(volume_name);
  return Ok();
}

Status MoEDeploymentReconciler::DeleteGroupPods(const json& md, const json& statefulset, int replica) {
  ListOptions list;
  list.label_selector = "app.kubernetes.io/instance=" + Name(md) + "," + kReplicaLabel + "=" + std::to_string(replica);
  MOE_ASSIGN_OR_RETURN(json pods, client_.List(resources::kPod, Namespace(md), list));
  const std::string owner = statefulset["metadata"].value("uid", "");
  for (const auto& pod : pods.value("items", json::array())) {
    // Only pods of this StatefulSet, and only the pod that was listed: a
    // replacement made meanwhile (new uid) already runs the new template.
    if (!OwnedByUid(pod, owner)) continue;
    json current = pod;
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto deleted = client_.Delete(resources::kPod, Namespace(md), Name(current), "Background", PreconditionsOf(current));
      if (deleted || deleted.error().code() == ErrorCode::kNotFound) break;
      if (deleted.error().code() != ErrorCode::kConflict) return Fail(deleted.error());
      // Changed since listed (its status, usually): the same pod still runs the old template.
      auto fresh = client_.Get(resources::kPod, Namespace(md), Name(current));
      if (!fresh) {
        if (fresh.error().code() == ErrorCode::kNotFound) break;
        return Fail(fresh.error());
      }
      if ((*fresh)["metadata"].value("uid", "") != current["metadata"].value("uid", "")) break;
      current = *fresh;
    }
  }
  return Ok();
}

Result<json> MoEDeploymentReconciler::Apply(const ResourceRef& ref, ObjectCache* cache, const json& md,
                                           const json& want) {
  const std::string key = ObjectKey(want);
  auto existing = cache->Get(key);
  if (!existing) {
    MOE_ASSIGN_OR_RETURN(json created, client_.Create(ref, Namespace(want), want));
    created["kind"] = ref.kind;
    created["apiVersion"] = ref.ApiVersion();
    created["metadata"].erase("managedFields");
    cache->UpsertIfUnchanged(created, "");
    // No Event per child: Events mark transitions (phase, rollout, scale),
    // and six per MoEDeployment would be a third of all writes at scale.
    return created;
  }
  // A ConfigMap's or Secret's data is the whole truth: a key dropped from
  // `want` (a refused Secret's copy) must go, not linger as "contained".
  const bool same_data = !want.contains("data") || existing->value("data", json::object()) == want["data"];
  if (same_data && Contains(*existing, want)) return *existing;
  MOE_ASSIGN_OR_RETURN(json updated, client_.Update(ref, Overlay(*existing, want)));
  updated["kind"] = ref.kind;
  updated["apiVersion"] = ref.ApiVersion();
  updated["metadata"].erase("managedFields");
  cache->UpsertIfUnchanged(updated, (*existing)["metadata"].value("resourceVersion", ""));
  return updated;
}

Result<MoEDeploymentReconciler::Rollout> MoEDeploymentReconciler::RollOut(const json& md,
                                                                          const MoEDeploymentSpec& spec,
                                                                          const std::string& config_hash) {
  Rollout rollout;
  rollout.groups = spec.replicas;
  struct Group {
    int replica;
    std::optional<json> sts;
    json want;
    bool current = false, ready = false;
  };
  std::vector<Group> groups;
  for (int r = 0; r < spec.replicas; ++r) {
    Group g{r, caches_.statefulsets->Get(Namespace(md) + "/" + desired::GroupName(md, r)),
            desired::StatefulSet(md, spec, r, config_hash, options_.platform)};
    if (g.sts) {
      g.current = Contains(*g.sts, g.want);
      g.ready = GroupReady(*g.sts);
    }
    groups.push_back(std::move(g));
  }
  // Groups that do not exist yet are created at once: they add capacity and take none away.
  for (auto& g : groups) {
    if (g.sts) continue;
    MOE_ASSIGN_OR_RETURN(json created, Apply(resources::kStatefulSet, caches_.statefulsets, md, g.want));
    g.sts = created;
    g.current = true;
    g.ready = GroupReady(created);
  }
  auto replace = [&](Group& g) -> Status {
    MOE_ASSIGN_OR_RETURN(json updated, Apply(resources::kStatefulSet, caches_.statefulsets, md, g.want));
    // OnDelete: the group's pods come back together on the new template.
    auto deleted = DeleteGroupPods(md, updated, g.replica);
    if (!deleted) log::Warn("deleting pods of " + desired::GroupName(md, g.replica) + ": " + deleted.error().ToString());
    g.sts = updated;
    g.current = true;
    g.ready = GroupReady(updated);
    if (events_)
      events_->Record(md, "Normal", "RollingOut",
                      "Replacing replica group " + desired::GroupName(md, g.replica) + " (config " + config_hash + ")");
    return Ok();
  };
  // Stale groups that are not serving anyway are replaced without spending the budget.
  for (auto& g : groups)
    if (!g.current && !g.ready) MOE_TRY(replace(g));
  int unavailable = 0;
  for (const auto& g : groups) unavailable += g.ready ? 0 : 1;
  int budget = spec.max_unavailable_replicas - unavailable;
  for (auto& g : groups) {
    if (g.current || budget <= 0) continue;
    MOE_TRY(replace(g));
    budget--;
  }
  for (const auto& g : groups) {
    rollout.existing += g.sts ? 1 : 0;
    rollout.updated += g.current ? 1 : 0;
    rollout.ready += (g.current && g.ready) ? 1 : 0;
  }
  return rollout;
}

Status MoEDeploymentReconciler::RemoveSurplusGroups(const json& md, const MoEDeploymentSpec& spec) {
  const std::string uid = md["metadata"].value("uid", "");
  const std::map<std::string, std::string> ours = {{"app.kubernetes.io/instance", Name(md)}};
  // 1. The StatefulSet of each surplus group goes first: its pods get
  //    SIGTERM, on which the daemon drains (not ready, new requests refused,
  //    requests in flight finish).
  for (const auto& sts : caches_.statefulsets->List(Namespace(md), ours)) {
    // Anyone can label an object as ours: only a well-formed index on a
    // StatefulSet this deployment owns counts.
    const auto replica = ParseIndex(sts["metadata"].value("labels", json::object()), kReplicaLabel);
    if (!replica) {
      log::Warn("StatefulSet " + ObjectKey(sts) + ": label " + kReplicaLabel +
                " is not a replica index; leaving the object alone");
      continue;
    }
    if (*replica < spec.replicas || !OwnedByUid(sts, uid)) continue;
    const std::string group = Name(sts);
    // Each delete names the object the decision was made on (uid and
    // resourceVersion): a changed or replaced one is refused, and the next
    // reconcile decides again on fresh data.
    auto deleted = client_.Delete(resources::kStatefulSet, Namespace(md), group, "Background", PreconditionsOf(sts));
    if (!deleted && deleted.error().code() != ErrorCode::kNotFound) return Fail(deleted.error());
    caches_.statefulsets->Remove(Namespace(md) + "/" + group);
    if (events_) events_->Record(md, "Normal", "ScaledDown", "Removed replica group " + group + " (its pods drain)");
  }
  // 2. The group's headless Service, PodDisruptionBudget and NetworkPolicy
  //    stay while any of its pods is left: a session kept by a draining pod
  //    stays reachable by forwarding, through the headless Service's name.
  std::map<int, bool> pods_left;
  for (auto [ref, cache] : {std::pair{&resources::kService, caches_.services},
                            std::pair{&resources::kPodDisruptionBudget, caches_.pdbs},
                            std::pair{&resources::kNetworkPolicy, caches_.networkpolicies}}) {
    if (!cache) continue;
    for (const auto& object : cache->List(Namespace(md), ours)) {
      const auto replica = ParseIndex(object["metadata"].value("labels", json::object()), kReplicaLabel);
      if (!replica || *replica < spec.replicas || !OwnedByUid(object, uid)) continue;
      const std::string group = Name(object);
      if (group != desired::GroupName(md, *replica) || caches_.statefulsets->Get(Namespace(md) + "/" + group)) continue;
      if (!pods_left.contains(*replica)) {
        ListOptions list;
        list.label_selector =
            "app.kubernetes.io/instance=" + Name(md) + "," + kReplicaLabel + "=" + std::to_string(*replica);
        MOE_ASSIGN_OR_RETURN(json pods, client_.List(resources::kPod, Namespace(md), list));
        pods_left[*replica] = !pods.value("items", json::array()).empty();
      }
      if (pods_left[*replica]) continue;  // looked at again on the next reconcile (at least every resync)
      auto deleted = client_.Delete(*ref, Namespace(md), group, "Background", PreconditionsOf(object));
      if (!deleted && deleted.error().code() != ErrorCode::kNotFound) return Fail(deleted.error());
      cache->Remove(Namespace(md) + "/" + group);
    }
  }
  return Ok();
}

Status MoEDeploymentReconciler::WriteStatus(json& md, const MoEDeploymentSpec* spec, const Rollout& rollout,
                                            const SecretsState& secrets, const QuotaDecision& quota,
                                            const std::string& failure) {
  const json old_status = md.value("status", json::object());
  const int64_t generation = md["metadata"].value("generation", int64_t{0});
  json status = old_status;
  json conditions = status.value("conditions", json::array());
  std::string phase;
  if (!failure.empty()) {
    phase = "Failed";
    SetCondition(conditions, "Ready", "False", "InvalidSpec", failure, generation);
  } else {
    const bool complete = rollout.ready == rollout.groups && rollout.updated == rollout.groups;
    if (!quota.admitted)
      phase = "QuotaExceeded";
    else if (complete)
      phase = "Ready";
    else if (rollout.ready > 0)
      phase = "Degraded";
    else if (rollout.existing > 0)
      phase = "Pulling";
    else
      phase = "Pending";
    const std::string ready_text = std::to_string(rollout.ready) + "/" + std::to_string(rollout.groups);
    SetCondition(conditions, "Ready", complete && quota.admitted ? "True" : "False",
                 complete ? "AllGroupsReady" : "GroupsNotReady", ready_text + " replica groups ready", generation);
    SetCondition(conditions, "WeightsReady", complete ? "True" : "False", complete ? "Loaded" : "Loading",
                 complete ? "every group loaded revision " + spec->model_revision
                          : "waiting for groups to load revision " + spec->model_revision,
                 generation);
    SetCondition(conditions, "SecretsSynced", secrets.synced ? "True" : "False", secrets.reason, secrets.message,
                 generation);
    SetCondition(conditions, "QuotaAdmitted", quota.admitted ? "True" : "False", quota.reason, quota.message,
                 generation);
    SetCondition(conditions, "Progressing", complete ? "False" : "True", complete ? "RolloutComplete" : "RollingOut",
                 std::to_string(rollout.updated) + "/" + std::to_string(rollout.groups) + " groups updated, " +
                     ready_text + " ready",
                 generation);
    status["replicas"] = rollout.groups;
    status["readyReplicas"] = rollout.ready;
    status["updatedReplicas"] = rollout.updated;
    status["ready"] = ready_text;
    status["endpoint"] = desired::Endpoint(md, *spec);
    // The scale subresource's labelSelectorPath: what an HPA averages pod metrics over.
    status["selector"] = "app.kubernetes.io/instance=" + Name(md) +
                         ",app.kubernetes.io/component=daemon,apps.kubernetes.io/pod-index=0";
    if (complete) status["modelRevision"] = spec->model_revision;
  }
  status["phase"] = phase;
  status["observedGeneration"] = generation;
  status["conditions"] = conditions;
  if (status == old_status) return Ok();
  json updated_object = md;
  updated_object["status"] = status;
  const std::string based_on = md["metadata"].value("resourceVersion", "");
  MOE_ASSIGN_OR_RETURN(json written, client_.UpdateStatus(resources::kMoEDeployment, updated_object));
  md = written;
  caches_.moedeployments->UpsertIfUnchanged(md, based_on);
  const std::string old_phase = old_status.value("phase", "");
  if (events_ && old_phase != phase)
    events_->Record(md, phase == "Failed" || phase == "Degraded" ? "Warning" : "Normal", "Phase" + phase,
                    "phase " + (old_phase.empty() ? std::string("none") : old_phase) + " -> " + phase +
                        (failure.empty() ? "" : ": " + failure));
  return Ok();
}

}  // namespace moeserve::op
