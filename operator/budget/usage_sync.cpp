#include "moeserve/operator/usage_sync.hpp"

#include <algorithm>
#include <cmath>
#include <future>
#include <random>
#include <set>

#include "moeserve/budget/hook_sender.hpp"
#include "moeserve/budget/quota_policy_budget.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/operator/json_fields.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "moeserve/operator/quota_policy.hpp"

namespace moeserve::op {

namespace {

using fields::Field;
using fields::NameOf;
using fields::NamespaceOf;
using fields::Str;
std::string UidOf(const json& o) { return Str(Field(o, "metadata"), "uid"); }

// The uid of the object that controls `o` with this kind and name, "" if none.
std::string ControllerUid(const json& o, const std::string& kind, const std::string& name) {
  const json& refs = Field(Field(o, "metadata"), "ownerReferences");
  if (!refs.is_array()) return "";
  for (const auto& r : refs)
    if (Str(r, "kind") == kind && Str(r, "name") == name && Field(r, "controller") == json(true)) return Str(r, "uid");
  return "";
}

int64_t NowUnix() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Runs fn over items, at most `parallel` at once.
template <typename T, typename Fn>
auto Parallel(const std::vector<T>& items, int parallel, Fn fn) {
  using R = decltype(fn(items[0]));
  std::vector<R> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); i += static_cast<size_t>(std::max(1, parallel))) {
    std::vector<std::future<R>> batch;
    for (size_t j = i; j < std::min(items.size(), i + static_cast<size_t>(std::max(1, parallel))); ++j)
      batch.push_back(std::async(std::launch::async, [&fn, &items, j] { return fn(items[j]); }));
    for (auto& f : batch) out.push_back(f.get());
  }
  return out;
}

}  // namespace

std::string BudgetConfigMapName(const std::string& policy) { return policy + "-budget"; }

std::string BudgetRecordName(const std::string& ns, const std::string& policy) {
  // Namespace and policy names are DNS labels and subdomains: "." never
  // occurs in a namespace, so <ns>.<policy> names one pair only.
  const std::string name = "moeserve-budget." + ns + "." + policy;
  if (name.size() <= 253) return name;
  return "moeserve-budget." + Sha256Hex(ns + "/" + policy).substr(0, 40);
}

Status UsageSync::WriteSpendCopy(const json& policy, const std::string& spend_json) {
  const std::string ns = NamespaceOf(policy), name = BudgetConfigMapName(NameOf(policy));
  const json data = {{"spend.json", spend_json}};
  auto existing = client_.Get(resources::kConfigMap, ns, name);
  if (!existing && existing.error().code() != ErrorCode::kNotFound) return Fail(existing.error());
  if (existing) {
    // Whatever it holds is replaced whole (an older operator kept its record
    // here; a tenant may have planted anything): nothing of it is read.
    json updated = *existing;
    updated["data"] = data;
    updated["metadata"].erase("managedFields");
    updated.erase("binaryData");
    MOE_ASSIGN_OR_RETURN(auto written, client_.Update(resources::kConfigMap, updated));
    (void)written;
    return Ok();
  }
  json object = {{"apiVersion", "v1"},
                 {"kind", "ConfigMap"},
                 {"metadata",
                  {{"name", name},
                   {"namespace", ns},
                   {"labels", {{"app.kubernetes.io/managed-by", kManagedBy}, {"moeserve.io/quota-policy", NameOf(policy)}}},
                   {"ownerReferences",
                    json::array({{{"apiVersion", resources::kQuotaPolicy.ApiVersion()},
                                  {"kind", resources::kQuotaPolicy.kind},
                                  {"name", NameOf(policy)},
                                  {"uid", UidOf(policy)},
                                  {"controller", true}}})}}},
                 {"data", data}};
  MOE_ASSIGN_OR_RETURN(auto created, client_.Create(resources::kConfigMap, ns, object));
  (void)created;
  return Ok();
}

namespace {
constexpr size_t kConfigMapLimit = 1 << 20;  // kube-apiserver refuses larger ConfigMaps
}  // namespace

