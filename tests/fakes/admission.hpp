// Validating admission for the API double: what kube-apiserver does with
// admissionregistration.k8s.io/v1 ValidatingWebhookConfigurations on a
// write. FakeApiServer calls Admit (without its lock held) for create and
// update of an object and for its scale subresource, with the object as the
// write would store it.
//
// Matching: every webhook whose rules match the request's group, version,
// resource ("moedeployments", "moedeployments/scale", "*", "*/*",
// "moedeployments/*") and operation (CREATE, UPDATE or "*"); webhooks are
// called in configuration-name order, then list order, and the first refusal
// wins. namespaceSelector, objectSelector and matchPolicy are not read.
//
// Transport: HTTPS with OpenSSL, the server certificate verified against
// clientConfig.caBundle and the host name. clientConfig.url is called as
// written; clientConfig.service {namespace, name, port, path} is called as
// https://<name>.<namespace>.svc:<port><path>, verified for that name, and
// connected to 127.0.0.1 at the ports MapService gave it (as a Service's
// endpoints: tried in turn from a rotating start, a refused connection
// falls through to the next; none mapped is a failed call).
//
// Answers, as kube-apiserver gives them: allowed -> the write goes on;
// refused -> status.code (403 by default) with `admission webhook "<name>"
// denied the request: <status.message>`; a failed call (connect, TLS,
// timeoutSeconds, non-200, unreadable review, wrong uid) -> with
// failurePolicy Fail (the default) 500 `Internal error occurred: failed
// calling webhook "<name>": <why>`, with Ignore the webhook is skipped.
//
// Thread safety: any thread; calls to webhooks run in parallel.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::fakes {

struct AdmissionAttributes {
  std::string group, version, resource, subresource;  // what was written
  std::string kind_group, kind_version, kind;         // the object's kind (autoscaling/v1 Scale for scale)
  std::string operation;                              // CREATE or UPDATE
  std::string ns, name;
  std::string username;
  bool dry_run = false;
  nlohmann::json object, old_object;
};

struct AdmissionVerdict {
  bool allowed = true;
  int code = 200;
  std::string reason, message;  // for a Status body when refused
};

struct WebhookCall {
  std::string webhook;
  std::string operation, resource, subresource;
  bool allowed = false;
  bool failed = false;  // the call itself failed
  std::string error;
};

class WebhookAdmission {
 public:
  // Endpoints of a Service on 127.0.0.1; an empty list removes it.
  void MapService(const std::string& ns, const std::string& name, std::vector<int> ports);
  AdmissionVerdict Admit(const std::vector<nlohmann::json>& configurations, const AdmissionAttributes& attrs);
  std::vector<WebhookCall> Calls() const;

 private:
  struct Target {
    std::string host;  // verified name
    std::vector<int> ports;
    std::string path;
  };
  bool ResolveTarget(const nlohmann::json& client_config, Target& target, std::string& error);

  mutable std::mutex mu_;
  std::map<std::string, std::vector<int>> services_;  // "ns/name"
  size_t rotation_ = 0;
  std::vector<WebhookCall> calls_;
};

// True when the rule's resources entry matches resource and subresource.
bool WebhookResourceMatches(const std::string& pattern, const std::string& resource, const std::string& subresource);

}  // namespace moeserve::fakes
