#include "moeserve/operator/autoscaler.hpp"

#include <algorithm>
#include <future>

#include "moeserve/common/base64.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/common/rfc3339.hpp"
#include "moeserve/operator/json_fields.hpp"
#include "moeserve/operator/moedeployment.hpp"

namespace moeserve::op {

namespace {

using fields::Field;
using fields::NameOf;
using fields::NamespaceOf;
using fields::Str;

std::string UidOf(const json& o) { return Str(Field(o, "metadata"), "uid"); }

std::string ControllerUid(const json& o, const std::string& kind, const std::string& name) {
  const json& refs = Field(Field(o, "metadata"), "ownerReferences");
  if (!refs.is_array()) return "";
  for (const auto& r : refs)
    if (Str(r, "kind") == kind && Str(r, "name") == name && Field(r, "controller") == json(true)) return Str(r, "uid");
  return "";
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sets a condition as the API conventions say: lastTransitionTime moves only when status does.
void SetCondition(json& conditions, const std::string& type, const std::string& status, const std::string& reason,
                  const std::string& message, int64_t generation) {
  json condition = {{"type", type},       {"status", status},   {"reason", reason},
                    {"message", message}, {"observedGeneration", generation}};
  for (auto& c : conditions) {
    if (!c.is_object() || c.value("type", "") != type) continue;
    condition["lastTransitionTime"] =
        c.value("status", "") == status ? c.value("lastTransitionTime", NowRfc3339()) : NowRfc3339();
    c = condition;
    return;
  }
  condition["lastTransitionTime"] = NowRfc3339();
  conditions.push_back(condition);
}

}  // namespace

Autoscaler::Autoscaler(KubeClient& client, Caches caches, EventRecorder* events, AutoscalerOptions options)
    : client_(client), caches_(caches), events_(events), options_(options) {}

Autoscaler::~Autoscaler() { Stop(); }

void Autoscaler::Start() {
  if (options_.interval.count() <= 0 || thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      try {
        RunOnce();
      } catch (const std::exception& e) {
        // A bug costs one interval, never the operator.
        log::Error(std::string("autoscaler: unexpected exception: ") + e.what());
      }
      lock.lock();
      cv_.wait_for(lock, options_.interval, [this] { return stop_; });
    }
  });
}

void Autoscaler::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // A new term starts its windows afresh.
  memory_.clear();
}

AutoscalerStats Autoscaler::stats() const {
  std::lock_guard lock(stats_mu_);
  return stats_;
}

std::map<std::string, DaemonLoadReading> Autoscaler::ReadGroups(const json& md, bool tls, int port) {
  std::map<std::string, DaemonLoadReading> readings;
  const std::string ns = NamespaceOf(md), name = NameOf(md), uid = UidOf(md);
  auto secret = caches_.secrets->Get(ns + "/" + desired::SecretName(md));
  if (!secret || ControllerUid(*secret, "MoEDeployment", name) != uid) return readings;
  const json& data = Field(*secret, "data");
  DaemonEndpoint endpoint;
  endpoint.admin_key = Base64Decode(Str(data, kMetricsTokenKey));
  if (endpoint.admin_key.empty()) return readings;
  if (tls) endpoint.ca_pem = Base64Decode(Str(data, kTlsCertKey));
  ListOptions list;
  list.label_selector = "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=daemon";
  auto listed = client_.List(resources::kPod, ns, list);
  if (!listed) {
    log::Warn("autoscaler: pods of " + ns + "/" + name + ": " + listed.error().message());
    return readings;
  }
  std::vector<std::pair<std::string, DaemonEndpoint>> pods;  // group -> endpoint
  const json& items = Field(*listed, "items");
  for (const auto& pod : items.is_array() ? items : json::array()) {
    const std::string pod_name = NameOf(pod);
    if (pod_name.size() < 3 || !pod_name.ends_with("-0")) continue;
    const std::string group = pod_name.substr(0, pod_name.size() - 2);
    if (!group.starts_with(name + "-r")) continue;
    auto sts = caches_.statefulsets->Get(ns + "/" + group);
    if (!sts || ControllerUid(*sts, "MoEDeployment", name) != uid) continue;
    if (ControllerUid(pod, "StatefulSet", group) != UidOf(*sts)) continue;
    const std::string ip = Str(Field(pod, "status"), "podIP");
    // A pod on its way out is draining: its load is leaving with it.
    if (ip.empty() || Field(Field(pod, "metadata"), "deletionTimestamp").is_string()) continue;
    DaemonEndpoint e = endpoint;
    const std::string host = ip.find(':') != std::string::npos ? "[" + ip + "]" : ip;
    e.base_url = std::string(tls ? "https" : "http") + "://" + host + ":" + std::to_string(port);
    pods.emplace_back(group, std::move(e));
  }
  std::vector<std::future<Result<DaemonLoadReading>>> pending;
  uint64_t ok = 0, failed = 0;
  for (size_t i = 0; i < pods.size(); i += static_cast<size_t>(std::max(1, options_.parallel))) {
    pending.clear();
    const size_t end = std::min(pods.size(), i + static_cast<size_t>(std::max(1, options_.parallel)));
    for (size_t j = i; j < end; ++j)
      pending.push_back(std::async(std::launch::async, [this, &pods, j]() -> Result<DaemonLoadReading> {
        MOE_ASSIGN_OR_RETURN(std::string text, DaemonGetText(pods[j].second, "/metrics", options_.request_timeout));
        return ParseDaemonLoad(text);
      }));
    for (size_t j = i; j < end; ++j) {
      auto r = pending[j - i].get();
      if (!r) {
        failed++;
        log::Warn("autoscaler: " + ns + "/" + pods[j].first + "-0: " + r.error().message());
        continue;
      }
      ok++;
      readings[pods[j].first] = std::move(*r);
    }
  }
  std::lock_guard lock(stats_mu_);
  stats_.pods_read += ok;
  stats_.pods_failed += failed;
  return readings;
}