UsageSync::UsageSync(KubeClient& client, Caches caches, SecretSource& hook_secrets, UsageSyncOptions options)
    : client_(client), caches_(caches), hook_secrets_(hook_secrets), options_(options) {}

UsageSync::~UsageSync() { Stop(); }

void UsageSync::Start() {
  if (options_.interval.count() <= 0 || thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      SyncOnce();
      lock.lock();
      cv_.wait_for(lock, options_.interval, [this] { return stop_; });
    }
  });
}

void UsageSync::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

UsageSyncStats UsageSync::stats() const {
  std::lock_guard lock(stats_mu_);
  return stats_;
}

void UsageSync::SyncOnce() {
  const auto start = std::chrono::steady_clock::now();
  for (const auto& policy : caches_.policies->List()) {
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
    }
    auto synced = SyncPolicy(policy);
    if (!synced)
      log::Warn("usage sync of QuotaPolicy " + NamespaceOf(policy) + "/" + NameOf(policy) + ": " +
                synced.error().ToString());
  }
  std::lock_guard lock(stats_mu_);
  stats_.last_sync_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Result<BudgetPolicy> UsageSync::PolicyOf(const json& policy) {
  const std::string name = NameOf(policy);
  MOE_ASSIGN_OR_RETURN(BudgetPolicy b, ParseQuotaPolicyBudget(Field(policy, "spec"),
                                                              "QuotaPolicy " + NamespaceOf(policy) + "/" + name + " spec"));
  b.policy_name = name;
  return b;
}

std::vector<UsageSync::Pod> UsageSync::PodsOf(const json& md, std::vector<std::string>& problems) {
  std::vector<Pod> pods;
  const std::string ns = NamespaceOf(md), name = NameOf(md), uid = UidOf(md);
  auto spec = ParseMoEDeploymentSpec(Field(md, "spec"));
  if (!spec) return pods;
  // The operator's admin key, from the Secret it keeps for this deployment
  // in its own namespace (the tenant's holds only the key's hash); the
  // serving certificate from the deployment's own Secret.
  auto secret = caches_.secrets->Get(ns + "/" + desired::SecretName(md));
  if (!secret || ControllerUid(*secret, "MoEDeployment", name) != uid) {
    problems.push_back("MoEDeployment " + name + ": no Secret " + desired::SecretName(md) + " of its own yet");
    return pods;
  }
  auto admin = caches_.secrets->Get(options_.record_namespace + "/" + desired::AdminSecretName(md));
  if (!admin || !IsAdminSecretOf(*admin, md)) {
    problems.push_back("MoEDeployment " + name + ": no admin key in Secret " + options_.record_namespace + "/" +
                       desired::AdminSecretName(md) + " yet");
    return pods;
  }
  DaemonEndpoint endpoint;
  endpoint.admin_key = Base64Decode(Str(Field(*admin, "data"), kAdminKeyKey));
  if (endpoint.admin_key.empty()) return pods;
  if (!spec->tls_secret.empty()) endpoint.ca_pem = Base64Decode(Str(Field(*secret, "data"), kTlsCertKey));
  ListOptions list;
  list.label_selector = "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=daemon";
  auto listed = client_.List(resources::kPod, ns, list);
  if (!listed) {
    problems.push_back("pods of " + name + ": " + listed.error().message());
    return pods;
  }
  for (const auto& pod : Field(*listed, "items").is_array() ? (*listed)["items"] : json::array()) {
    const std::string pod_name = NameOf(pod);
    // Node rank 0 of a group: <group>-0, controlled by the group's StatefulSet, itself this deployment's.
    if (pod_name.size() < 3 || !pod_name.ends_with("-0")) continue;
    const std::string group = pod_name.substr(0, pod_name.size() - 2);
    if (!group.starts_with(name + "-r")) continue;
    auto sts = caches_.statefulsets->Get(ns + "/" + group);
    if (!sts || ControllerUid(*sts, "MoEDeployment", name) != uid) continue;
    if (ControllerUid(pod, "StatefulSet", group) != UidOf(*sts)) continue;
    const std::string ip = Str(Field(pod, "status"), "podIP");
    if (ip.empty() || Field(Field(pod, "metadata"), "deletionTimestamp").is_string()) continue;
    Pod p{ns + "/" + pod_name, endpoint};
    const std::string host = ip.find(':') != std::string::npos ? "[" + ip + "]" : ip;
    p.endpoint.base_url = std::string(spec->tls_secret.empty() ? "http" : "https") + "://" + host + ":" +
                          std::to_string(spec->port);
    pods.push_back(std::move(p));
  }
  return pods;
}

