#include "moeserve/operator/admission_review.hpp"

#include "moeserve/common/json_limits.hpp"

namespace moeserve::op {
namespace {

// A string field that may be absent (""), but is a string when present.
Status ReadString(const json& from, const char* key, const std::string& where, std::string& out) {
  if (!from.contains(key) || from[key].is_null()) return Ok();
  if (!from[key].is_string()) return Fail(Error::InvalidArgument(where + key + ": not a string"));
  out = from[key].get<std::string>();
  return Ok();
}

}  // namespace

Result<AdmissionRequest> ParseAdmissionReview(std::string_view body) {
  JsonLimits limits;
  limits.max_bytes = kMaxAdmissionReviewBytes;
  limits.max_depth = kMaxJsonDepth;
  MOE_ASSIGN_OR_RETURN(json review, ParseJsonBounded<json>(body, limits, "AdmissionReview"));
  if (!review.is_object()) return Fail(Error::InvalidArgument("AdmissionReview: not a JSON object"));
  if (review.value("apiVersion", json()) != "admission.k8s.io/v1" || review.value("kind", json()) != "AdmissionReview")
    return Fail(Error::InvalidArgument("AdmissionReview: apiVersion must be admission.k8s.io/v1 and kind AdmissionReview"));
  if (!review.contains("request") || !review["request"].is_object())
    return Fail(Error::InvalidArgument("request: missing or not an object"));
  const json& r = review["request"];
  AdmissionRequest out;
  MOE_TRY(ReadString(r, "uid", "request.", out.uid));
  if (out.uid.empty()) return Fail(Error::InvalidArgument("request.uid: missing"));
  MOE_TRY(ReadString(r, "operation", "request.", out.operation));
  if (out.operation.empty()) return Fail(Error::InvalidArgument("request.operation: missing"));
  MOE_TRY(ReadString(r, "subResource", "request.", out.sub_resource));
  MOE_TRY(ReadString(r, "namespace", "request.", out.ns));
  MOE_TRY(ReadString(r, "name", "request.", out.name));
  for (const char* key : {"resource", "kind"}) {
    if (!r.contains(key)) return Fail(Error::InvalidArgument(std::string("request.") + key + ": missing"));
    if (!r[key].is_object()) return Fail(Error::InvalidArgument(std::string("request.") + key + ": not an object"));
  }
  const std::string resource_at = "request.resource.";
  MOE_TRY(ReadString(r["resource"], "group", resource_at, out.group));
  MOE_TRY(ReadString(r["resource"], "version", resource_at, out.version));
  MOE_TRY(ReadString(r["resource"], "resource", resource_at, out.resource));
  MOE_TRY(ReadString(r["kind"], "kind", "request.kind.", out.kind));
  for (auto [key, dest] : {std::pair{"object", &out.object}, std::pair{"oldObject", &out.old_object}}) {
    if (!r.contains(key) || r[key].is_null()) continue;
    if (!r[key].is_object()) return Fail(Error::InvalidArgument(std::string("request.") + key + ": not an object"));
    if (r[key].contains("metadata") && !r[key]["metadata"].is_object())
      return Fail(Error::InvalidArgument(std::string("request.") + key + ".metadata: not an object"));
    *dest = r[key];
  }
  if (r.contains("dryRun") && !r["dryRun"].is_null()) {
    if (!r["dryRun"].is_boolean()) return Fail(Error::InvalidArgument("request.dryRun: not a boolean"));
    out.dry_run = r["dryRun"].get<bool>();
  }
  return out;
}

json AdmissionResponse(const std::string& uid, bool allowed, int code, const std::string& message) {
  json response = {{"uid", uid}, {"allowed", allowed}};
  if (!allowed)
    response["status"] = {{"code", code},
                          {"reason", code == 403 ? "Forbidden" : code == 400 ? "BadRequest" : "InternalError"},
                          {"message", message}};
  return {{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"response", response}};
}

}  // namespace moeserve::op
