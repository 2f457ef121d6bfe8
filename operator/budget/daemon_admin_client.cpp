#include "moeserve/operator/daemon_admin_client.hpp"

#include "moeserve/http_client/curl_easy.hpp"

namespace moeserve::op {

namespace {

// The answer's body once the status is 2xx.
Result<std::string> CallText(const DaemonEndpoint& d, const std::string& method, const std::string& path,
                             const std::string& body, std::chrono::milliseconds timeout) {
  const std::string url = d.base_url + path;
  http_client::CurlCall call;
  call.method = method;
  call.url = url;
  call.headers = {"Authorization: Bearer " + d.admin_key, "Content-Type: application/json", "Expect:"};
  if (method != "GET") call.body = body;
  call.max_answer_bytes = 16 << 20;
  http_client::CurlPolicy policy;
  policy.timeout = policy.connect_timeout = timeout;
  policy.max_redirects = 0;
  policy.proxy = http_client::Proxy::kNever;
  policy.protocols = "http,https";
  policy.user_agent = "moe-operator/usage-sync";
  // The deployment's own certificate is the trust anchor; the pod IP is no name in it.
  policy.ca_pem = d.ca_pem;
  policy.verify_host = d.ca_pem.empty();
  const http_client::CurlAnswer answer = http_client::CurlFetch(call, policy);
  const long status = answer.status;
  const std::string what = method + " " + url;
  if (answer.too_large) return Fail(Error::InvalidArgument(what + ": the answer is larger than 16 MiB"));
  if (answer.code != CURLE_OK) return Fail(Error::Unavailable(what + ": " + answer.error));
  auto parsed = nlohmann::json::parse(answer.body, nullptr, false);
  if (status < 200 || status >= 300) {
    std::string message = "HTTP " + std::to_string(status);
    if (!parsed.is_discarded() && parsed.is_object() && parsed.contains("error") && parsed["error"].is_object() &&
        parsed["error"].value("message", nlohmann::json()).is_string())
      message += ": " + parsed["error"]["message"].get<std::string>().substr(0, 512);
    if (status == 401 || status == 403) return Fail(Error::PermissionDenied(what + ": " + message));
    if (status >= 500 || status == 429) return Fail(Error::Unavailable(what + ": " + message));
    return Fail(Error::InvalidArgument(what + ": " + message));
  }
  return answer.body;
}

Result<nlohmann::json> Call(const DaemonEndpoint& d, const std::string& method, const std::string& path,
                            const std::string& body, std::chrono::milliseconds timeout) {
  MOE_ASSIGN_OR_RETURN(std::string text, CallText(d, method, path, body, timeout));
  auto parsed = nlohmann::json::parse(text, nullptr, false);
  if (parsed.is_discarded())
    return Fail(Error::InvalidArgument(method + " " + d.base_url + path + ": the answer is not JSON"));
  return parsed;
}

}  // namespace

Result<nlohmann::json> DaemonGetJson(const DaemonEndpoint& d, const std::string& path, std::chrono::milliseconds timeout) {
  return Call(d, "GET", path, "", timeout);
}

Result<std::string> DaemonGetText(const DaemonEndpoint& d, const std::string& path, std::chrono::milliseconds timeout) {
  return CallText(d, "GET", path, "", timeout);
}

Result<nlohmann::json> DaemonPutJson(const DaemonEndpoint& d, const std::string& path, const nlohmann::json& body,
                                     std::chrono::milliseconds timeout) {
  return Call(d, "PUT", path, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), timeout);
}

}  // namespace moeserve::op
