#include "moeserve/operator/daemon_admin_client.hpp"

#include <curl/curl.h>

#include <memory>

namespace moeserve::op {

namespace {

constexpr size_t kMaxAnswer = 16 << 20;

struct Answer {
  std::string body;
  bool too_large = false;
};

size_t Collect(char* data, size_t size, size_t n, void* out) {
  auto* a = static_cast<Answer*>(out);
  if (a->body.size() + size * n > kMaxAnswer) {
    a->too_large = true;
    return 0;
  }
  a->body.append(data, size * n);
  return size * n;
}

// The answer's body once the status is 2xx.
Result<std::string> CallText(const DaemonEndpoint& d, const std::string& method, const std::string& path,
                             const std::string& body, std::chrono::milliseconds timeout) {
  const std::string url = d.base_url + path;
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) return Fail(Error::Internal("curl_easy_init failed"));
  CURL* c = curl.get();
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, ("Authorization: Bearer " + d.admin_key).c_str());
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Expect:");
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> header_list(headers, curl_slist_free_all);
  Answer answer;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (method != "GET") {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &answer);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_USERAGENT, "moe-operator/usage-sync");
  if (!d.ca_pem.empty()) {
    // The deployment's own certificate is the trust anchor; the pod IP is no name in it.
    curl_blob ca{const_cast<char*>(d.ca_pem.data()), d.ca_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(c, CURLOPT_CAINFO_BLOB, &ca);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  const CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  const std::string what = method + " " + url;
  if (answer.too_large) return Fail(Error::InvalidArgument(what + ": the answer is larger than 16 MiB"));
  if (rc != CURLE_OK) return Fail(Error::Unavailable(what + ": " + curl_easy_strerror(rc)));
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
  return std::move(answer.body);
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