void Autoscaler::RunOnce() {
  std::map<std::string, bool> seen;
  for (const auto& md : caches_.moedeployments->List()) {
    if (Field(Field(md, "metadata"), "deletionTimestamp").is_string()) continue;
    auto spec = ParseMoEDeploymentSpec(Field(md, "spec"));
    if (!spec || !spec->autoscaling.enabled) continue;
    const std::string uid = UidOf(md);
    seen[uid] = true;
    AutoscalingSpec a = spec->autoscaling;
    a.tolerance = options_.tolerance;
    a.ttft_window_seconds = options_.ttft_window_seconds;
    auto it = memory_.find(uid);
    if (it == memory_.end()) it = memory_.emplace(uid, Memory(a.ttft_window_seconds)).first;
    (void)it;
    ScaleOne(md, a, spec->replicas, NowSeconds());
  }
  for (auto it = memory_.begin(); it != memory_.end();) it = seen.contains(it->first) ? std::next(it) : memory_.erase(it);
}

void Autoscaler::ScaleOne(const json& md, const AutoscalingSpec& spec, int replicas, double now) {
  const std::string ns = NamespaceOf(md), name = NameOf(md), key = ns + "/" + name;
  auto parsed = ParseMoEDeploymentSpec(Field(md, "spec"));
  Memory& memory = memory_.at(UidOf(md));
  LoadSample sample = memory.load.Add(now, ReadGroups(md, !parsed->tls_secret.empty(), parsed->port));
  AutoscaleDecision d = DecideReplicas(spec, replicas, sample, memory.history);
  {
    std::lock_guard lock(stats_mu_);
    stats_.decisions++;
    stats_.replicas[key] = {replicas, d.desired};
  }
  std::string cond_status = "True", cond_reason = d.reason, cond_message = d.reason + ": " + d.message;
  bool scaled = false;
  // Scale-up asks for the whole step first; where quota refuses it, one
  // group less, down to one more than now: the deployment grows as far as
  // the policy allows, and the refusal of the rest is shown.
  std::string refusal;
  bool refused_by_policy = false;
  const std::string resource_version = Str(Field(md, "metadata"), "resourceVersion");
  std::string scaled_version;
  for (int target = d.desired; target != replicas; target += (d.desired > replicas ? -1 : 0)) {
    const json patch = {{"metadata", {{"resourceVersion", resource_version}}}, {"spec", {{"replicas", target}}}};
    auto written = client_.Patch(resources::kMoEDeployment, ns, name, "application/merge-patch+json", patch, "scale");
    const std::string step = std::to_string(replicas) + " -> " + std::to_string(target) + " replica groups";
    if (written) {
      scaled = true;
      d.desired = target;
      // The Scale answer carries the object's new resourceVersion: the
      // status write below goes on from it without reading the object again.
      scaled_version = Str(Field(*written, "metadata"), "resourceVersion");
      log::Info("autoscaler: " + key + ": " + step + " (" + d.reason + ": " + d.message + ")");
      if (events_)
        events_->Record(md, "Normal", target > replicas ? "AutoscaledUp" : "AutoscaledDown", step + ": " + d.message);
      std::lock_guard lock(stats_mu_);
      (target > replicas ? stats_.scale_ups : stats_.scale_downs)++;
      break;
    }
    // The object moved since the decision: decide again on the next interval.
    if (written.error().code() == ErrorCode::kConflict) return;
    const bool refused = written.error().code() == ErrorCode::kPermissionDenied ||
                         written.error().code() == ErrorCode::kInvalidArgument;
    {
      std::lock_guard lock(stats_mu_);
      (refused ? stats_.refusals : stats_.errors)++;
    }
    if (refusal.empty()) {
      refusal = "scaling " + step + " was refused: " + written.error().message();
      refused_by_policy = refused;
    }
    log::Warn("autoscaler: " + key + ": scaling " + step + ": " + written.error().message());
    if (!refused || d.desired < replicas) break;  // only a refused scale-up tries a smaller step
  }
  if (!refusal.empty()) {
    cond_status = "False";
    cond_reason = refused_by_policy ? "QuotaRefused" : "ScaleFailed";
    cond_message = (scaled ? "scaled to " + std::to_string(d.desired) + "; " : std::string()) + refusal;
    // One Event per new refusal, not one per interval.
    const json& conditions = Field(Field(md, "status"), "conditions");
    bool already = false;
    for (const auto& c : conditions.is_array() ? conditions : json::array())
      already |= Str(c, "type") == "Autoscaling" && Str(c, "reason") == cond_reason && Str(c, "message") == cond_message;
    if (events_ && !already)
      events_->Record(md, "Warning", refused_by_policy ? "AutoscaleRefused" : "AutoscaleFailed", cond_message);
    if (!scaled) d.desired = replicas;
  }
  json base = md;
  if (scaled && !scaled_version.empty()) {
    base["metadata"]["resourceVersion"] = scaled_version;
    base["spec"]["replicas"] = d.desired;
  }
  if (auto st = WriteStatus(base, d, scaled ? d.desired : replicas, cond_status, cond_reason, cond_message, scaled);
      !st) {
    log::Warn("autoscaler: " + key + ": status: " + st.error().message());
    if (st.error().code() != ErrorCode::kConflict) {
      std::lock_guard lock(stats_mu_);
      stats_.errors++;
    }
  }
}