Status UsageSync::SyncPolicy(const json& policy) {
  const std::string ns = NamespaceOf(policy), name = NameOf(policy);
  MOE_ASSIGN_OR_RETURN(BudgetPolicy budget, PolicyOf(policy));

  // The deployments it governs, and their node-rank-0 pods.
  std::vector<json> all_policies = caches_.policies->List(ns);
  std::vector<std::string> deployments, problems;
  std::vector<Pod> pods;
  for (const auto& md : caches_.moedeployments->List(ns)) {
    if (GoverningPolicy(md, all_policies) != name || Field(Field(md, "metadata"), "deletionTimestamp").is_string()) continue;
    deployments.push_back(NameOf(md));
    for (auto& p : PodsOf(md, problems)) pods.push_back(std::move(p));
  }
  if (deployments.empty()) return Ok();
  std::sort(deployments.begin(), deployments.end());
  for (const auto& d : deployments) budget.deployment_name += (budget.deployment_name.empty() ? "" : ",") + d;
  for (const auto& p : problems) log::Debug("usage sync " + ns + "/" + name + ": " + p);

  // 1. What was committed before: the record in the operator's namespace.
  //    One left by an earlier policy of the same name (another uid) is not
  //    this policy's and is started afresh.
  const std::string record_ns = options_.record_namespace, record_name = BudgetRecordName(ns, name);
  const std::string where = "ConfigMap " + record_ns + "/" + record_name + " (budget record of QuotaPolicy " + ns + "/" +
                            name + ")";
  auto cm = client_.Get(resources::kConfigMap, record_ns, record_name);
  if (!cm && cm.error().code() != ErrorCode::kNotFound) return Fail(cm.error().WithContext(where));
  BudgetRecord record;
  bool recorded = false;
  if (cm) {
    const json& annotations = Field(Field(*cm, "metadata"), "annotations");
    if (Str(annotations, kBudgetRecordPolicyUid) == UidOf(policy)) {
      auto parsed = ParseBudgetRecord(Field(*cm, "data"));
      // A record this operator cannot read is not silently reset: the sync stops until it is fixed or removed.
      if (!parsed) return Fail(parsed.error().WithContext(where));
      record = std::move(*parsed);
      recorded = true;
    } else {
      log::Info("usage sync: " + where + " belongs to an earlier QuotaPolicy of that name; starting it afresh");
    }
  }
  // No daemon to read and nothing recorded yet: nothing to count or report.
  if (pods.empty() && !recorded) return Ok();

  // 2. Read every pod.
  auto readings = Parallel(pods, options_.parallel, [this](const Pod& p) -> Result<UsageReading> {
    MOE_ASSIGN_OR_RETURN(json body, DaemonGetJson(p.endpoint, "/v1/usage", options_.request_timeout));
    return ParseUsageReading(body);
  });
  std::vector<const Pod*> read;
  RefusalMap refusals;  // from every pod read: any one's refusal reaches the 100% threshold
  uint64_t failed = 0;
  for (size_t i = 0; i < pods.size(); ++i) {
    if (!readings[i]) {
      failed++;
      log::Warn("usage sync " + ns + "/" + name + ": pod " + pods[i].key + ": " + readings[i].error().message());
      continue;
    }
    record.totals.Fold(pods[i].key, *readings[i]);
    refusals.insert(readings[i]->refusals.begin(), readings[i]->refusals.end());
    read.push_back(&pods[i]);
  }
  const int64_t now = NowUnix();
  record.totals.Prune(now);

  // 3. Alerts newly due, then commit.
  const json& status = Field(policy, "status");
  std::vector<AlertRecord> known = record.alerts;
  for (auto& a : ParseStatusAlerts(Field(status, "alerts"))) known.push_back(std::move(a));
  std::vector<AlertRecord> fresh = NewAlerts(record.totals, budget, known, now, refusals);
  for (auto& a : fresh) record.alerts.push_back(std::move(a));
  std::erase_if(record.alerts, [now](const AlertRecord& a) {
    return a.period_start != PeriodStart(a.period, now) && (a.delivered || a.abandoned);
  });
  const int64_t replicas = static_cast<int64_t>(pods.size());
  auto commit = [&]() -> Status {
    json data = BudgetRecordData(record, name, replicas, now);
    size_t bytes = 0;
    for (const auto& [k, v] : data.items()) bytes += k.size() + v.get_ref<const std::string&>().size();
    if (bytes > kConfigMapLimit)
      return Fail(Error::ResourceExhausted(where + " would hold " + std::to_string(bytes) +
                                           " bytes, past the API server's 1 MiB: too many pods x tenants x tiers "
                                           "for one policy"));
    const json annotations = {{kBudgetRecordNamespace, ns}, {kBudgetRecordPolicy, name},
                              {kBudgetRecordPolicyUid, UidOf(policy)}};
    if (cm) {
      json updated = *cm;
      updated["data"] = data;
      updated["metadata"]["annotations"] = annotations;
      updated["metadata"].erase("managedFields");
      MOE_ASSIGN_OR_RETURN(cm, client_.Update(resources::kConfigMap, updated));
    } else {
      // No owner reference can reach a QuotaPolicy in another namespace: the
      // annotations say whose record it is.
      json object = {{"apiVersion", "v1"},
                     {"kind", "ConfigMap"},
                     {"metadata",
                      {{"name", record_name},
                       {"namespace", record_ns},
                       {"labels", {{"app.kubernetes.io/managed-by", kManagedBy}, {kBudgetRecordLabel, "true"}}},
                       {"annotations", annotations}}},
                     {"data", data}};
      MOE_ASSIGN_OR_RETURN(cm, client_.Create(resources::kConfigMap, record_ns, object));
    }
    // The daemons' start-up copy of spend.json in the tenant's namespace:
    // written, never read back. A forged one misleads only a daemon that
    // starts before the next push (as a missing one would), nothing here.
    MOE_TRY(WriteSpendCopy(policy, data["spend.json"].get<std::string>()));
    return Ok();
  };
  MOE_TRY(commit());

  // 4. The global spend back to every daemon read.
  auto pushed = Parallel(read, options_.parallel, [&](const Pod* p) -> Status {
    json body = GlobalSpendJson(SpendFor(record.totals, name, replicas, now, p->key));
    auto put = DaemonPutJson(p->endpoint, "/v1/admin/spend", body, options_.request_timeout);
    if (!put) return Fail(put.error());
    return Ok();
  });
  uint64_t push_failed = 0;
  for (size_t i = 0; i < read.size(); ++i)
    if (!pushed[i]) {
      push_failed++;
      log::Warn("usage sync " + ns + "/" + name + ": pod " + read[i]->key + ": " + pushed[i].error().message());
    }

  // 5. Status: usage and alerts (those only status still holds are kept).
  auto write_status = [&]() -> Status {
    // The live object, listed by name (the operator lists and watches
    // QuotaPolicies; it has no need to get them otherwise).
    ListOptions by_name;
    by_name.field_selector = "metadata.name=" + name;
    for (int attempt = 0;; ++attempt) {
      MOE_ASSIGN_OR_RETURN(json listed, client_.List(resources::kQuotaPolicy, ns, by_name));
      const json& items = Field(listed, "items");
      if (!items.is_array() || items.empty()) return Fail(Error::NotFound("QuotaPolicy " + ns + "/" + name + " is gone"));
      json live = items[0];
      json st = Field(live, "status").is_object() ? live["status"] : json::object();
      std::vector<AlertRecord> shown = record.alerts;
      for (auto& a : ParseStatusAlerts(Field(st, "alerts"))) {
        auto same = [&](const AlertRecord& r) { return SameAlert(r, a); };
        if (a.period_start == PeriodStart(a.period, now) && std::none_of(shown.begin(), shown.end(), same))
          shown.push_back(std::move(a));
      }
      json next = st;
      next["usage"] = StatusUsage(record.totals);
      next["alerts"] = StatusAlerts(shown);
      if (next == st) return Ok();
      live["status"] = next;
      live["metadata"].erase("managedFields");
      auto written = client_.UpdateStatus(resources::kQuotaPolicy, live);
      if (written || written.error().code() != ErrorCode::kConflict || attempt >= 4)
        return written ? Ok() : Fail(written.error());
    }
  };
  MOE_TRY(write_status());
  {
    std::lock_guard lock(stats_mu_);
    stats_.syncs++;
    stats_.pods_read += read.size();
    stats_.pods_failed += failed;
    stats_.pushes_failed += push_failed;
    stats_.alerts_fired += fresh.size();
  }

  // 6. Deliveries.
  if (Deliver(policy, budget, record.alerts)) {
    MOE_TRY(commit());
    MOE_TRY(write_status());
  }
  return Ok();
}

