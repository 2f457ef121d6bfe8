#include "moeserve/operator/reconciler.hpp"

#include <algorithm>

#include "moeserve/common/log.hpp"
#include "moeserve/common/rfc3339.hpp"

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

}  // namespace

Result<std::map<std::string, std::string>> KubernetesSecretSource::Fetch(const std::string& ns,
                                                                           const SecretReference& ref) {
  if (!ref.vault_path.empty())
    return Fail(Error::Unavailable("Vault is not configured in this operator; cannot read " + ref.vault_path));
  MOE_ASSIGN_OR_RETURN(json secret, client_.Get(resources::kSecret, ns, ref.secret_name));
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
  auto spec = ParseMoEDeploymentSpec(md.value("spec", json::object()));
  if (!spec) {
    MOE_TRY(WriteStatus(md, nullptr, {}, {}, {}, spec.error().message()));
    return ReconcileResult{};
  }

  // 5. Quota: admitted or not (a QuotaPolicy issue plugs in here).
  QuotaDecision quota = options_.quota ? options_.quota(md, *spec) : QuotaDecision{};

  // 6. Config and secrets, and the hash that rolls pods when either changes.
  SecretsState secrets = GatherSecrets(md, *spec);
  const json config_map = desired::ConfigMap(md, *spec);
  json secret = desired::Secret(md, secrets.data);
  if (!secrets.synced) {
    // Never replace the last good Secret with a worse one: keep what is there.
    if (auto existing = caches_.secrets->Get(Namespace(md) + "/" + desired::SecretName(md)))
      secret["data"] = existing->value("data", json::object());
  }
  const std::string config_hash = desired::ConfigHash(config_map, secret);

  // 7. Create or update the children that do not roll.
  MOE_TRY(Apply(resources::kConfigMap, caches_.configmaps, md, config_map));
  if (secrets.synced || !caches_.secrets->Get(Namespace(md) + "/" + desired::SecretName(md)))
    MOE_TRY(Apply(resources::kSecret, caches_.secrets, md, secret));
  MOE_TRY(Apply(resources::kService, caches_.services, md, desired::EndpointService(md, *spec)));
  const int groups = quota.admitted ? spec->replicas : 0;
  for (int r = 0; r < groups; ++r) {
    MOE_TRY(Apply(resources::kService, caches_.services, md, desired::GroupService(md, *spec, r)));
    MOE_TRY(Apply(resources::kPodDisruptionBudget, caches_.pdbs, md, desired::PodDisruptionBudget(md, *spec, r)));
  }

  // 8. Roll the StatefulSets out group by group, then drop groups past spec.replicas.
  MoEDeploymentSpec effective = *spec;
  effective.replicas = groups;
  MOE_ASSIGN_OR_RETURN(Rollout rollout, RollOut(md, effective, config_hash));
  MOE_TRY(RemoveSurplusGroups(md, effective));

  // 9. Report.
  MOE_TRY(WriteStatus(md, &*spec, rollout, secrets, quota, ""));

  // 10. Owned objects' events bring us back; referenced Secrets are not watched, so look again later.
  ReconcileResult result;
  if (!spec->model_credentials.secret_name.empty() || !spec->api_keys.secret_name.empty() || !secrets.synced)
    result.requeue_after = options_.secret_resync;
  return result;
}

Result<ReconcileResult> MoEDeploymentReconciler::Finalize(json md) {
  json finalizers = md["metadata"].value("finalizers", json::array());
  auto mine = std::find(finalizers.begin(), finalizers.end(), kFinalizer);
  if (mine == finalizers.end()) return ReconcileResult{};
  if (options_.cleanup) MOE_TRY(options_.cleanup->Cleanup(md));
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

MoEDeploymentReconciler::SecretsState MoEDeploymentReconciler::GatherSecrets(const json& md,
                                                                              const MoEDeploymentSpec& spec) {
  SecretsState state;
  auto gather = [&](const SecretReference& ref, const std::string& prefix) {
    if (ref.empty() || !state.synced) return;
    auto fetched = options_.secret_source->Fetch(Namespace(md), ref);
    if (!fetched) {
      state.synced = false;
      state.reason = ref.vault_path.empty() ? "SecretNotFound" : "VaultUnavailable";
      // The error text names the reference, never a value.
      state.message = fetched.error().message();
      return;
    }
    for (const auto& [k, v] : *fetched) state.data[prefix + k] = v;
  };
  gather(spec.model_credentials, "object-store.");
  // The API keys source maps tenant -> key; the daemon reads them as
  // api-keys.yaml (daemon/api_keys.hpp: keys: [{key, tenant}]).
  if (!spec.api_keys.empty() && state.synced) {
    auto keys = options_.secret_source->Fetch(Namespace(md), spec.api_keys);
    if (!keys) {
      state.synced = false;
      state.reason = spec.api_keys.vault_path.empty() ? "SecretNotFound" : "VaultUnavailable";
      state.message = keys.error().message();
    } else {
      json file = {{"keys", json::array()}};
      for (const auto& [tenant, key] : *keys) file["keys"].push_back({{"key", key}, {"tenant", tenant}});
      state.data["api-keys.yaml"] = file.dump(2) + "\n";
    }
  }
  if (state.synced) state.message = "secrets are in Secret " + desired::SecretName(md);
  return state;
}

Result<json> MoEDeploymentReconciler::Apply(const ResourceRef& ref, ObjectCache* cache, const json& md,
                                           const json& want) {
  const std::string key = Namespace(want) + "/" + Name(want);
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
  if (Contains(*existing, want)) return *existing;
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
            desired::StatefulSet(md, spec, r, config_hash)};
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
    auto deleted = client_.DeleteCollection(resources::kPod, Namespace(md),
                                            "app.kubernetes.io/instance=" + Name(md) + "," + kReplicaLabel + "=" +
                                                std::to_string(g.replica));
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
  for (const auto& sts : caches_.statefulsets->List(Namespace(md), {{"app.kubernetes.io/instance", Name(md)}})) {
    const auto labels = sts["metadata"].value("labels", json::object());
    int replica = std::stoi(labels.value(kReplicaLabel, "0"));
    if (replica < spec.replicas) continue;
    bool owned = false;
    for (const auto& ref : sts["metadata"].value("ownerReferences", json::array()))
      owned = owned || ref.value("uid", "") == md["metadata"].value("uid", "");
    if (!owned) continue;
    const std::string group = Name(sts);
    for (auto [ref, cache] : {std::pair{&resources::kStatefulSet, caches_.statefulsets},
                              std::pair{&resources::kService, caches_.services},
                              std::pair{&resources::kPodDisruptionBudget, caches_.pdbs}}) {
      auto deleted = client_.Delete(*ref, Namespace(md), group);
      if (!deleted && deleted.error().code() != ErrorCode::kNotFound) return Fail(deleted.error());
      cache->Remove(Namespace(md) + "/" + group);
    }
    if (events_) events_->Record(md, "Normal", "ScaledDown", "Removed replica group " + group);
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
