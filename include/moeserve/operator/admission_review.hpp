// admission.k8s.io/v1 AdmissionReview: reading a request from an untrusted
// HTTP body and writing the response the API server expects.
//
// The body is held to kMaxAdmissionReviewBytes and kMaxJsonDepth before it is
// parsed (common/json_limits), and every field is type-checked: a body that
// is too big, too deep, not JSON, or of the wrong shape is an InvalidArgument
// that names what is wrong, never an exception.
//
// Thread safety: pure functions over values.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::op {

using nlohmann::json;

// The API server sends at most its 3 MiB request limit twice (object and
// oldObject) plus the review around them.
inline constexpr size_t kMaxAdmissionReviewBytes = 7 * 1024 * 1024;

struct AdmissionRequest {
  std::string uid;
  std::string group, version, resource, sub_resource;  // request.resource, request.subResource
  std::string kind;                                     // request.kind.kind
  std::string operation;                                // CREATE, UPDATE, DELETE, CONNECT
  std::string ns, name;
  json object, old_object;  // null when absent
  bool dry_run = false;
};

// Errors: InvalidArgument naming the field ("request.uid: missing").
Result<AdmissionRequest> ParseAdmissionReview(std::string_view body);

// The review to answer with. `code` and `message` are used when refused
// (403 and the reason for a quota refusal).
json AdmissionResponse(const std::string& uid, bool allowed, int code = 200, const std::string& message = "");

}  // namespace moeserve::op