bool UsageSync::Deliver(const json& policy, BudgetPolicy& budget, std::vector<AlertRecord>& alerts) {
  const std::string ns = NamespaceOf(policy);
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  bool changed = false;
  std::set<std::string> secrets_read;
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  for (auto& a : alerts) {
    if (a.delivered || a.abandoned) continue;
    if (now - static_cast<double>(a.fired_at) > options_.hook_give_up_s) {
      log::Warn("usage sync: alert " + a.delivery_id + " for tenant " + a.tenant + " given up after " +
                std::to_string(static_cast<int64_t>(options_.hook_give_up_s)) + " s");
      a.abandoned = true;
      retry_.erase(a.delivery_id);
      changed = true;
      continue;
    }
    auto& [attempts, next_at] = retry_[a.delivery_id];
    if (next_at > now) continue;
    bool all = true;
    for (auto& hook : budget.hooks) {
      if (std::find(a.delivered_to.begin(), a.delivered_to.end(), hook.name) != a.delivered_to.end()) continue;
      // A hook whose format was not in use when the alert fired was not there to tell.
      if (std::find(a.formats.begin(), a.formats.end(), FormatName(hook.format)) == a.formats.end()) continue;
      if (hook.secret.empty() && !secrets_read.contains(hook.name)) {
        secrets_read.insert(hook.name);
        SecretReference ref;
        ref.secret_name = hook.secret_name;
        ref.vault_path = hook.secret_vault_path;
        auto fetched = hook_secrets_.Fetch(ns, ref);
        if (!fetched) {
          log::Warn("usage sync: hook '" + hook.name + "' of QuotaPolicy " + ns + "/" + budget.policy_name +
                    ": its secret cannot be read: " + fetched.error().message());
        } else if (fetched->count("secret")) {
          hook.secret = fetched->at("secret");
        } else if (fetched->size() == 1) {
          hook.secret = fetched->begin()->second;
        } else {
          log::Warn("usage sync: hook '" + hook.name + "': its secret needs a key named `secret`");
        }
      }
      if (hook.secret.empty()) {
        all = false;
        continue;
      }
      // Rebuilt from the record, never read back: what is signed is what the operator decided.
      const std::string body = AlertBodyOf(a, budget.policy_name, hook.format);
      HookSendResult r = SendHook(hook, a.delivery_id, body, std::chrono::duration<double>(options_.request_timeout).count());
      std::lock_guard lock(stats_mu_);
      if (r.delivered) {
        a.delivered_to.push_back(hook.name);
        stats_.deliveries++;
        changed = true;
      } else {
        all = false;
        stats_.delivery_failures++;
        log::Warn("usage sync: alert " + a.delivery_id + ": " + r.error);
      }
    }
    if (all) {
      a.delivered = true;
      retry_.erase(a.delivery_id);
      changed = true;
    } else {
      attempts++;
      const double wait = std::min(options_.hook_max_backoff_s, options_.hook_initial_backoff_s * std::pow(2.0, attempts - 1));
      next_at = now + std::uniform_real_distribution<double>(wait / 2, wait)(rng);
    }
  }
  return changed;
}

}  // namespace moeserve::op
