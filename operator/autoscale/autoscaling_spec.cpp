// spec.autoscaling: read and checked here so that the webhook, the
// reconciler and the autoscaler refuse the same things with the same words.
#include <cmath>

#include "moeserve/operator/autoscaling.hpp"

namespace moeserve::op {

namespace {

using nlohmann::json;

constexpr char kField[] = "spec.autoscaling";

std::string FieldName(const std::string& sub) { return std::string(kField) + "." + sub; }

// A number field: absent keeps `out`; present must be a finite number in [lo, hi].
Status ReadNumber(const json& object, const std::string& key, const std::string& name, double lo, double hi,
                  double& out) {
  if (!object.contains(key) || object[key].is_null()) return Ok();
  const json& v = object[key];
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    return Fail(Error::InvalidArgument(name + ": must be a number"));
  const double d = v.get<double>();
  if (d < lo || d > hi)
    return Fail(Error::InvalidArgument(name + ": must be between " + json(lo).dump() + " and " + json(hi).dump() +
                                       " (got " + v.dump() + ")"));
  out = d;
  return Ok();
}

Status ReadCount(const json& object, const std::string& key, const std::string& name, int lo, int& out) {
  if (!object.contains(key) || object[key].is_null()) return Ok();
  const json& v = object[key];
  if (!v.is_number_integer()) return Fail(Error::InvalidArgument(name + ": must be an integer"));
  const int64_t n = v.get<int64_t>();
  if (n < lo || n > 100000)
    return Fail(Error::InvalidArgument(name + ": must be between " + std::to_string(lo) + " and 100000 (got " +
                                       v.dump() + ")"));
  out = static_cast<int>(n);
  return Ok();
}

}  // namespace

Result<AutoscalingSpec> ParseAutoscalingSpec(const json& autoscaling) {
  AutoscalingSpec s;
  if (autoscaling.is_null()) return s;
  if (!autoscaling.is_object()) return Fail(Error::InvalidArgument(std::string(kField) + ": must be an object"));
  // A block that is written down is meant to act, unless it says otherwise.
  s.enabled = true;
  if (autoscaling.contains("enabled")) {
    if (!autoscaling["enabled"].is_boolean())
      return Fail(Error::InvalidArgument(FieldName("enabled") + ": must be true or false"));
    s.enabled = autoscaling["enabled"].get<bool>();
  }
  MOE_TRY(ReadCount(autoscaling, "minReplicas", FieldName("minReplicas"), 1, s.min_replicas));
  s.max_replicas = s.min_replicas;
  MOE_TRY(ReadCount(autoscaling, "maxReplicas", FieldName("maxReplicas"), 1, s.max_replicas));
  if (s.max_replicas < s.min_replicas)
    return Fail(Error::InvalidArgument(FieldName("maxReplicas") + ": must be >= " + FieldName("minReplicas") + " (" +
                                       std::to_string(s.max_replicas) + " < " + std::to_string(s.min_replicas) + ")"));
  const json targets = autoscaling.value("targets", json::object());
  if (!targets.is_object()) return Fail(Error::InvalidArgument(FieldName("targets") + ": must be an object"));
  MOE_TRY(ReadNumber(targets, "waitingRequestsPerReplica", FieldName("targets.waitingRequestsPerReplica"), 0, 1e6,
                     s.waiting_requests_per_replica));
  MOE_TRY(ReadNumber(targets, "ttftP90Seconds", FieldName("targets.ttftP90Seconds"), 0, 3600, s.ttft_p90_seconds));
  MOE_TRY(ReadNumber(targets, "kvCacheUsage", FieldName("targets.kvCacheUsage"), 0, 1, s.kv_cache_usage));
  MOE_TRY(ReadNumber(autoscaling, "scaleUpStabilizationSeconds", FieldName("scaleUpStabilizationSeconds"), 0, 3600,
                     s.scale_up_stabilization_seconds));
  MOE_TRY(ReadNumber(autoscaling, "scaleDownDelaySeconds", FieldName("scaleDownDelaySeconds"), 0, 86400,
                     s.scale_down_delay_seconds));
  if (s.enabled && s.waiting_requests_per_replica <= 0 && s.ttft_p90_seconds <= 0 && s.kv_cache_usage <= 0)
    return Fail(Error::InvalidArgument(FieldName("targets") +
                                       ": set at least one of waitingRequestsPerReplica, ttftP90Seconds, kvCacheUsage "
                                       "(each > 0)"));
  return s;
}

}  // namespace moeserve::op
