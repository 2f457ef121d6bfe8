// The quota webhook's review path: QuotaAdmission::Review over one policy
// (team-a, maxGPUs 16, allowedImages registry/) and one stored deployment.
// Input: an HTTP request body. Checked for every input:
//   - it returns (no exception, no crash) with HTTP 200 or 400;
//   - 400 is a v1 Status whose message says the review could not be read,
//     and happens exactly when ParseAdmissionReview refuses the body;
//   - 200 is an admission.k8s.io/v1 AdmissionReview answering the request's
//     own uid with a boolean allowed; a refusal carries a code of 400, 403,
//     404 or 503 and a message.
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
#include "moeserve/operator/quota_admission.hpp"

using namespace moeserve;
using namespace moeserve::op;

namespace {

struct Fixture {
  ObjectCache policies, deployments;
  QuotaAdmission admission{policies, deployments};
  Fixture() {
    policies.Upsert({{"metadata", {{"name", "team-a"}, {"namespace", "team-a"}}},
                     {"spec", {{"limits", {{"maxGPUs", 16}, {"allowedImages", {"registry/"}}}}}}});
    deployments.Upsert({{"metadata", {{"name", "md"}, {"namespace", "team-a"}, {"creationTimestamp", "2026-12-01T00:00:00Z"}}},
                        {"spec",
                         {{"image", "registry/d:1"},
                          {"model", {{"uri", "s3://m/"}}},
                          {"parallelism", {{"nodesPerReplica", 1}, {"gpusPerNode", 8}}},
                          {"replicas", 1},
                          {"quotaPolicyRef", {{"name", "team-a"}}}}}});
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture fixture;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const AdmissionHttpAnswer answer = fixture.admission.Review(body);
  const auto request = ParseAdmissionReview(body);
  const json out = json::parse(answer.body, nullptr, false);
  FUZZ_CHECK(out.is_object(), "the answer is not a JSON object: " + answer.body.substr(0, 200));
  if (answer.http_status == 400) {
    FUZZ_CHECK(!request.has_value(), "a readable review was answered 400");
    FUZZ_CHECK(out.value("kind", "") == "Status" && out.value("code", 0) == 400, out.dump());
    FUZZ_CHECK(out.value("message", "").rfind("cannot read the AdmissionReview: ", 0) == 0, out.dump());
    return 0;
  }
  FUZZ_CHECK(answer.http_status == 200, "HTTP " + std::to_string(answer.http_status));
  FUZZ_CHECK(request.has_value(), "an unreadable review was answered 200");
  FUZZ_CHECK(out.value("apiVersion", "") == "admission.k8s.io/v1" && out.value("kind", "") == "AdmissionReview",
             out.dump());
  const json response = out.value("response", json());
  FUZZ_CHECK(response.is_object() && response.value("uid", json()) == request->uid, "uid not echoed");
  FUZZ_CHECK(response.value("allowed", json()).is_boolean(), "allowed is not a boolean");
  if (!response["allowed"].get<bool>()) {
    const json status = response.value("status", json());
    FUZZ_CHECK(status.is_object(), "a refusal without status");
    const int code = status.value("code", 0);
    FUZZ_CHECK(code == 400 || code == 403 || code == 404 || code == 503, "code " + std::to_string(code));
    FUZZ_CHECK(!status.value("message", "").empty(), "a refusal without a message");
  }
  return 0;
}
