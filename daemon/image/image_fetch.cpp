// Fetching an http(s) image URL on an allowed host, under http_client's
// address guard as hooks are (address_guard.hpp): the host is checked
// against image_url_allowed_hosts as libcurl parses it (the name really
// connected to), and every socket the fetch opens is checked on the address
// it connects to; no redirects, no proxy, a timeout and a byte cap.
#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "moeserve/daemon/image/image_decode.hpp"
#include "moeserve/http_client/curl_easy.hpp"
#include "moeserve/http_client/url_parts.hpp"

namespace moeserve {
namespace {

struct Sink {
  std::string body;
  size_t max_bytes = 0;
  bool too_large = false;
};

size_t Collect(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  if (sink->body.size() + size * n > sink->max_bytes) {
    sink->too_large = true;
    return 0;  // aborts the transfer
  }
  sink->body.append(data, size * n);
  return size * n;
}

}  // namespace

Result<std::string> FetchImageUrl(const std::string& url, const ImageUrlPolicy& policy, size_t index,
                                  double timeout_seconds, const char* timeout_setting) {
  const double timeout = timeout_seconds > 0 ? timeout_seconds : policy.fetch_timeout_seconds;
  const std::string setting = timeout_seconds > 0 ? timeout_setting : "image_fetch_timeout_seconds";
  const std::string who = "image " + std::to_string(index);
  const auto url_parts = http_client::ParseUrl(url);
  if (!url_parts) return Fail(Error::InvalidArgument(who + ": the URL does not parse"));
  if (url_parts->scheme != "http" && url_parts->scheme != "https")
    return Fail(Error::InvalidArgument(who + " (" + url_parts->host.substr(0, 128) + "): scheme " +
                                       url_parts->scheme.substr(0, 16) + " is not allowed"));
  const std::string& host = url_parts->host;
  const std::string listed = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  if (std::find(policy.allowed_hosts.begin(), policy.allowed_hosts.end(), listed) == policy.allowed_hosts.end())
    return Fail(Error::InvalidArgument(who + ": host '" + listed.substr(0, 128) + "' is not in image_url_allowed_hosts"));

  http_client::CurlEasy curl;
  if (!curl.ok()) return Fail(Error::Internal(who + ": curl_easy_init failed"));
  http_client::CurlPolicy curl_policy;
  curl_policy.protocols = "http,https";
  curl_policy.max_redirects = 0;
  curl_policy.proxy = http_client::Proxy::kNever;
  curl_policy.user_agent = "moeserve-images/1";
  curl_policy.timeout = std::chrono::milliseconds(std::max(1L, static_cast<long>(timeout * 1000)));
  curl_policy.guard.public_only = !policy.allow_private_addresses;
  curl.Prepare(curl_policy);
  CURL* c = curl.get();
  Sink sink;
  sink.max_bytes = policy.limits.max_bytes;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  // A declared length over the cap is refused before the body is read.
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(policy.limits.max_bytes));
  const CURLcode rc = curl.Perform();
  const std::string where = who + " (" + host.substr(0, 128) + ")";
  if (rc != CURLE_OK && !curl.RefusedAddresses().empty()) {
    std::string refused;
    for (const std::string& a : curl.RefusedAddresses()) refused += (refused.empty() ? "" : ", ") + a;
    return Fail(Error::InvalidArgument(where + ": refused to connect to " + refused +
                                       " (loopback, link-local and private addresses need "
                                       "image_url_allow_private_addresses)"));
  }
  if (sink.too_large || rc == CURLE_FILESIZE_EXCEEDED)
    return Fail(Error::InvalidArgument(where + ": the answer is over the limit of " +
                                  std::to_string(policy.limits.max_bytes) + " bytes (image_max_bytes)"));
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return Fail(Error::InvalidArgument(where + ": no whole answer within " +
                                  std::to_string(timeout) + " s (" + setting + ")"));
  if (rc != CURLE_OK) return Fail(Error::InvalidArgument(where + ": fetch failed: " + curl_easy_strerror(rc)));
  const long status = curl.ResponseCode();
  if (status != 200)
    return Fail(Error::InvalidArgument(where + ": answered HTTP " + std::to_string(status) +
                                  (status >= 300 && status < 400 ? " (redirects are not followed)" : "")));
  return std::move(sink.body);
}

}  // namespace moeserve
