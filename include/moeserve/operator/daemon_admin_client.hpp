// The operator's calls to a daemon pod's admin API, with the operator's
// admin key: GET /v1/usage (every tenant's rows) and PUT /v1/admin/spend
// (the global spend, global_spend.hpp); and GET /metrics with the metrics
// token (the autoscaler). Pods are reached by IP, so for an
// HTTPS daemon the certificate is checked against the deployment's own
// certificate (the tls.crt copied into its Secret, trusted as it is) and not
// against a host name. Proxies from the environment are not used, redirects
// are not followed, the answer is bounded (16 MiB).
//
// Errors: kUnavailable (no connection, timeout, 5xx), kPermissionDenied
// (401/403: the admin key is not the daemon's), kInvalidArgument (another
// 4xx, or an answer that is not JSON); messages name the URL and the daemon's
// error message, never the key.
//
// Thread safety: any thread; each call is independent.
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::op {

struct DaemonEndpoint {
  std::string base_url;   // http(s)://<pod IP>:<port>
  std::string admin_key;  // never logged
  std::string ca_pem;     // https: the certificate(s) to trust; empty for http
};

Result<nlohmann::json> DaemonGetJson(const DaemonEndpoint& d, const std::string& path, std::chrono::milliseconds timeout);
// The body as text (/metrics, Prometheus text format); `admin_key` carries
// whichever bearer token the path wants (the metrics token for /metrics).
Result<std::string> DaemonGetText(const DaemonEndpoint& d, const std::string& path, std::chrono::milliseconds timeout);
Result<nlohmann::json> DaemonPutJson(const DaemonEndpoint& d, const std::string& path, const nlohmann::json& body,
                                     std::chrono::milliseconds timeout);

}  // namespace moeserve::op