Status Autoscaler::WriteStatus(const json& md, const AutoscaleDecision& d, int current,
                               const std::string& condition_status, const std::string& condition_reason,
                               const std::string& condition_message, bool scaled) {
  // The informer's copy (or what the scale write answered): a copy the
  // reconciler has written since is refused with a conflict and the status
  // is written on the next interval.
  json object = md;
  json status = object.value("status", json::object());
  if (!status.is_object()) status = json::object();
  const json old = status;
  json autoscaling = status.value("autoscaling", json::object());
  if (!autoscaling.is_object()) autoscaling = json::object();
  const bool changed = autoscaling.value("lastDecision", "") != d.reason ||
                       autoscaling.value("currentReplicas", -1) != current ||
                       autoscaling.value("desiredReplicas", -1) != d.desired;
  if (changed) {
    autoscaling["currentReplicas"] = current;
    autoscaling["desiredReplicas"] = d.desired;
    autoscaling["lastDecision"] = d.reason;
    autoscaling["message"] = d.message;
    autoscaling["lastDecisionTime"] = NowRfc3339();
  }
  if (scaled) autoscaling["lastScaleTime"] = NowRfc3339();
  status["autoscaling"] = autoscaling;
  json conditions = status.value("conditions", json::array());
  if (!conditions.is_array()) conditions = json::array();
  // The condition's message changes only with its reason: the figures live in status.autoscaling.
  const json* existing = nullptr;
  for (const auto& c : conditions)
    if (c.is_object() && c.value("type", "") == "Autoscaling") existing = &c;
  const bool same_condition = existing && existing->value("status", "") == condition_status &&
                              existing->value("reason", "") == condition_reason;
  if (!same_condition || condition_status == "False") {
    SetCondition(conditions, "Autoscaling", condition_status, condition_reason, condition_message,
                 Field(object, "metadata").value("generation", int64_t{0}));
    status["conditions"] = conditions;
  }
  if (status == old) return Ok();
  object["status"] = status;
  MOE_ASSIGN_OR_RETURN(json written, client_.UpdateStatus(resources::kMoEDeployment, object));
  (void)written;
  return Ok();
}

}  // namespace moeserve::op
